"""A corpus of bad inputs: each one is a single `Error:` line, a `Hint:` line, a documented exit
code, no traceback, and no run started (so no host was contacted or changed)."""

from __future__ import annotations

import pytest

from tests.conftest import run_cli, runs_started

GOOD = "[gpu_nodes]\nn1 ansible_host=127.0.0.1\nn2 ansible_host=127.0.0.1\n"

# name -> (file contents written under tmp_path; {} for none)
FILES = {
    "inv.ini": GOOD,
    "broken.ini": "[gpu_nodes\nn1\n",
    "broken.yml": "all:\n  hosts: [a\n",
    "list.yml": "- just\n- a list\n",
    "empty.ini": "",
    "empty_group.ini": "[gpu_nodes]\n[cpu]\nc1\n",
    "badport.ini": "[gpu_nodes]\nn1 ansible_host=127.0.0.1 ansible_port=ssh\n",
    "badversion.ini": "[gpu_nodes]\nn1 nvidia_driver_version=latest\n",
    "badsource.yml": "all:\n  children:\n    gpu_nodes:\n      hosts:\n        n1:\n"
    "          nvidia_driver_source: runfile\n",
    "badbool.ini": "[gpu_nodes]\nn1\n[gpu_nodes:vars]\ngpustack_require_gpu=maybe\n",
    "badmirror.ini": "[gpu_nodes]\nn1 nvidia_container_toolkit_mirror_url=ftp://u:Inv3ntoryPW@m/x\n",
    "vars_list.yml": "- a\n- b\n",
    "vars_broken.yml": "nvidia_driver_version: [\n",
    "vars_type.yml": "nvidia_driver_version:\n  - 535\n  - 261\n",
    "vars_dict.yml": "container_runtime_nvidia_runtime_extra: not-a-mapping\n",
    "kube_broken.yaml": "apiVersion: v1\nclusters: [\n",
    "kube_list.yaml": "- not\n- a kubeconfig\n",
    "kube_nocontext.yaml": "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n",
    # nothing listens on port 9 of the loopback: connection refused at once
    "kube_dead.yaml": "apiVersion: v1\nkind: Config\ncurrent-context: dead\n"
    "clusters: [{name: dead, cluster: {server: 'http://127.0.0.1:9'}}]\n"
    "contexts: [{name: dead, context: {cluster: dead, user: u}}]\nusers: [{name: u, user: {}}]\n",
}
EMPTY_DIR = "emptydir"

