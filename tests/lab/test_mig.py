"""nvidia_mig on a real Debian 12 lab node (real systemd, SSH, Ansible) with the MIG TEST FIXTURE.

The node has no GPU: tests/fixtures/nvidia_smi_mig.py stands in for `nvidia-smi` on two declared
"H100 80GB" GPUs, and a sleeping unit named nvidia-dcgm.service stands in for a GPU client (the
fixture refuses a GPU reset while it runs). What passes here proves the role's logic, its
idempotence, its refusal, the boot unit and its ordering - on the fixture's model of nvidia-smi,
nothing about NVIDIA's binary (tests/fixtures/README.md). A node "reboot" is a podman restart:
/run is a tmpfs there, so the fixture's MIG instances are lost as on a real reboot.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import pytest

from gpustack.ansible import runner
from gpustack.ansible.inventory import load_inventory
from tests.conftest import lab_nodes, run_cli
from tests.fixtures import mig
from tests.lab.test_lab import ssh

pytestmark = pytest.mark.lab

LAB = f"i15mig{os.getpid()}"
NODE = f"{LAB}-node1"
CONTAINER = f"gpustack-{LAB}-node1"
GPUS = ["H100-SXM5-80GB", "H100-SXM5-80GB"]
CLIENT = "nvidia-dcgm.service"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("mig") / "mig.ini"
    with lab_nodes(LAB, 1, inventory):
        mig.install(CONTAINER, GPUS, clients=(CLIENT,))
        mig.add_client_unit(CONTAINER, CLIENT)
        yield inventory


def play(inventory, check=False, **variables):
    """playbooks/mig.yml through gpustack's own runner; -> (host result, rc)."""
    spec = runner.build_run_spec("mig.yml", load_inventory(inventory), variables, check=check)
    result = runner.run_playbook(spec)
    return result.hosts[NODE], int(result.exit_code)


def fact(host):
    return host.facts["gpustack_mig"]


def listing():
    return mig.smi(CONTAINER, "-L")


def reboot(inventory):
    assert (
        subprocess.run(
            ["podman", "restart", CONTAINER], capture_output=True, timeout=300
        ).returncode
        == 0
    )
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if ssh(inventory, NODE, "systemctl is-system-running --wait").returncode in (0, 1):
            return
        time.sleep(2)
    pytest.fail("the node did not come back after podman restart")


def test_unset_layout_is_a_strict_noop(lab):
    host, rc = play(lab)
    assert rc == 0 and host.changed == 0 and "gpustack_mig" not in host.facts
    assert (
        ssh(lab, NODE, "test -e /etc/gpustack/mig || test -e /var/lib/gpustack/mig").returncode == 1
    )
    assert mig.calls(CONTAINER) == []


def test_check_mode_changes_nothing(lab):
    host, rc = play(lab, check=True, nvidia_mig_config="all-1g.10gb")
    assert rc == 0, host.failures
    assert fact(host)["state"] == "pending" and fact(host)["reason"].startswith(
        "would change: GPU 0: enable MIG"
    )
    assert mig.mutating(mig.calls(CONTAINER)) == []
    assert ssh(lab, NODE, "test -e /etc/gpustack/mig/settings.json").returncode == 1


def test_apply_all_1g_10gb_then_rerun_changes_nothing(lab):
    host, rc = play(lab, nvidia_mig_config="all-1g.10gb")
    assert rc == 0, host.failures
    state = fact(host)
    assert (state["state"], state["applier"], state["config"]) == (
        "success",
        "nvidia-smi",
        "all-1g.10gb",
    )
    assert [g["applied"] for g in state["gpus"]] == [{"1g.10gb": 7}, {"1g.10gb": 7}]
    assert state["clients_stopped"] == [CLIENT]  # the fixture refuses the resets while it runs
    assert listing().count("MIG 1g.10gb") == 14
    assert (
        ssh(
            lab, NODE, f"systemctl is-active {CLIENT} && systemctl is-enabled gpustack-mig"
        ).returncode
        == 0
    )
    recorded = json.loads(ssh(lab, NODE, "cat /var/lib/gpustack/mig/state.json").stdout)
    assert recorded["state"] == "success" and recorded["source"] == "ansible"

    calls = len(mig.calls(CONTAINER))
    again, rc = play(lab, nvidia_mig_config="all-1g.10gb")
    assert rc == 0 and again.changed == 0 and fact(again)["state"] == "success"
    assert mig.mutating(mig.calls(CONTAINER)[calls:]) == []


