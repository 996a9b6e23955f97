"""CDI in containerd for NVIDIA's DRA driver (gpustack_k8s_gpu_allocation=dra), on real containerd:
1.7.24 (Debian 13), where enable_cdi is off by default, and 1.6.20 (Debian 12), which has no CDI.
The toolkit packages are tests/fixtures/lab_fixtures.py's (NVIDIA's runtime built from its Go
module, libnvidia-container a stand-in); no GPU, no DRA driver, no kubelet: what is checked is
containerd's configuration and what the running daemon loaded.

On 1.7: install with DRA writes enable_cdi = true into gpustack's drop-in over a user's explicit
`enable_cdi = false` (the user's file keeps its line), containerd restarts and reports CDI on in
`containerd config dump` and over CRI (what `crictl info` prints), a second run changes nothing
and restarts nothing, and install back in device-plugin mode leaves CDI to the user's file again (its `false`), which
`status` asked with DRA names as drift.
On 1.6: install with DRA is refused before any change (files, containerd's process), and doctor
names the refusal.
"""

from __future__ import annotations

import json
import os
import tomllib

import pytest

from tests.conftest import ROOT, lab_nodes, run_cli
from tests.fixtures import lab_fixtures
from tests.lab.test_lab import ssh

pytestmark = pytest.mark.lab

LAB = f"{os.environ.get('GPUSTACK_TEST_LAB_PREFIX', '')}cdi{os.getpid()}"
OLD, NEW = f"{LAB}-node1", f"{LAB}-node2"  # Debian 12 (containerd 1.6), Debian 13 (1.7)
CONFIG = "/etc/containerd/config.toml"
DROPIN = "/etc/containerd/conf.d/99-nvidia.toml"
CRI = "io.containerd.grpc.v1.cri"
# A user's version-2 file that turns CDI off on purpose (on 1.7; 1.6 gets it without that line).
USER_CONFIG = f"""version = 2
# the user's own
[plugins."{CRI}"]
  enable_cdi = false
  sandbox_image = "registry.k8s.io/pause:3.9"
"""
DRA = ("-e", "gpustack_k8s_gpu_allocation=dra")
CRI_CLIENT = "/root/gpustack_containerd_client.py"
ASK_CRI = (
    'python3 -c \'import sys, json; sys.path.insert(0, "/root"); '
    "import gpustack_containerd_client as c; "
    'print(json.dumps(c.cri_config("/run/containerd/containerd.sock")))\''
)
# What must stay as it was on a refused host: the files gpustack would write, and containerd's
# process (a restart gives it a new invocation).
KEPT = (f"md5sum {CONFIG}; ls -la /etc/containerd /var/lib/gpustack 2>&1; "
        "systemctl show -p InvocationID --value containerd")  # fmt: skip


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("cdi") / "cdi.ini"
    with lab_nodes(LAB, 2, inventory, "debian12,debian13"):
        varsfile = lab_fixtures.prepare([f"gpustack-{n}" for n in (OLD, NEW)],
                                        inventory.with_suffix(".vars.json"))  # fmt: skip
        client = (ROOT / "plugins/module_utils/gpustack_containerd.py").read_text()
        client = client.replace(  # outside Ansible's collection loader
            "from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_host "
            "import effective_dump",
            "effective_dump = None",
        )
        proc = ssh(inventory, NEW, f"cat > {CRI_CLIENT} <<'EOF'\n{client}EOF\n")
        assert proc.returncode == 0, proc.stderr
        for node in (OLD, NEW):
            text = USER_CONFIG if node == NEW else USER_CONFIG.replace("  enable_cdi = false\n", "")
            proc = ssh(inventory, node, f"mkdir -p /etc/containerd && cat > {CONFIG} <<'EOF'\n"
                                        f"{text}EOF\nsystemctl restart containerd")  # fmt: skip
            assert proc.returncode == 0, proc.stderr
        proc = run_cli("install", str(inventory), "--tags", "nvidia_container_toolkit",
                       "-e", f"@{varsfile}")  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield inventory, varsfile


def install(inventory, varsfile, node, *args):
    proc = run_cli("install", str(inventory), "--skip-tags", "nvidia_driver", "--limit", node,
                   "-e", f"@{varsfile}", *args, "--output", "json")  # fmt: skip
    return proc.returncode, json.loads(proc.stdout)


