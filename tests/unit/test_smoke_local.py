"""`--local` (no SSH) and `gpustack smoke` end to end on this machine, which has no NVIDIA GPU:
real ansible-runner runs over Ansible's local connection, the real gpu_smoke module."""

import json
import os
import sys

from gpustack.ansible import inventory
from tests.conftest import ROOT, run_cli, runs_started
from tests.unit.test_smoke_fixtures import validate_capture

A100 = ROOT / "tests/fixtures/real-gpu/public/handwritten-v11-a100-sxm4-40gb-mig/nvidia-smi-q-x.xml"


def test_local_inventory_is_written_once_and_read_by_ansible(tmp_path):
    path = inventory.write_local_inventory(tmp_path)
    text = path.read_text()
    assert "localhost ansible_connection=local" in text
    assert f"ansible_python_interpreter={sys.executable}" in text
    stamp = path.stat().st_mtime_ns
    assert inventory.write_local_inventory(tmp_path) == path and path.stat().st_mtime_ns == stamp
    inv = inventory.load_inventory(path)
    assert inv.hosts == ["localhost"] and inv.target_group == "gpu_nodes"
    assert inv.hostvars["localhost"]["ansible_connection"] == "local"
    assert inv.hostvars["localhost"]["k8s_node_name"]


def test_local_and_inventory_exclude_each_other(tmp_path, state_dir):
    inv = tmp_path / "inv.ini"
    inv.write_text("[gpu_nodes]\nnode1\n")
    for command in ("doctor", "status", "plan", "smoke", "install", "uninstall"):
        proc = run_cli(command, str(inv), "--local")
        assert proc.returncode == 2, (command, proc.stderr)
        assert "Error: both an inventory" in proc.stderr and "Hint:" in proc.stderr
        proc = run_cli(command)
        assert proc.returncode == 2 and "Error: Missing argument 'INVENTORY'" in proc.stderr, (
            command
        )
    assert not runs_started(state_dir)