def test_switch_to_all_balanced_and_back_to_all_disabled(lab):
    host, rc = play(lab, nvidia_mig_config="all-balanced")
    assert rc == 0, host.failures
    assert [g["applied"] for g in fact(host)["gpus"]] == [
        {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}
    ] * 2
    assert listing().count("MIG ") == 8
    host, rc = play(lab, nvidia_mig_config="all-disabled")
    assert rc == 0, host.failures
    assert [(g["mode_current"], g["mode_pending"]) for g in fact(host)["gpus"]] == [
        ("Disabled", "Disabled")
    ] * 2
    assert "MIG " not in listing()
    again, rc = play(lab, nvidia_mig_config="all-disabled")
    assert rc == 0 and again.changed == 0


def test_a_process_using_a_gpu_blocks_the_change(lab):
    assert play(lab, nvidia_mig_config="all-1g.10gb")[1] == 0
    before = listing()
    pid = mig.use_gpu(CONTAINER, 1)
    try:
        calls = len(mig.calls(CONTAINER))
        host, rc = play(lab, nvidia_mig_config="all-balanced")
        assert rc == 1 and fact(host)["state"] == "failed"
        message = host.failures[-1].message
        assert f"pid {pid} (sleep) on GPU 1 (GPU-" in message and "nothing was changed" in message
        assert "Hint: stop the processes named above" in message
        assert mig.mutating(mig.calls(CONTAINER)[calls:]) == [] and listing() == before
    finally:
        mig.stop_using(CONTAINER)
    host, rc = play(lab, nvidia_mig_config="all-balanced")
    assert rc == 0 and fact(host)["state"] == "success"


def test_drift_made_by_hand_is_seen_then_repaired(lab):
    mig.smi(CONTAINER, "mig", "-i", "0", "-dci")
    mig.smi(CONTAINER, "mig", "-i", "0", "-dgi")
    host, rc = play(lab, check=True, nvidia_mig_config="all-balanced")
    assert rc == 0 and host.changed > 0
    assert [g["matches"] for g in fact(host)["gpus"]] == [False, True]
    assert fact(host)["gpus"][0]["applied"] == {}
    host, rc = play(lab, nvidia_mig_config="all-balanced")
    assert rc == 0 and fact(host)["gpus"][0]["applied"] == {
        "1g.10gb": 2,
        "2g.20gb": 1,
        "3g.40gb": 1,
    }


def test_reboot_loses_instances_and_the_unit_restores_them(lab):
    before = listing()
    reboot(lab)
    after = listing()
    assert after.count("MIG ") == 8 and after != before  # re-created at boot: new MIG UUIDs
    recorded = json.loads(ssh(lab, NODE, "cat /var/lib/gpustack/mig/state.json").stdout)
    assert (recorded["state"], recorded["source"]) == ("success", "boot")
    order = ssh(lab, NODE, f"systemctl show -p ExecMainExitTimestampMonotonic --value gpustack-mig; "
                           f"systemctl show -p ExecMainStartTimestampMonotonic --value {CLIENT}").stdout.split()  # fmt: skip
    assert int(order[0]) <= int(order[1]), (
        order
    )  # the layout was in place before the client started
    host, rc = play(lab, nvidia_mig_config="all-balanced")
    assert rc == 0 and host.changed == 0


