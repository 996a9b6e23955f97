"""`gpustack status` shows a node's MIG layout and the drift when the GPUs are changed by hand.

A real Debian 12 lab node (real systemd, SSH, Ansible, the real CLI); the GPU is the MIG TEST
FIXTURE `nvidia-smi` (tests/fixtures/nvidia_smi_mig.py) declaring one "H100 80GB". Proves the
status path (playbooks/status.yml running nvidia_mig in check mode, gpustack/fleet/status.py) on
the fixture's model only - nothing about NVIDIA's binary (tests/fixtures/README.md).
"""

from __future__ import annotations

import json
import os

import pytest

from gpustack.ansible import runner
from gpustack.ansible.inventory import load_inventory
from tests.conftest import lab_nodes, run_cli
from tests.fixtures import mig
from tests.lab.test_lab import ssh

pytestmark = pytest.mark.lab

LAB = f"i15mst{os.getpid()}"
NODE = f"{LAB}-node1"
CONTAINER = f"gpustack-{LAB}-node1"
LAYOUT = "nvidia_mig_config=all-1g.10gb"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("migstatus") / "mig.ini"
    with lab_nodes(LAB, 1, inventory):
        mig.install(CONTAINER, ["H100-SXM5-80GB"])
        yield inventory


def status(inventory, *extra):
    proc = run_cli("status", str(inventory), *extra, "-o", "json", timeout=600)
    doc = json.loads(proc.stdout)
    return proc, doc["nodes"][NODE]


def mig_drift(row):
    return [d for d in row["drift"] if d.startswith("MIG layout")]


def test_status_shows_the_layout_and_drift_after_a_change_by_hand(lab):
    # without a layout set, status has no MIG row and never touches the GPUs
    _, row = status(lab)
    assert row["mig"] is None and mig_drift(row) == [] and mig.calls(CONTAINER) == []

    spec = runner.build_run_spec(
        "mig.yml", load_inventory(lab), {"nvidia_mig_config": "all-1g.10gb"}
    )
    result = runner.run_playbook(spec)
    assert result.hosts[NODE].facts["gpustack_mig"]["state"] == "success", result.hosts[
        NODE
    ].failures

    _, row = status(lab, "-e", LAYOUT)
    assert row["mig"] == {"config": "all-1g.10gb", "state": "success",
                          "layout": ["GPU 0: 7 x 1g.10gb"], "drift": ""}  # fmt: skip
    assert mig_drift(row) == []

    # by hand, as an admin would: destroy two of the instances
    listed = mig.smi(CONTAINER, "mig", "-lgi")
    gis = [line.split()[5] for line in listed.splitlines() if "MIG 1g.10gb" in line][:2]
    assert len(gis) == 2, listed
    for gi in gis:
        mig.smi(CONTAINER, "mig", "-i", "0", "-gi", gi, "-dci")
        mig.smi(CONTAINER, "mig", "-i", "0", "-gi", gi, "-dgi")
    changed_by_hand = len(mig.mutating(mig.calls(CONTAINER)))

    proc, row = status(lab, "-e", LAYOUT)
    assert row["mig"]["layout"] == ["GPU 0: 5 x 1g.10gb"]
    assert row["mig"]["state"] == "pending"
    assert mig_drift(row) == [f"MIG layout all-1g.10gb: {row['mig']['drift']}"]
    assert "create 7 x 1g.10gb" in row["mig"]["drift"], row["mig"]
    assert proc.returncode == 5  # DRIFT
    # status only read: no instance was created or destroyed, nothing written on the node
    assert len(mig.mutating(mig.calls(CONTAINER))) == changed_by_hand
    recorded = json.loads(ssh(lab, NODE, "cat /var/lib/gpustack/mig/state.json").stdout)
    assert recorded["state"] == "success" and recorded["check_mode"] is False

    text = run_cli("status", str(lab), "-e", LAYOUT, timeout=600).stdout
    assert "MIG layouts:" in text and "GPU 0: 5 x 1g.10gb" in text