def test_doctor_and_status_local(state_dir):
    proc = run_cli("doctor", "--local", "--output", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["hosts"]["localhost"]["facts"]["gpustack_preflight"]["gpus"]["count"] == 0
    assert (state_dir / "local-inventory.ini").is_file()
    (problem,) = [p for p in doc["problems"] if "no NVIDIA device" in p["message"]]
    assert problem["severity"] == "warning" and "expected on lab or CPU nodes" in problem["hint"]
    # status agrees with doctor: no GPU and none required, so what is missing is not drift
    proc = run_cli("status", "--local", "--output", "json")
    assert proc.returncode == 0, proc.stderr
    node = json.loads(proc.stdout)["nodes"]["localhost"]
    assert node["driver"] and node["drift"] == []
    assert "driver not installed" in node["notes"][0]


def test_doctor_and_status_read_gpustack_require_gpu_from_the_inventory(tmp_path, state_dir):
    """Set in the inventory (as the roles read it), not only with -e: both commands fail here."""
    inv = tmp_path / "inv.ini"
    inv.write_text(
        "[gpu_nodes]\nlocal1 ansible_connection=local ansible_python_interpreter=/usr/bin/python3\n"
        "[gpu_nodes:vars]\ngpustack_require_gpu=true\n"
    )
    proc = run_cli("doctor", str(inv), "--output", "json")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    errors = [p for p in json.loads(proc.stdout)["problems"] if p["severity"] == "error"]
    assert [p["message"] for p in errors] == ["no NVIDIA device (PCI vendor 10de) on this host"]
    proc = run_cli("status", str(inv), "--output", "json")
    assert proc.returncode == 5, proc.stdout + proc.stderr
    assert "driver not installed" in json.loads(proc.stdout)["drift"]["local1"][0]


def test_smoke_local_reports_no_nvidia_device(tmp_path, state_dir):
    report = tmp_path / "smoke.json"
    proc = run_cli("smoke", "--local", "--report", str(report), "--capture", str(tmp_path / "cap"))
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "localhost: no NVIDIA device" in proc.stdout
    doc = json.loads(report.read_text())
    smoke = doc["smoke"]["localhost"]
    assert smoke["verdict"] == "no NVIDIA device" and doc["exit_code"] == 3
    got = {c["name"]: c["status"] for c in smoke["checks"]}
    assert got["gpu_pci"] == got["nvidia_smi"] == got["cdi"] == got["toolkit"] == "absent"
    assert "pass" not in {
        got[n] for n in ("driver_loaded", "nvidia_smi", "toolkit", "cdi", "container")
    }
    probe = doc["hosts"]["localhost"]["facts"]["gpustack_smoke"]
    assert probe["tools"]["nvidia-smi"] is None and probe["nvidia_smi"] is None
    assert doc["hosts"]["localhost"]["changed"] == 0
    (captured,) = (tmp_path / "cap").iterdir()
    assert captured.name.endswith("-no-gpu")
    validate_capture(captured)


def test_smoke_runs_the_nvidia_smi_it_finds_and_parses_it_on_the_controller(tmp_path, state_dir):
    """A TEST DOUBLE named nvidia-smi prints a hand-written A100 sample (not captured from a GPU):
    proves the module runs the tool on PATH and the controller parses and masks its output;
    nothing about NVIDIA. This machine has no NVIDIA PCI device, so the verdict stays
    "no NVIDIA device" and the mismatch is a failed check, not a pass."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    stub = bin_dir / "nvidia-smi"
    stub.write_text(
        "#!/bin/sh\n# TEST DOUBLE (gpustack tests): not NVIDIA's nvidia-smi.\n"
        f'if [ "$*" = "-q -x" ]; then cat "{A100}"; exit 0; fi\n'
        "echo \"Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.\" >&2\n"
        "exit 2\n"
    )
    stub.chmod(0o755)
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    proc = run_cli("smoke", "--local", "-o", "json", "--capture", str(tmp_path / "cap"), env=env)
    assert proc.returncode == 3, proc.stderr
    doc = json.loads(proc.stdout)
    smoke = doc["smoke"]["localhost"]
    smi = next(c for c in smoke["checks"] if c["name"] == "nvidia_smi")
    assert smi["status"] == "fail" and "no NVIDIA device is on PCI" in smi["summary"]
    assert smi["detail"]["driver_version"] == "515.105.01"
    assert smoke["gpus"][0]["uuid"] == "GPU-1b6ebc9c-aea7-43c3-a9be-5a0657b7731b"
    assert [d["gpu_instance_id"] for d in smoke["gpus"][0]["mig_devices"]] == [2, 3, 9, 10]
    assert smoke["verdict"] == "no NVIDIA device"
    (captured,) = (tmp_path / "cap").iterdir()
    assert captured.name.endswith("-a100-sxm4-40gb")
    xml = (captured / "nvidia-smi-q-x.xml").read_text()
    assert "<serial>SERIAL-MASKED-1</serial>" in xml and "1561022017539" not in xml
    validate_capture(captured)


def test_capture_must_be_a_directory(tmp_path, state_dir):
    target = tmp_path / "file"
    target.write_text("x")
    proc = run_cli("smoke", "--local", "--capture", str(target))
    assert proc.returncode == 2 and "is not a directory" in proc.stderr
    assert not runs_started(state_dir)


def test_install_local_runs_on_this_machine_without_ssh(state_dir):
    """install --local (check mode, the preflight only: nothing of this machine changes) goes
    through the same one-line inventory as the read-only commands."""
    proc = run_cli("install", "--local", "--check", "--tags", "gpu_preflight", "-o", "json")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert list(doc["hosts"]) == ["localhost"] and doc["hosts"]["localhost"]["changed"] == 0
    assert doc["hosts"]["localhost"]["facts"]["gpustack_preflight"]["gpus"]["count"] == 0
    assert (state_dir / "local-inventory.ini").is_file()
