"""A version-1 containerd configuration (no `version` key, plugin `cri`) with the deprecated
`[plugins.cri.containerd.default_runtime]` table, as clusters set up for containerd 1.2-1.4 still
carry it, on the real containerd of each lab OS: 1.6.20 (Debian 12), 1.7.24 (Debian 13) and 2.1.x
(forky), with the toolkit packages of tests/fixtures/lab_fixtures.py (NVIDIA's runtime built from
its Go module, libnvidia-container a stand-in).

containerd 1.6/1.7 load such a table as the runtime "default" and make it the default runtime
(pkg/cri/config/config.go@v1.6.20, ValidatePluginConfig); `containerd config dump` still prints it
as `default_runtime`. install's loaded-configuration check failed there ("runtime 'default' is
loaded but no longer in the files"). containerd 2.x has no such field and ignores the table with a
warning. Per node: install succeeds, the nvidia runtime is in `containerd config dump`, the user's
settings are kept, a second run changes nothing, and uninstall gives the original file back.
"""

from __future__ import annotations

import json
import os
import tomllib

import pytest

from tests.conftest import ROOT, lab_nodes, run_cli
from tests.fixtures import lab_fixtures
from tests.lab.test_lab import ssh
from tests.unit.test_driver_filters import load

pytestmark = pytest.mark.lab

LAB = f"{os.environ.get('GPUSTACK_TEST_LAB_PREFIX', '')}v1s{os.getpid()}"
NODES = {f"{LAB}-node1": "1.6", f"{LAB}-node2": "1.7", f"{LAB}-node3": "2.1"}
LEGACY_AWARE = [node for node, release in NODES.items() if release < "2"]
BIN = "/usr/bin/nvidia-container-runtime"
CONFIG = "/etc/containerd/config.toml"
DROPIN = "/etc/containerd/conf.d/99-nvidia.toml"
cr = load("plugins/filter/container_runtime.py", "cr_lab_v1")

# An old cluster's configuration: version 1, the legacy default runtime with the user's cgroup
# setting, the user's pause image and registry mirror.
V1_LEGACY = """# containerd configuration of an older cluster (version 1: no `version` key)
[plugins.cri]
  sandbox_image = "registry.k8s.io/pause:3.6"
  [plugins.cri.containerd]
    [plugins.cri.containerd.default_runtime]
      runtime_type = "io.containerd.runc.v2"
      [plugins.cri.containerd.default_runtime.options]
        SystemdCgroup = true
  [plugins.cri.registry.mirrors."docker.io"]
    endpoint = ["https://mirror.example.com", "https://registry-1.docker.io"]
"""
ONLY_RUNTIME = ("--skip-tags", "nvidia_driver")
# The CRI plugin's loaded configuration, asked over containerd's socket with gpustack's own
# client (module_utils/gpustack_containerd.py, copied to the node): what `crictl info` prints.
CRI_CLIENT = "/root/gpustack_containerd_client.py"
ASK_CRI = (
    'python3 -c \'import sys, json; sys.path.insert(0, "/root"); '
    "import gpustack_containerd_client as c; "
    'print(json.dumps(c.cri_config("/run/containerd/containerd.sock")))\''
)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("v1s") / "v1s.ini"
    with lab_nodes(LAB, 3, inventory, "debian12,debian13,forky"):
        containers = [f"gpustack-{node}" for node in NODES]
        varsfile = lab_fixtures.prepare(containers, inventory.with_suffix(".vars.json"))
        client = (ROOT / "plugins/module_utils/gpustack_containerd.py").read_text()
        # outside Ansible's collection loader: the one import it needs, from its sibling file
        client = client.replace(
            "from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_host "
            "import effective_dump",
            "effective_dump = None",
        )
        for node in NODES:
            proc = ssh(inventory, node, f"cat > {CRI_CLIENT} <<'EOF'\n{client}EOF\n")
            assert proc.returncode == 0, proc.stderr
        proc = run_cli("install", str(inventory), "--tags", "nvidia_container_toolkit",
                       "-e", f"@{varsfile}")  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield inventory, varsfile


