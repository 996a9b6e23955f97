"""`--report FILE` writes the command's JSON document for every command that runs on hosts."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

LOCAL = "[gpu_nodes]\nlocal1 ansible_connection=local ansible_python_interpreter=/usr/bin/python3\n"
# Nothing listens on port 1: the host is unreachable, so uninstall changes nothing here.
# A host that must have a GPU: without one (this machine), status finds drift (a host without
# GPU that is not required to have one is expected, as doctor says, and shows no drift).
LOCAL_GPU = LOCAL.replace("python3\n", "python3 gpustack_require_gpu=true\n")
UNREACHABLE = "[gpu_nodes]\ngone ansible_host=127.0.0.1 ansible_port=1 ansible_user=root\n"


@pytest.mark.parametrize(
    ("command", "inventory", "args", "code"),
    [
        ("doctor", LOCAL, [], 0),
        ("status", LOCAL_GPU, [], 5),  # this machine has no gpustack stack: drift
        ("plan", LOCAL, ["--tags", "gpu_preflight"], 0),
        ("install", LOCAL, ["--tags", "gpu_preflight"], 0),
        ("uninstall", UNREACHABLE, ["--components", "driver,toolkit,runtime", "--yes"], 4),
    ],
)
def test_every_command_writes_its_report(tmp_path, state_dir, command, inventory, args, code):
    inv = tmp_path / "inv.ini"
    inv.write_text(inventory)
    report = tmp_path / "out" / f"{command}.json"
    proc = run_cli(command, str(inv), *args, "--report", str(report), "--output", "json")
    assert proc.returncode == code, proc.stderr
    saved = json.loads(report.read_text())
    assert saved == json.loads(proc.stdout)
    assert saved["command"] == command and saved["exit_code"] == code
    assert set(saved["hosts"]) == ({"gone"} if inventory == UNREACHABLE else {"local1"})
    assert {"summary", "status", "artifacts"} <= set(saved)


def test_text_output_writes_the_same_report(tmp_path, state_dir):
    inv = tmp_path / "inv.ini"
    inv.write_text(LOCAL_GPU)
    report = tmp_path / "status.json"
    proc = run_cli("status", str(inv), "--report", str(report))
    assert proc.returncode == 5 and "Drift on 1 of 1 node(s)" in proc.stdout
    saved = json.loads(report.read_text())
    assert saved["command"] == "status" and saved["drift"]["local1"]