# (id, argv with {tmp} for the test directory, message in the Error line, exit code)
CASES = [
    # inventories
    ("inv-missing", ["install", "{tmp}/missing.ini"], "does not exist", 2),
    ("inv-unreadable", ["status", "/proc/self/mem"], "is not readable", 2),
    ("inv-broken-ini", ["install", "{tmp}/broken.ini"], "cannot parse inventory", 2),
    ("inv-broken-yaml", ["doctor", "{tmp}/broken.yml"], "YAML parsing failed", 2),
    ("inv-yaml-list", ["plan", "{tmp}/list.yml"], "cannot parse inventory", 2),
    ("inv-empty-file", ["status", "{tmp}/empty.ini"], "has no hosts", 2),
    ("inv-empty-group", ["install", "{tmp}/empty_group.ini"], "no hosts in group gpu_nodes", 2),
    ("inv-empty-dir", ["doctor", "{tmp}/emptydir"], "cannot parse inventory", 2),
    ("limit-no-host", ["install", "{tmp}/inv.ini", "--limit", "nosuch"], "matches no host", 2),
    ("limit-unknown-group", ["status", "{tmp}/inv.ini", "-l", "cpu_nodes"], "matches no host", 2),
    ("host-bad-port", ["doctor", "{tmp}/badport.ini"], "ansible_port=ssh is not a port number", 2),
    ("host-bad-version", ["install", "{tmp}/badversion.ini"], "inventory host n1: nvidia_driver_version", 2),
    ("host-bad-source", ["plan", "{tmp}/badsource.yml"], "nvidia_driver_source=runfile: value of nvidia_driver_source must be one of", 2),
    ("host-bad-bool", ["status", "{tmp}/badbool.ini"], "gpustack_require_gpu=maybe: argument 'gpustack_require_gpu' is of type str and we were unable to convert to bool", 2),
    # extra vars
    ("ev-not-key-value", ["install", "{tmp}/inv.ini", "-e", "nvidia_driver_version"], "is not KEY=VALUE", 2),
    ("ev-bad-name", ["install", "{tmp}/inv.ini", "-e", "1x=2"], "is not a valid variable name", 2),
    ("ev-bad-yaml", ["plan", "{tmp}/inv.ini", "-e", "{nvidia_driver_version: [}"], "-e '{nvidia_driver_version: [}'", 2),
    ("ev-missing-file", ["install", "{tmp}/inv.ini", "-e", "@{tmp}/nosuch.yml"], "file not found", 2),
    ("ev-file-list", ["install", "{tmp}/inv.ini", "-e", "@{tmp}/vars_list.yml"], "not a mapping", 2),
    ("ev-file-broken", ["doctor", "{tmp}/inv.ini", "-e", "@{tmp}/vars_broken.yml"], "vars_broken.yml", 2),
    ("ev-file-type", ["install", "{tmp}/inv.ini", "-e", "@{tmp}/vars_type.yml"], "is not a package version", 2),
    ("ev-dict-type", ["install", "{tmp}/inv.ini", "-e", "@{tmp}/vars_dict.yml"], "unable to convert to dict", 2),
    ("ev-int-type", ["install", "{tmp}/inv.ini", "-e", "nvidia_driver_reboot_timeout=soon"], "cannot be converted to an int", 2),
    ("ev-version", ["install", "{tmp}/inv.ini", "-e", "nvidia_driver_version=latest"], "is not a package version", 2),
    ("ev-version-json", ["install", "{tmp}/inv.ini", "-e", '{"nvidia_driver_version": "5.x"}'], "is not a package version", 2),
    ("ev-branch", ["plan", "{tmp}/inv.ini", "-e", "nvidia_driver_branch=r580"], "is not a driver branch", 2),
    ("ev-source", ["install", "{tmp}/inv.ini", "-e", "nvidia_driver_source=runfile"], "must be one of: cuda_repo, distro, mirror, got: runfile", 2),
    ("ev-toolkit-source", ["install", "{tmp}/inv.ini", "-e", "nvidia_container_toolkit_source=github"], "must be one of: nvidia_repo, mirror, local", 2),
    ("ev-reboot", ["install", "{tmp}/inv.ini", "-e", "nvidia_driver_reboot=sometimes"], "nvidia_driver_reboot", 2),
    ("ev-mirror-no-url", ["install", "{tmp}/inv.ini", "-e", "nvidia_driver_source=mirror"], "needs nvidia_driver_mirror_url", 2),
    ("ev-mirror-bad-url", ["install", "{tmp}/inv.ini", "-e", "nvidia_driver_source=mirror", "-e", "nvidia_driver_mirror_url=ftp://m/x"], "is not an http(s):// or file:// URL", 2),
    ("ev-mirror-no-host", ["install", "{tmp}/inv.ini", "-e", "nvidia_driver_mirror_url=http:///cuda"], "has no host name", 2),
    ("ev-mirror-bad-host", ["install", "{tmp}/inv.ini", "-e", '{"nvidia_container_toolkit_mirror_url": "https://mir ror/x"}'], "contains white space", 2),
    ("ev-mirror-bad-host-chars", ["install", "{tmp}/inv.ini", "-e", "nvidia_container_toolkit_mirror_url=https://mir_ror!/x"], "invalid host name", 2),
    ("ev-mirror-bad-port", ["plan", "{tmp}/inv.ini", "-e", "nvidia_driver_mirror_url=http://m:port/cuda"], "has an invalid port", 2),
    ("ev-mirror-query", ["install", "{tmp}/inv.ini", "-e", "nvidia_container_toolkit_mirror_url=https://m/deb?x=1"], "must not have a query", 2),
    ("ev-mirror-file-host", ["install", "{tmp}/inv.ini", "-e", "nvidia_container_toolkit_mirror_url=file://srv/mirror"], "file:// URL with a host", 2),
    ("ev-mirror-file-relative", ["install", "{tmp}/inv.ini", "-e", "nvidia_driver_mirror_url=file:///"], "without an absolute path", 2),
    ("ev-key-url-scheme", ["install", "{tmp}/inv.ini", "-e", "nvidia_container_toolkit_mirror_key_url=ftp://m/key"], "is not an http(s):// or file:// URL", 2),
    ("ev-repo-url-scheme", ["install", "{tmp}/inv.ini", "-e", "nvidia_driver_cuda_repo_url=developer.download.nvidia.com/cuda"], "is not an http(s):// or file:// URL", 2),
    ("ev-toolkit-mirror-no-url", ["install", "{tmp}/inv.ini", "-e", "nvidia_container_toolkit_source=mirror"], "needs nvidia_container_toolkit_mirror_url", 2),
    ("ev-creds-no-password", ["install", "{tmp}/inv.ini", "-e", "nvidia_driver_mirror_username=bob"], "need a user name and a password", 2),
    ("ev-creds-twice", ["install", "{tmp}/inv.ini", "-e", "nvidia_container_toolkit_mirror_url=https://u:p@m/deb", "-e", "nvidia_container_toolkit_mirror_username=bob"], "carries credentials and", 2),
    ("ev-creds-file-url", ["install", "{tmp}/inv.ini", "-e", "nvidia_driver_mirror_url=file:///srv/cuda", "-e", "nvidia_driver_mirror_username=u", "-e", "nvidia_driver_mirror_password=p"], "credentials cannot be used there", 2),
    ("ev-creds-space", ["install", "{tmp}/inv.ini", "-e", "nvidia_driver_mirror_username=u", "-e", '{"nvidia_driver_mirror_password": "two words"}'], "contains white space", 2),
    ("ev-password-file-missing", ["install", "{tmp}/inv.ini", "-e", "nvidia_driver_mirror_username=u", "-e", "nvidia_driver_mirror_password_file={tmp}/nosuch"], "No such file or directory", 2),
    ("ev-password-file-empty", ["install", "{tmp}/inv.ini", "-e", "nvidia_container_toolkit_mirror_username=u", "-e", "nvidia_container_toolkit_mirror_password_file={tmp}/empty.ini"], "the first line is empty", 2),
    ("ev-password-twice", ["install", "{tmp}/inv.ini", "-e", "nvidia_driver_mirror_password=p", "-e", "nvidia_driver_mirror_password_file={tmp}/inv.ini"], "are both set", 2),
    ("host-bad-mirror-url", ["install", "{tmp}/badmirror.ini"], "inventory host n1: nvidia_container_toolkit_mirror_url", 2),
    ("ev-branch-version", ["install", "{tmp}/inv.ini", "-e", "nvidia_driver_branch=550", "-e", "nvidia_driver_version=535.261.03-1"], "is not on branch 550", 2),
    ("ev-bool", ["doctor", "{tmp}/inv.ini", "-e", "gpustack_require_gpu=maybe"], "is not a valid boolean", 2),
    ("ev-bool-role", ["install", "{tmp}/inv.ini", "-e", "nvidia_driver_open_kernel_modules=perhaps"], "auto, true, false", 2),
    # kubeconfig
    ("kube-missing", ["status", "{tmp}/inv.ini", "--kubeconfig", "{tmp}/nokube"], "kubeconfig", 2),
    ("kube-broken-yaml", ["status", "{tmp}/inv.ini", "--kubeconfig", "{tmp}/kube_broken.yaml"], "is not usable", 2),
    ("kube-not-mapping", ["install", "{tmp}/inv.ini", "--kubeconfig", "{tmp}/kube_list.yaml"], "is not usable", 2),
    ("kube-no-context", ["status", "{tmp}/inv.ini", "--kubeconfig", "{tmp}/kube_nocontext.yaml"], "is not usable", 2),
    ("kube-unreachable", ["status", "{tmp}/inv.ini", "--kubeconfig", "{tmp}/kube_dead.yaml"], "cannot reach the Kubernetes API server", 2),
    # options
    ("opt-output", ["status", "{tmp}/inv.ini", "--output", "xml"], "unknown --output 'xml'", 2),
    ("opt-report-dir", ["install", "{tmp}/inv.ini", "--report", "{tmp}"], "cannot write report", 2),
    ("opt-missing-arg", ["plan"], "Missing argument", 2),
    ("opt-unknown", ["status", "{tmp}/inv.ini", "--bogus"], "No such option", 2),
    ("opt-lab-os", ["lab", "up", "--os", "debian99"], "unknown --os 'debian99'", 2),
    ("opt-lab-nodes", ["lab", "up", "--nodes", "0"], "Invalid value for '--nodes'", 2),
    ("opt-components", ["uninstall", "{tmp}/inv.ini", "--components", "kernel"], "unknown component", 2),
    ("opt-components-empty", ["uninstall", "{tmp}/inv.ini", "--components", ","], "unknown component", 2),
    ("opt-no-confirm", ["uninstall", "{tmp}/inv.ini"], "needs confirmation", 2),
]  # fmt: skip


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    for name, text in FILES.items():
        (tmp / name).write_text(text)
    (tmp / EMPTY_DIR).mkdir()
    return tmp