def sh(inventory, node, command):
    proc = ssh(inventory, node, command)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def effective_cri(inventory, node):
    return tomllib.loads(sh(inventory, node, f"containerd --config {CONFIG} config dump"))[
        "plugins"
    ][CRI]


def invocation(inventory, node):
    return sh(inventory, node, "systemctl show -p InvocationID --value containerd").strip()


def test_dra_turns_cdi_on_in_containerd_1_7_over_the_users_off(lab):
    inventory, varsfile = lab
    assert effective_cri(inventory, NEW)["enable_cdi"] is False
    before = invocation(inventory, NEW)

    rc, doc = install(inventory, varsfile, NEW, *DRA)
    assert rc == 0, json.dumps(doc["hosts"][NEW]["failures"])
    dropin = tomllib.loads(sh(inventory, NEW, f"cat {DROPIN}"))["plugins"][CRI]
    assert dropin["enable_cdi"] is True
    assert dropin["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    effective = effective_cri(inventory, NEW)
    assert effective["enable_cdi"] is True
    assert effective["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    assert effective["sandbox_image"] == "registry.k8s.io/pause:3.9"  # the user's, still in force
    assert "enable_cdi = false" in sh(inventory, NEW, f"cat {CONFIG}")  # the user's line kept
    restarted = invocation(inventory, NEW)
    assert restarted != before  # containerd restarted to load it
    loaded = json.loads(sh(inventory, NEW, ASK_CRI))  # what the running daemon loaded (CRI)
    assert loaded["enableCDI"] is True and loaded["cdiSpecDirs"] == ["/etc/cdi", "/var/run/cdi"]
    assert doc["hosts"][NEW]["facts"]["gpustack_runtime"]["wired"] is True

    rc, again = install(inventory, varsfile, NEW, *DRA)
    assert rc == 0, json.dumps(again["hosts"][NEW]["failures"])
    assert again["hosts"][NEW]["changed"] == 0
    assert invocation(inventory, NEW) == restarted  # no restart

    # Back to the device plugin: gpustack's drop-in no longer sets it, the user's off is in force.
    rc, back = install(inventory, varsfile, NEW)
    assert rc == 0, json.dumps(back["hosts"][NEW]["failures"])
    dropin = tomllib.loads(sh(inventory, NEW, f"cat {DROPIN}"))["plugins"][CRI]
    assert dropin["enable_cdi"] is False  # the user's, carried with the file's CRI table (1.7)
    assert "cdi_spec_dirs" not in dropin
    assert effective_cri(inventory, NEW)["enable_cdi"] is False
    assert json.loads(sh(inventory, NEW, ASK_CRI))["enableCDI"] is False
    # status, asked with DRA, names CDI off as drift (what install would turn on again)
    proc = run_cli("status", str(inventory), "--limit", NEW, "-e", f"@{varsfile}", *DRA,
                   "--output", "json")  # fmt: skip
    drift = "containerd: CDI off (enable_cdi = false), which gpustack_k8s_gpu_allocation=dra needs"
    assert drift in proc.stdout, proc.stdout[-3000:]


def test_dra_on_containerd_1_6_is_refused_before_any_change(lab):
    inventory, varsfile = lab
    assert "enable_cdi" not in effective_cri(inventory, OLD)  # 1.6 has no such setting
    kept = sh(inventory, OLD, KEPT)
    rc, doc = install(inventory, varsfile, OLD, *DRA)
    assert rc != 0
    host = doc["hosts"][OLD]
    message = host["failures"][-1]["message"]
    assert "containerd 1.6.20" in message and f"on {OLD} has no CDI support" in message, message
    assert "Nothing was changed on this host. Hint: upgrade containerd to 1.7 or newer; or use " \
           "gpustack_k8s_gpu_allocation=device-plugin" in message  # fmt: skip
    assert host["changed"] == 0
    assert sh(inventory, OLD, KEPT) == kept
    # doctor names the same refusal beforehand
    proc = run_cli("doctor", str(inventory), "--limit", OLD, *DRA, "--output", "json")
    errors = [p["message"] for p in json.loads(proc.stdout)["problems"] if p["severity"] == "error"]
    assert any("has no CDI support, which gpustack_k8s_gpu_allocation=dra needs" in m
               for m in errors), errors  # fmt: skip