def start_from_v1(inventory, node):
    """The old cluster's file in place (nothing of gpustack's), containerd restarted on it."""
    proc = ssh(inventory, node, "rm -rf /etc/containerd/conf.d /var/lib/gpustack/container_runtime.json "
                                "/var/lib/gpustack/containerd-config.toml.orig; "
                                f"cat > {CONFIG} <<'EOF'\n{V1_LEGACY}EOF\n"
                                "systemctl restart containerd && ctr version >/dev/null")  # fmt: skip
    assert proc.returncode == 0, proc.stderr


def dump(inventory, node):
    proc = ssh(inventory, node, f"containerd --config {CONFIG} config dump")
    assert proc.returncode == 0, proc.stderr
    data = tomllib.loads(proc.stdout)
    data["imports"] = sorted(data.get("imports", []))  # containerd prints them in map order
    return data


def cri_config(inventory, node):
    proc = ssh(inventory, node, ASK_CRI)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def config_text(inventory, node):
    return ssh(inventory, node, f"cat {CONFIG}").stdout


def install(inventory, varsfile, *args):
    proc = run_cli("install", str(inventory), *ONLY_RUNTIME, "-e", f"@{varsfile}", *args,
                   "--output", "json")  # fmt: skip
    return proc.returncode, json.loads(proc.stdout)


def journal_since_restart(inventory, node):
    """containerd's log of its current start (what it said while loading its files)."""
    return ssh(inventory, node, "journalctl --no-pager -o cat _SYSTEMD_INVOCATION_ID="
                                "$(systemctl show -p InvocationID --value containerd)").stdout  # fmt: skip


def runtimes_prefix(flat):
    key = next(k for k in flat if ".containerd.runtimes." in k)
    return key.split(".containerd.runtimes.")[0] + ".containerd."


