"""gpustack_reads (plugins/modules, used by roles/nvidia_driver and nvidia_container_toolkit):
several files and read-only commands in one module call. Runs the module as a script on this
machine (real files, real commands; no test double needed). On lab nodes the roles use it
against real dpkg-query, apt-mark and /proc (tests/lab: every install's verify step)."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

from tests.conftest import ROOT

MODULE = ROOT / "plugins/modules/gpustack_reads.py"


def run(tmp_path, **module_args) -> dict:
    args = tmp_path / "args.json"
    args.write_text(
        json.dumps({"ANSIBLE_MODULE_ARGS": {**module_args, "_ansible_check_mode": True}})
    )
    proc = subprocess.run([sys.executable, "-m", "tests.unit.host_modules", str(MODULE), str(args)],
                          capture_output=True, text=True, cwd=ROOT)  # fmt: skip
    return json.loads(proc.stdout)


def test_files_and_commands_in_one_call_even_in_check_mode(tmp_path):
    (tmp_path / "version").write_bytes(
        b"NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.309.01\n"
    )
    result = run(
        tmp_path,
        files={"version": str(tmp_path / "version"), "absent": str(tmp_path / "nosuch")},
        commands={
            "echo": ["printf", "a\\nb\\n"],
            "false": ["false"],
            "missing": ["no-such-binary-x"],
        },
    )
    assert result["changed"] is False and not result.get("failed"), result
    assert base64.b64decode(result["files"]["version"]["content"]).endswith(b"535.309.01\n")
    assert result["files"]["absent"]["exists"] is False
    assert "No such file" in result["files"]["absent"]["error"]
    assert result["commands"]["echo"] == {"rc": 0, "stdout": "a\nb", "stderr": "",
                                          "stdout_lines": ["a", "b"]}  # fmt: skip
    assert result["commands"]["false"]["rc"] == 1
    assert result["commands"]["missing"]["rc"] == 127


def test_must_succeed_fails_on_a_non_zero_return_code(tmp_path):
    result = run(tmp_path, commands={"holds": ["sh", "-c", "echo broken >&2; exit 3"],
                                     "ok": ["true"]}, must_succeed=["holds"])  # fmt: skip
    assert result["failed"] is True
    assert result["msg"] == "sh -c echo broken >&2; exit 3 failed (rc 3): broken"
    assert (
        run(tmp_path, commands={"ok": ["true"]}, must_succeed=["ok"])["commands"]["ok"]["rc"] == 0
    )


def test_a_command_must_be_an_argv_list(tmp_path):
    result = run(tmp_path, commands={"shell": "apt-mark showhold"})
    assert result["failed"] is True and "argv list" in result["msg"]
