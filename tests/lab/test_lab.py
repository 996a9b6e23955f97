"""The walking skeleton on real podman systemd nodes: lab up, doctor, install, unreachable, down.

Needs root, podman and debootstrap (the README's set-up installs them). Run with `pytest -m lab`.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.fixtures import lab_fixtures

pytestmark = pytest.mark.lab

LAB = f"ci{os.getpid()}"
VARS = Path(f"/tmp/gpustack-{LAB}-vars.json")
# A node's packages (held or not, versions) and the bytes of its apt and modprobe files: what a
# refused install must leave exactly as it was.
PACKAGES_AND_SOURCES = (
    "dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n'; "
    "find /etc/apt /etc/modprobe.d -type f | sort | xargs md5sum"
)


def ssh(inventory: Path, host: str, command: str) -> subprocess.CompletedProcess:
    """Run a command on a lab node over the inventory's own SSH settings."""
    text = inventory.read_text()
    port = next(
        line.split("ansible_port=")[1].split()[0]
        for line in text.splitlines()
        if line.startswith(host + " ")
    )
    key = next(
        line.split("=", 1)[1]
        for line in text.splitlines()
        if line.startswith("ansible_ssh_private_key_file=")
    )
    return subprocess.run(
        ["ssh", "-i", key, "-p", port, "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "root@127.0.0.1", command],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def podman(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=120)


def doctor_json(inventory: Path, *args: str) -> dict:
    proc = run_cli("doctor", str(inventory), "--output", "json", *args)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("lab") / "lab.ini"
    proc = run_cli(
        "lab", "up", "--name", LAB, "--nodes", "2", "--os", "debian12",
        "--inventory", str(inventory), timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # NVIDIA's toolkit repository is unreachable here: install from the fixture repository.
    repo = lab_fixtures.publish([f"gpustack-{LAB}-node1", f"gpustack-{LAB}-node2"])
    variables = {**lab_fixtures.extra_vars(repo), "container_runtime_verify_image": ""}
    VARS.write_text(json.dumps(variables))
    yield inventory
    run_cli("lab", "down", "--name", LAB)


def test_lab_writes_an_inventory_of_reachable_nodes(lab):
    text = lab.read_text()
    assert f"{LAB}-node1 ansible_host=127.0.0.1" in text
    assert f"{LAB}-node2 ansible_host=127.0.0.1" in text
    assert "gpustack_require_gpu=false" in text
    for node in (f"{LAB}-node1", f"{LAB}-node2"):
        proc = ssh(lab, node, "systemctl is-system-running --wait; cat /etc/debian_version")
        assert proc.stdout.split()[-1].startswith("12."), proc.stdout + proc.stderr


def test_doctor_reports_real_facts_for_both_nodes(lab):
    # node2 gets containerd from Debian's archive; node1 has no runtime at all.
    proc = ssh(
        lab,
        f"{LAB}-node2",
        "apt-get update -qq && "
        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq containerd >/dev/null",
    )
    assert proc.returncode == 0, proc.stderr
    doc = doctor_json(lab)
    assert set(doc["hosts"]) == {f"{LAB}-node1", f"{LAB}-node2"}
    facts = {h: v["facts"]["gpustack_preflight"] for h, v in doc["hosts"].items()}
    for pf in facts.values():
        assert pf["os"]["id"] == "debian" and pf["os"]["version_id"] == "12"
        assert pf["kernel"] == platform.release()  # nodes share the build machine's kernel
        assert pf["arch"] == platform.machine()
        assert pf["gpus"] == {"count": 0, "devices": []}
        assert pf["secure_boot"] in ("enabled", "disabled", "unsupported", "unknown")
        assert pf["driver"]["installed"]["version"] is None
        assert pf["driver"]["loaded_version"] is None
        assert pf["kubelet"]["present"] is False
    assert facts[f"{LAB}-node1"]["runtime"] is None
    assert facts[f"{LAB}-node1"]["runtimes"] == []
    (containerd,) = facts[f"{LAB}-node2"]["runtimes"]
    assert facts[f"{LAB}-node2"]["runtime"] == "containerd"
    assert containerd["version"].startswith("1.6.")
    assert containerd["config_path"] == "/etc/containerd/config.toml"
    assert containerd["active"] is True
    problems = [p["message"] for p in doc["problems"]]
    assert any("no NVIDIA device" in m for m in problems)


def test_install_completes_and_second_run_changes_nothing(lab):
    for attempt in range(2):
        # a first install of two nodes took 11 min on a 2-core machine with a load of 25
        proc = run_cli("install", str(lab), "-e", f"@{VARS}", "--output", "json", timeout=1800)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        doc = json.loads(proc.stdout)
        for host in doc["hosts"].values():
            assert host["status"] == ("changed" if attempt == 0 else "ok"), host
            if attempt:
                assert host["changed"] == 0, host["changes"]
            for fact in (
                "gpustack_preflight",
                "gpustack_driver",
                "gpustack_toolkit",
                "gpustack_runtime",
            ):
                assert fact in host["facts"]


def test_check_mode_and_limit(lab):
    proc = run_cli("install", str(lab), "-e", f"@{VARS}", "--check", "--diff",
                   "--limit", f"{LAB}-node1", timeout=1800)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{LAB}-node1" in proc.stdout and f"{LAB}-node2" not in proc.stdout


def test_unreachable_host_is_reported_and_others_continue(lab):
    assert podman("stop", "-t", "2", f"gpustack-{LAB}-node2").returncode == 0
    proc = run_cli("install", str(lab), "-e", f"@{VARS}", "--output", "json", timeout=1800)
    assert proc.returncode == 4, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    node1, node2 = doc["hosts"][f"{LAB}-node1"], doc["hosts"][f"{LAB}-node2"]
    assert node1["status"] == "ok"
    assert node2["status"] == "unreachable"
    assert "ssh" in node2["unreachable_message"].lower()
    assert doc["summary"]["unreachable"] == 1


def test_lab_up_again_reuses_and_restarts_nodes(lab):
    before = lab.read_text()
    proc = run_cli("lab", "up", "--name", LAB, "--nodes", "2", "--os", "debian12",
                   "--inventory", str(lab))  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert lab.read_text() == before, "same nodes, same ports"
    # containerd installed earlier survived: node2 was restarted, not replaced
    assert ssh(lab, f"{LAB}-node2", "test -x /usr/bin/containerd").returncode == 0
    assert run_cli("install", str(lab), "-e", f"@{VARS}").returncode == 0


def test_lab_down_removes_containers_key_and_inventory(tmp_path):
    name = f"{LAB}d"
    inventory = tmp_path / "down.ini"
    assert run_cli("lab", "up", "--name", name, "--nodes", "1", "--inventory",
                   str(inventory)).returncode == 0  # fmt: skip
    key = Path(inventory.read_text().split("ansible_ssh_private_key_file=")[1].split()[0])
    assert key.exists()
    proc = run_cli("lab", "down", "--name", name)
    assert proc.returncode == 0, proc.stderr
    assert not inventory.exists() and not key.exists()
    listed = podman("ps", "-a", "--format", "{{.Names}}").stdout.split()
    assert f"gpustack-{name}-node1" not in listed


def test_mixed_os_lab(tmp_path):
    """debian13 and forky nodes: images built by debootstrap, facts read over SSH."""
    name = f"{LAB}m"
    inventory = tmp_path / "mixed.ini"
    try:
        proc = run_cli("lab", "up", "--name", name, "--nodes", "2", "--os", "debian13,forky",
                       "--inventory", str(inventory), timeout=1800)  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        doc = doctor_json(inventory)
        osinfo = {h: v["facts"]["gpustack_preflight"]["os"] for h, v in doc["hosts"].items()}
        assert osinfo[f"{name}-node1"]["version_id"] == "13"
        assert osinfo[f"{name}-node2"]["codename"] == "forky"
    finally:
        run_cli("lab", "down", "--name", name)
