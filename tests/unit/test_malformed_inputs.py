"""Malformed input across every command: binary, empty, undecodable, huge, nested without end
and alias-bomb files; values out of range; damaged lab and upgrade state files; options that do
not apply; connection plugins gpustack cannot use; vault data without its password.

Each case runs the real `gpustack` entry point and must end with exactly one `Error:` line and
one `Hint:` line on stderr, a non-zero exit, no traceback, and no playbook run started (every
host of these inventories is 127.0.0.1 port 9, where nothing listens: a run that started would
leave a run directory, which is what `runs_started` looks for).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import run_cli, runs_started

ROOT = Path(__file__).resolve().parents[2]
HOST = "n1 ansible_host=127.0.0.1 ansible_port=9"
INV = f"[gpu_nodes]\n{HOST}\n"
VAULT_PASSWORD = "corpus-vault-pw"  # the vault password of the encrypted fixtures below


def _alias_bomb(levels: int = 12, width: int = 10) -> str:
    """A "billion laughs" YAML mapping: each level repeats the previous one `width` times."""
    lines = [f"a0: &a0 [{', '.join(['x'] * width)}]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


def _inventory_bomb() -> str:
    bomb = "\n".join("    " + line for line in _alias_bomb().splitlines())
    return (
        f"all:\n  vars:\n{bomb}\n  hosts:\n    n1: {{ansible_host: 127.0.0.1, ansible_port: 9}}\n"
    )


FILES: dict[str, bytes | str] = {
    "inv.ini": INV,
    "binary.ini": bytes(range(256)) * 16,
    "random.bin": os.urandom(4096),
    "undecodable.ini": b"[gpu_nodes]\nn1 ansible_host=\xff\xfe ansible_port=9\n",
    "empty.yml": "",
    "blank.ini": "\n\n   \n",
    "comments.ini": "# nothing here\n; nor here\n",
    "huge_binary.ini": b"\x00\x01\x02\xff" * (2 * 1024 * 1024),  # 8 MiB, not text
    "deep.yml": "all:\n  hosts:\n    n1:\n      x: " + "[" * 5000 + "\n",
    "bomb_inventory.yml": _inventory_bomb(),
    "scalar.yml": "just a string\n",
    "hosts_list.yml": "all:\n  hosts: [n1, n2]\n",
    "port_high.ini": "[gpu_nodes]\nn1 ansible_host=127.0.0.1 ansible_port=70000\n",
    "port_zero.ini": "[gpu_nodes]\nn1 ansible_host=127.0.0.1 ansible_port=0\n",
    "winrm.ini": "[gpu_nodes]\nn1 ansible_host=127.0.0.1 ansible_connection=winrm\n",
    "psrp.yml": "all:\n  hosts:\n    n1: {ansible_host: 127.0.0.1, ansible_connection: psrp}\n",
    "network_cli.ini": "[gpu_nodes]\nn1 ansible_host=127.0.0.1 "
    "ansible_connection=ansible.netcommon.network_cli\n",
    "no_such_conn.ini": "[gpu_nodes]\nn1 ansible_host=127.0.0.1 ansible_connection=teleport\n",
    "role_typo.ini": f"[gpu_nodes]\n{HOST} nvidia_driver_verison=535.261.03-1\n",
    "deepops.ini": f"[gpu_nodes]\n{HOST}\n[all:vars]\nnvidia_driver_skip_reboot=true\n",
    "bad_choice.yml": "all:\n  hosts:\n    n1: {ansible_host: 127.0.0.1, ansible_port: 9, "
    "nvidia_driver_reboot: sometimes}\n",
    "bad_int.ini": f"[gpu_nodes]\n{HOST} nvidia_driver_reboot_timeout=soon\n",
    "big_int.ini": f"[gpu_nodes]\n{HOST} nvidia_driver_reboot_timeout=99999999999999999999\n",
    "bad_bool.ini": f"[gpu_nodes]\n{HOST} nvidia_driver_persistenced=maybe\n",
    "broken_jinja.yml": "all:\n  hosts:\n    n1: {ansible_host: 127.0.0.1, ansible_port: 9, "
    'nvidia_driver_source: "{{ foo"}\n',
    "vars_bomb.yml": _alias_bomb(),
    "vars_deep.yml": "a: " + "[" * 5000 + "\n",
    "vars_binary.yml": bytes(range(128, 256)) * 8,
    "vars_list.yml": "- a\n- b\n",
    "vars_scalar.yml": "42\n",
    "vars_badkey.yml": "'not a name': 1\n",
    "vars_unicode_key.yml": "ñame: 1\n",
    "vars_types.yml": "nvidia_driver_packages: {not: a list}\ncontainer_runtime_nvidia_default: "
    "[1]\n",
    "kube_binary": os.urandom(2048),
    "kube_empty": "",
    "kube_deep": "a: " + "[" * 5000 + "\n",
    "retry_empty": "\n\n",
    "retry_binary": b"\xff\xfe\x00\x01",
    "retry_unknown": "nosuchhost\n",
    "vault_password": VAULT_PASSWORD + "\n",
    "vault_password_empty": "\n",
    "wrong_password": "not-the-password\n",
}
# name -> text encrypted with VAULT_PASSWORD by ansible-vault (written by the fixture)
ENCRYPTED = {
    "vars_encrypted.yml": "nvidia_driver_branch: '580'\n",
}
# name -> YAML with an inline !vault value of VAULT_PASSWORD (written by the fixture)
INLINE_VAULT = "inline_vault.yml"

T = "{tmp}"
I = f"{T}/inv.ini"  # noqa: E741 - the one inventory most cases share

# (id, argv, text the Error line holds, exit code, extra environment)
CASES: list[tuple[str, list[str], str, int, dict[str, str]]] = [
    # inventories, every host command
    ("install-binary", ["install", f"{T}/binary.ini"], "is not UTF-8 text", 2, {}),
    ("plan-random", ["plan", f"{T}/random.bin"], "inventory", 2, {}),
    ("doctor-undecodable", ["doctor", f"{T}/undecodable.ini"], "is not UTF-8 text", 2, {}),
    ("status-empty", ["status", f"{T}/empty.yml"], "has no hosts", 2, {}),
    ("verify-blank", ["verify", f"{T}/blank.ini", "--kubeconfig", f"{T}/kube_empty"], "", 2, {}),
    ("smoke-comments", ["smoke", f"{T}/comments.ini"], "has no hosts", 2, {}),
    ("uninstall-huge", ["uninstall", f"{T}/huge_binary.ini", "--yes"], "is not UTF-8", 2, {}),
    ("upgrade-deep", ["upgrade", f"{T}/deep.yml", "--driver-version", "535.1-1"], "nesting depth", 2, {}),
    ("mig-bomb", ["mig", f"{T}/bomb_inventory.yml"], "YAML aliases expand", 2, {}),
    ("manifests-binary", ["manifests", f"{T}/binary.ini", "-d", f"{T}/out"], "UTF-8", 2, {}),
    ("install-bomb", ["install", f"{T}/bomb_inventory.yml"], "YAML aliases expand", 2, {}),
    ("plan-scalar", ["plan", f"{T}/scalar.yml"], "cannot parse inventory", 2, {}),
    ("doctor-hosts-list", ["doctor", f"{T}/hosts_list.yml"], "cannot parse inventory", 2, {}),
    ("status-device", ["status", "/dev/zero"], "not a regular file or directory", 2, {}),
    ("install-fifo-dir", ["install", f"{T}/nodir/none.ini"], "does not exist", 2, {}),
    ("doctor-port-high", ["doctor", f"{T}/port_high.ini"], "is not a port number", 2, {}),
    ("status-port-zero", ["status", f"{T}/port_zero.ini"], "is not a port number", 2, {}),
    # connection plugins gpustack's roles cannot use
    ("install-winrm", ["install", f"{T}/winrm.ini"], "ansible_connection=winrm", 2, {}),
    ("doctor-psrp", ["doctor", f"{T}/psrp.yml"], "ansible_connection=psrp", 2, {}),
    ("plan-network-cli", ["plan", f"{T}/network_cli.ini"], "network_cli", 2, {}),
    ("status-no-such-plugin", ["status", f"{T}/no_such_conn.ini"], "no such connection", 2, {}),
    ("install-e-connection", ["install", I, "-e", "ansible_connection=winrm"], "winrm", 2, {}),
    # role variables in the inventory
    ("install-role-typo", ["install", f"{T}/role_typo.ini"], "nvidia_driver_verison", 2, {}),
    ("plan-deepops-name", ["plan", f"{T}/deepops.ini"], "nvidia_driver_skip_reboot", 2, {}),
    ("install-bad-choice", ["install", f"{T}/bad_choice.yml"], "must be one of", 2, {}),
    ("doctor-bad-int", ["doctor", f"{T}/bad_int.ini"], "cannot be converted to an int", 2, {}),
    ("install-int-range", ["install", f"{T}/big_int.ini"], "out of range", 2, {}),
    ("status-bad-bool", ["status", f"{T}/bad_bool.ini"], "is not a valid boolean", 2, {}),
    (
        "install-broken-jinja",
        ["install", f"{T}/broken_jinja.yml"],
        "Syntax error in template",
        2,
        {},
    ),
    # -e, as ansible-playbook reads it
    ("e-bomb-file", ["install", I, "-e", f"@{T}/vars_bomb.yml"], "YAML aliases expand", 2, {}),
    (
        "e-bomb-inline",
        ["plan", I, "-e", "{" + ", ".join(_alias_bomb().splitlines()) + "}"],
        "more than 10000 items",
        2,
        {},
    ),
    ("e-deep-file", ["doctor", I, "-e", f"@{T}/vars_deep.yml"], "nesting depth", 2, {}),
    ("e-deep-inline", ["status", I, "-e", "{a: " + "[" * 5000 + "}"], "nesting depth", 2, {}),
    ("e-binary-file", ["install", I, "-e", f"@{T}/vars_binary.yml"], "UTF-8", 2, {}),
    ("e-empty-name-file", ["install", I, "-e", "@"], "", 2, {}),
    ("e-device", ["install", I, "-e", "@/dev/zero"], "not a readable file", 2, {}),
    ("e-directory", ["smoke", I, "-e", f"@{T}"], "not a readable file", 2, {}),
    ("e-list-file", ["install", I, "-e", f"@{T}/vars_list.yml"], "not a mapping", 2, {}),
    (
        "e-scalar-file",
        ["upgrade", I, "-e", f"@{T}/vars_scalar.yml", "--driver-version", "535.1-1"],
        "not a mapping",
        2,
        {},
    ),
    ("e-bad-key-file", ["install", I, "-e", f"@{T}/vars_badkey.yml"], "valid variable name", 2, {}),
    (
        "e-unicode-key",
        ["plan", I, "-e", f"@{T}/vars_unicode_key.yml"],
        "valid variable name",
        2,
        {},
    ),
    ("e-list-inline", ["install", I, "-e", "[1, 2]"], "not a mapping", 2, {}),
    ("e-loose-word", ["install", I, "-e", "nvidia_driver_branch=580 reboot"], "'reboot'", 2, {}),
    ("e-path-without-at", ["install", I, "-e", f"{T}/vars_list.yml"], "looks like a file name", 2, {}),
    ("e-types", ["install", I, "-e", f"@{T}/vars_types.yml"], "nvidia_driver_packages", 2, {}),
    (
        "e-negative-timeout",
        ["install", I, "-e", "dpkg_ready_lock_timeout=-1"],
        "out of range",
        2,
        {},
    ),
    ("e-huge-timeout", ["mig", I, "-e", "nvidia_mig_reboot_timeout=1" + "0" * 30], "range", 2, {}),
    ("e-role-typo", ["install", I, "-e", "nvidia_driver_rebot=if_needed"], "no role takes this variable", 2, {}),
    ("e-toolkit-typo", ["plan", I, "-e", "nvidia_container_toolkit_verison=1"], "toolkit", 2, {}),
    ("e-bool", ["install", I, "-e", "container_runtime_nvidia_default=sure"], "boolean", 2, {}),
    ("e-broken-template", ["install", I, "-e", "nvidia_driver_source={{ foo"], "unbalanced jinja2", 2, {}),
    (
        "e-k8s-typo",
        ["manifests", I, "-d", f"{T}/out", "-e", "gpustack_k8s_namspace=x"],
        "gpustack_k8s_namspace",
        2,
        {},
    ),
    # --limit
    ("limit-empty-file", ["install", I, "--limit", f"@{T}/retry_empty"], "names no host", 2, {}),
    ("limit-binary-file", ["doctor", I, "--limit", f"@{T}/retry_binary"], "not a text file", 2, {}),
    ("limit-missing-file", ["plan", I, "-l", f"@{T}/nosuch.retry"], "No such file", 2, {}),
    ("limit-unknown-host", ["status", I, "-l", f"@{T}/retry_unknown"], "matches no host", 2, {}),
    ("limit-device", ["install", I, "--limit", "@/dev/zero"], "not a regular file", 2, {}),
    # kubeconfig files
    ("kube-binary", ["status", I, "--kubeconfig", f"{T}/kube_binary"], "is not usable", 2, {}),
    ("kube-deep", ["install", I, "--kubeconfig", f"{T}/kube_deep"], "is not usable", 2, {}),
    # values out of range
    ("forks-zero", ["install", I, "--forks", "0"], "--forks", 2, {}),
    ("forks-huge", ["doctor", I, "-f", "9" * 30], "--forks", 2, {}),
    (
        "upgrade-inf",
        ["upgrade", I, "--driver-version", "535.1-1", "--pod-deletion-timeout", "inf"],
        "--pod-deletion-timeout",
        2,
        {},
    ),
    (
        "upgrade-nan",
        ["upgrade", I, "--driver-version", "535.1-1", "--canary-pause", "nan"],
        "--canary-pause",
        2,
        {},
    ),
    (
        "upgrade-parallel",
        ["upgrade", I, "--driver-version", "535.1-1", "--max-parallel", "9" * 25],
        "--max-parallel",
        2,
        {},
    ),
    (
        "upgrade-unavailable",
        ["upgrade", I, "--driver-version", "535.1-1", "--max-unavailable", "-5"],
        "--max-unavailable",
        2,
        {},
    ),
    (
        "upgrade-percent",
        ["upgrade", I, "--driver-version", "535.1-1", "--max-unavailable", "250%"],
        "over 100%",
        2,
        {},
    ),
    (
        "upgrade-version",
        ["upgrade", I, "--driver-version", "latest"],
        "not a package version",
        2,
        {},
    ),
    ("mig-timeout", ["mig", I, "--validation-timeout", "1e999"], "--validation-timeout", 2, {}),
    ("lab-nodes", ["lab", "up", "--nodes", "1000"], "--nodes", 2, {}),
    # options that do not apply to the command
    ("status-check", ["status", I, "--check"], "No such option", 2, {}),
    (
        "doctor-kubeconfig",
        ["doctor", I, "--kubeconfig", f"{T}/kube_empty"],
        "No such option",
        2,
        {},
    ),
    ("plan-yes", ["plan", I, "--yes"], "No such option", 2, {}),
    ("upgrade-local", ["upgrade", I, "--local"], "No such option", 2, {}),
    (
        "manifests-forks",
        ["manifests", I, "-d", f"{T}/out", "--forks", "2"],
        "No such option",
        2,
        {},
    ),
    (
        "upgrade-forks",
        ["upgrade", I, "--driver-version", "535.1-1", "--forks", "2"],
        "does not apply to upgrade",
        2,
        {},
    ),
    (
        "upgrade-drain-host-only",
        ["upgrade", I, "--driver-version", "535.1-1", "--drain"],
        "only apply with a cluster",
        2,
        {},
    ),
    (
        "upgrade-pod-selector-host-only",
        ["upgrade", I, "--driver-version", "535.1-1", "--drain", "--pod-selector", "app=web"],
        "--drain, --pod-selector only apply with a cluster",
        2,
        {},
    ),
    (
        "upgrade-pod-selector-without-drain",
        ["upgrade", I, "--driver-version", "535.1-1", "--pod-selector", "app=web",
         "--kubeconfig", f"{T}/kubeconfig"],
        "--pod-selector chooses which pods --drain evicts: it needs --drain",
        2,
        {},
    ),
    (
        "upgrade-retry-failed",
        ["upgrade", I, "--driver-version", "535.1-1", "--retry-failed"],
        "--retry-failed only applies with --resume",
        2,
        {},
    ),
    ("uninstall-check-k8s", ["uninstall", I, "--check", "--components", "k8s"], "not k8s", 2, {}),
    ("local-and-inventory", ["install", I, "--local"], "both an inventory", 2, {}),
    ("doctor-output-wide", ["doctor", I, "-o", "wide"], "unknown --output", 2, {}),
    ("smoke-capture-file", ["smoke", I, "--capture", I], "is not a directory", 2, {}),
    # vault
    (
        "vault-no-password",
        ["doctor", f"{T}/{INLINE_VAULT}"],
        "no vault password was given",
        2,
        {},
    ),
    (
        "vault-wrong-password",
        ["install", f"{T}/{INLINE_VAULT}", "--vault-password-file", f"{T}/wrong_password"],
        "could not be decrypted",
        2,
        {},
    ),
    (
        "vault-e-file-no-password",
        ["plan", I, "-e", f"@{T}/vars_encrypted.yml"],
        "no vault password was given",
        2,
        {},
    ),
    (
        "vault-missing-file",
        ["status", I, "--vault-password-file", f"{T}/nosuch"],
        "vault password file",
        2,
        {},
    ),
    (
        "vault-empty-password",
        ["doctor", I, "--vault-password-file", f"{T}/vault_password_empty"],
        "vault password",
        2,
        {},
    ),
    ("vault-stdin", ["install", I, "--vault-password-file", "-"], "standard input", 2, {}),
    ("vault-ask-no-tty", ["install", I, "--ask-vault-pass"], "needs a terminal", 2, {}),
    (
        "vault-id-missing",
        ["plan", I, "--vault-id", f"prod@{T}/nosuch"],
        "vault password file",
        2,
        {},
    ),
    (
        "vault-env-missing",
        ["doctor", f"{T}/{INLINE_VAULT}"],
        "vault password",
        2,
        {"ANSIBLE_VAULT_PASSWORD_FILE": "{tmp}/nosuch"},
    ),
    # damaged state files
    ("lab-list-damaged", ["lab", "list"], "is damaged", 2, {"GPUSTACK_LAB_HOME": "{tmp}/labs1"}),
    ("lab-list-list", ["lab", "list"], "is damaged", 2, {"GPUSTACK_LAB_HOME": "{tmp}/labs2"}),
    ("lab-down-path", ["lab", "down", "--name", "../.."], "is not usable", 2, {}),
    ("lab-up-path", ["lab", "up", "--name", "a/b"], "is not usable", 2, {}),
]  # fmt: skip

# Upgrade state files, damaged in place: (id, contents of the snapshot, of its journal)
UPGRADE_STATES = [
    ("state-binary", os.urandom(512), None),
    ("state-list", b"[1, 2, 3]", None),
    ("state-truncated", b'{"version": 1, "nodes": {', None),
    ("state-empty-object", b"{}", None),
    ("state-nulls", b'{"nodes": null, "target": null}', None),
    ("state-empty-file", b"", None),
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    import subprocess
    import sys

    tmp = tmp_path_factory.mktemp("malformed")
    for name, data in FILES.items():
        path = tmp / name
        path.write_bytes(data) if isinstance(data, bytes) else path.write_text(data)
    vault_bin = str(Path(sys.executable).parent / "ansible-vault")
    password = tmp / "vault_password"
    for name, text in ENCRYPTED.items():
        (tmp / name).write_text(text)
        subprocess.run(
            [vault_bin, "encrypt", "--vault-password-file", str(password), str(tmp / name)],
            check=True,
            capture_output=True,
        )
    secret = subprocess.run(
        [
            vault_bin,
            "encrypt_string",
            "--vault-password-file",
            str(password),
            "Corpus5ecret",
            "--name",
            "nvidia_driver_mirror_password",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    indented = "\n".join("      " + line for line in secret.strip().splitlines())
    (tmp / INLINE_VAULT).write_text(
        "all:\n  hosts:\n    n1:\n      ansible_host: 127.0.0.1\n      ansible_port: 9\n"
        "      nvidia_driver_mirror_username: robot\n"
        "      nvidia_driver_mirror_url: https://mirror.example/cuda/repos\n" + indented + "\n"
    )
    for folder, text in (("labs1/broken", "{not json"), ("labs2/listed", "[1, 2]")):
        (tmp / folder).mkdir(parents=True)
        (tmp / folder / "state.json").write_text(text)
    return tmp


def _check(proc, state_dir: Path, message: str, code: int) -> None:
    assert proc.returncode == code, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2, proc.stderr[-3000:]
    assert lines[0].startswith("Error: ") and len(lines[0]) > len("Error: "), proc.stderr
    assert message in lines[0], proc.stderr
    assert lines[1].startswith("Hint: ") and len(lines[1]) > len("Hint: "), proc.stderr
    assert runs_started(state_dir) == [], "bad input must not start a playbook run"


@pytest.mark.parametrize(
    ("argv", "message", "code", "env"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_malformed_input(corpus, state_dir, tmp_path, argv, message, code, env):
    args = [a.replace("{tmp}", str(corpus)) for a in argv]
    extra = {k: v.replace("{tmp}", str(corpus)) for k, v in env.items()}
    extra.setdefault("GPUSTACK_LAB_HOME", str(tmp_path / "labs"))
    proc = run_cli(*args, env={"KUBECONFIG": "", **extra}, timeout=120)
    _check(proc, state_dir, message, code)


@pytest.mark.parametrize(
    ("snapshot", "journal"), [c[1:] for c in UPGRADE_STATES], ids=[c[0] for c in UPGRADE_STATES]
)
@pytest.mark.parametrize("resume", [True, False], ids=["resume", "new"])
def test_damaged_upgrade_state(corpus, state_dir, snapshot, journal, resume):
    from gpustack.upgrade.state import state_path_for

    path = state_path_for(corpus / "inv.ini")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(snapshot)
    before = path.read_bytes()
    argv = ["upgrade", str(corpus / "inv.ini"), "--driver-version", "535.1-1", "--yes"]
    proc = run_cli(*argv, *(["--resume"] if resume else []), env={"KUBECONFIG": ""})
    _check(proc, state_dir, "upgrade state file", 2)
    assert path.read_bytes() == before, "a damaged state file is left as it was"


def test_a_damaged_journal_is_refused(corpus, state_dir):
    """A journal line in the middle that is not JSON (not a torn last line) is refused."""
    from gpustack.upgrade.state import state_path_for

    path = state_path_for(corpus / "inv.ini")
    path.parent.mkdir(parents=True, exist_ok=True)
    run = _recorded_run(corpus)
    path.write_text(json.dumps(run))
    path.with_name(path.name + ".journal").write_bytes(b"\xff\xfe not json\n{}\n")
    proc = run_cli(
        "upgrade",
        str(corpus / "inv.ini"),
        "--driver-version",
        "535.1-1",
        "--resume",
        "--yes",
        env={"KUBECONFIG": ""},
    )
    _check(proc, state_dir, "upgrade state file", 2)


def _recorded_run(corpus: Path) -> dict:
    from gpustack.upgrade.state import Target, UpgradeRun

    run = UpgradeRun(
        inventory=str(corpus / "inv.ini"), target=Target(version="535.1-1"), mode="host-only"
    )
    return {**run.to_dict(), "journal_id": "j1"}


def test_the_corpus_covers_every_command_and_is_large():
    commands = {c[1][0] for c in CASES}
    assert {
        "install",
        "plan",
        "doctor",
        "status",
        "verify",
        "smoke",
        "upgrade",
        "mig",
        "uninstall",
        "manifests",
        "lab",
    } <= commands
    assert len(CASES) + len(UPGRADE_STATES) * 2 + 1 >= 60