def test_a_version_1_file_with_the_legacy_default_runtime_is_wired_kept_and_given_back(lab):
    inventory, varsfile = lab
    before, loaded_before = {}, {}
    for node in NODES:
        start_from_v1(inventory, node)
        before[node] = dump(inventory, node)
        loaded_before[node] = cri_config(inventory, node)["containerd"]
    # What each containerd does with the legacy table, as the daemon itself says.
    for node in NODES:
        journal = journal_since_restart(inventory, node)
        if node in LEGACY_AWARE:
            assert "`default_runtime` is deprecated" in journal, journal[-2000:]
            assert loaded_before[node]["defaultRuntimeName"] == "default"
            assert loaded_before[node]["runtimes"]["default"]["options"]["SystemdCgroup"] is True
        else:  # 2.x: no such field; the table is ignored, runc stays the default
            assert "Ignoring unknown key" in journal, journal[-2000:]
            assert "default_runtime" in journal, journal[-2000:]
            assert loaded_before[node]["defaultRuntimeName"] == "runc"
            assert "default" not in loaded_before[node]["runtimes"]

    # doctor warns where containerd ignores the file's CRI settings (2.0-2.2), and only there
    proc = run_cli("doctor", str(inventory), "--output", "json")
    warned = {p["host"] for p in json.loads(proc.stdout)["problems"]
              if "ignores the CRI settings of a version-1 config.toml" in p["message"]}  # fmt: skip
    assert warned == {node for node in NODES if node not in LEGACY_AWARE}, proc.stdout[-3000:]

    rc, doc = install(inventory, varsfile)
    assert rc == 0, json.dumps({h: v["failures"] for h, v in doc["hosts"].items()})
    for node, release in NODES.items():
        facts = doc["hosts"][node]["facts"]["gpustack_runtime"]
        assert facts["wired"] is True and facts["container_check"] == "passed", facts
        assert facts["restart_needed"] is False, facts
        b, a = cr.flatten(before[node]), cr.flatten(dump(inventory, node))
        prefix = runtimes_prefix(a)
        changed = {k: (v, a.get(k, "<missing>")) for k, v in b.items()
                   if a.get(k, "<missing>") != v and k != "imports"
                   and not k.startswith(prefix + "runtimes.nvidia.")}  # fmt: skip
        assert changed == {}, f"containerd {release} lost settings: {changed}"
        assert a[prefix + "runtimes.nvidia.options.BinaryName"] == BIN
        loaded = cri_config(inventory, node)
        assert loaded["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"] == BIN
        dropin = tomllib.loads(ssh(inventory, node, f"cat {DROPIN}").stdout)
        text = json.dumps(a)
        if node in LEGACY_AWARE:
            # the user's settings in force; the legacy default too, and nvidia pods get its
            # cgroup setting
            assert "registry.k8s.io/pause:3.6" in text and "https://mirror.example.com" in text
            assert a[prefix + "default_runtime.options.SystemdCgroup"] is True
            assert loaded["containerd"]["defaultRuntimeName"] == "default"
            assert a[prefix + "runtimes.nvidia.options.SystemdCgroup"] is True
            assert "version" not in dropin and list(dropin["plugins"]) == ["cri"]
        else:
            # containerd 2.1 ignores the version-1 file's CRI table, before gpustack as after
            # (the file keeps it); gpustack's drop-in is version 3, which it reads
            assert "registry.k8s.io/pause:3.6" not in text and "mirror.example.com" not in text
            assert dropin["version"] == 3
            assert list(dropin["plugins"]) == ["io.containerd.cri.v1.runtime"]
        assert "gpustack-verify" in ssh(inventory, node, f"cat {lab_fixtures.RUNTIME_LOG}").stdout

    rc, again = install(inventory, varsfile)
    assert rc == 0, json.dumps({h: v["failures"] for h, v in again["hosts"].items()})
    assert {h: v["changed"] for h, v in again["hosts"].items()} == dict.fromkeys(NODES, 0)

    proc = run_cli("uninstall", str(inventory), "--components", "runtime", "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for node in NODES:
        assert config_text(inventory, node) == V1_LEGACY
        assert dump(inventory, node) == before[node], f"uninstall did not restore {node}"
        assert ssh(inventory, node, f"test -e {DROPIN}").returncode == 1


def test_nvidia_as_the_default_runtime_over_a_legacy_default_runtime(lab):
    """container_runtime_nvidia_default on containerd 1.6/1.7: the legacy table would win over
    default_runtime_name, so the drop-in carries it as the runtime "default" instead; the running
    daemon then has nvidia as its default runtime and still a "default" handler."""
    inventory, varsfile = lab
    nodes = ",".join(LEGACY_AWARE)
    before = {}
    for node in LEGACY_AWARE:
        start_from_v1(inventory, node)
        before[node] = dump(inventory, node)
    args = ("--limit", nodes, "-e", "container_runtime_nvidia_default=true")
    rc, doc = install(inventory, varsfile, *args)
    assert rc == 0, json.dumps({h: v["failures"] for h, v in doc["hosts"].items()})
    for node in LEGACY_AWARE:
        loaded = cri_config(inventory, node)["containerd"]
        assert loaded["defaultRuntimeName"] == "nvidia", loaded["defaultRuntimeName"]
        assert loaded["runtimes"]["default"]["options"]["SystemdCgroup"] is True
        assert loaded["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True
        assert "`default_runtime` is deprecated" not in journal_since_restart(inventory, node)
        kept = tomllib.loads(config_text(inventory, node))  # only the import added
        assert kept == {**tomllib.loads(V1_LEGACY), "imports": ["/etc/containerd/conf.d/*.toml"]}
    rc, again = install(inventory, varsfile, *args)
    assert rc == 0, json.dumps({h: v["failures"] for h, v in again["hosts"].items()})
    assert {h: v["changed"] for h, v in again["hosts"].items()} == dict.fromkeys(LEGACY_AWARE, 0)
    proc = run_cli(
        "uninstall", str(inventory), "--components", "runtime", "--limit", nodes, "--yes"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for node in LEGACY_AWARE:
        assert config_text(inventory, node) == V1_LEGACY
        assert dump(inventory, node) == before[node]
        assert cri_config(inventory, node)["containerd"]["defaultRuntimeName"] == "default"