def test_mode_change_without_reset_waits_for_the_reboot(lab):
    assert play(lab, nvidia_mig_config="all-disabled")[1] == 0
    host, rc = play(lab, nvidia_mig_config="all-1g.10gb", nvidia_mig_reset=False)
    assert rc == 0, host.failures  # recorded, not failed (nvidia_mig_reboot=never)
    state = fact(host)
    assert (state["state"], state["reboot_required"]) == ("pending", True)
    assert "reboot required" in state["reason"]
    assert [(g["mode_current"], g["mode_pending"]) for g in state["gpus"]] == [
        ("Disabled", "Enabled")
    ] * 2
    again, rc = play(lab, nvidia_mig_config="all-1g.10gb", nvidia_mig_reset=False)
    assert rc == 0 and again.changed == 0 and "waiting for a reboot" in fact(again)["reason"]
    reboot(lab)
    assert listing().count("MIG 1g.10gb") == 14
    host, rc = play(lab, nvidia_mig_config="all-1g.10gb", nvidia_mig_reset=False)
    assert rc == 0 and host.changed == 0 and fact(host)["state"] == "success"


def test_reboot_policy_if_needed_reboots_and_reports_the_boot_result(lab):
    """nvidia_mig_reboot=if_needed: the role reboots the node itself. Podman does not restart a
    node that shut down, so this test plays the machine's power cycle: it starts it again."""
    assert play(lab, nvidia_mig_config="all-disabled")[1] == 0
    outcome = {}
    variables = {"nvidia_mig_config": "all-1g.10gb", "nvidia_mig_reset": False,
                 "nvidia_mig_reboot": "if_needed", "nvidia_mig_reboot_timeout": 300}  # fmt: skip
    worker = threading.Thread(target=lambda: outcome.update(result=play(lab, **variables)))
    worker.start()
    restarted = False
    while worker.is_alive():
        state = podman_state()
        if state == "exited" and not restarted:
            assert (
                subprocess.run(["podman", "start", CONTAINER], capture_output=True).returncode == 0
            )
            restarted = True
        time.sleep(1)
    host, rc = outcome["result"]
    assert restarted and rc == 0, host.failures
    state = fact(host)
    assert (state["state"], state["source"], state["rebooted"]) == ("success", "boot", True)
    assert [g["applied"] for g in state["gpus"]] == [{"1g.10gb": 7}] * 2
    assert listing().count("MIG 1g.10gb") == 14


def podman_state() -> str:
    proc = subprocess.run(["podman", "inspect", "-f", "{{.State.Status}}", CONTAINER],
                          capture_output=True, text=True)  # fmt: skip
    return proc.stdout.strip()


PATHS = "/etc/systemd/system/gpustack-mig.service /etc/gpustack /usr/local/lib/gpustack /var/lib/gpustack/mig"


def test_uninstall_removes_the_unit_and_files_and_the_gpus_keep_their_layout(lab):
    """Last: `uninstall --components mig` (check mode first) after the layout of the test above."""
    present = f"for p in {PATHS}; do test -e $p && echo $p; done; true"
    before, layout = ssh(lab, NODE, present).stdout.split(), listing()
    assert len(before) == 4 and layout.count("MIG 1g.10gb") == 14, before
    check = run_cli("uninstall", str(lab), "--components", "mig", "--check", timeout=600)
    assert check.returncode == 0, check.stdout + check.stderr
    assert "/etc/systemd/system/gpustack-mig.service" in check.stdout
    assert ssh(lab, NODE, present).stdout.split() == before
    proc = run_cli("uninstall", str(lab), "--components", "mig", "--yes", timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "the GPUs keep their MIG mode and instances" in proc.stdout
    assert ssh(lab, NODE, present).stdout.split() == []
    unit = ssh(lab, NODE, "systemctl show -p LoadState --value gpustack-mig.service").stdout
    assert unit.strip() == "not-found"
    assert listing() == layout  # the fixture's GPUs: mode and instances as they were
    again = run_cli("uninstall", str(lab), "--components", "mig", "--yes", timeout=600)
    assert again.returncode == 0 and "0 changes" in again.stdout, again.stdout