@pytest.mark.parametrize(
    ("args", "message", "code"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_bad_input(corpus, state_dir, args, message, code):
    argv = [a.replace("{tmp}", str(corpus)) for a in args]
    proc = run_cli(*argv, env={"KUBECONFIG": ""})
    assert proc.returncode == code, (argv, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, proc.stderr
    assert lines[0].startswith("Error: ") and message in lines[0], proc.stderr
    assert lines[1].startswith("Hint: ") and len(lines[1]) > len("Hint: "), proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert runs_started(state_dir) == [], "a bad input must not start any run"


def test_the_corpus_is_large_enough():
    assert len(CASES) >= 30


@pytest.mark.parametrize(
    "argv",
    [
        ["install", "{tmp}/inv.ini", "-e", "nvidia_driver_mirror_url=ftp://bob:Cli5ecretPW@m/cuda"],
        ["install", "{tmp}/badmirror.ini"],
        ["install", "{tmp}/inv.ini", "-e", "nvidia_driver_mirror_password=Cli5ecretPW"],
    ],
    ids=["url-on-command-line", "url-in-inventory", "password-without-user"],
)
def test_errors_never_print_the_password(corpus, state_dir, argv):
    proc = run_cli(*[a.replace("{tmp}", str(corpus)) for a in argv])
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("Error: ")
    for secret in ("Cli5ecretPW", "Inv3ntoryPW"):
        assert secret not in proc.stdout + proc.stderr
    assert runs_started(state_dir) == []
