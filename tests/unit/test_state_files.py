"""gpustack_state_files and gpustack_restart (plugins/modules, used by roles/container_runtime):
gpustack's own state files written in one call and in order; a service restarted, waited for
and its markers cleared in one call.

The modules run as scripts, as Ansible runs them; gpustack_restart against a TEST DOUBLE of
systemctl (it logs its arguments; a unit named `broken` fails to restart). On lab nodes both run
against real systemd and containerd (tests/lab/test_runtime.py, test_kill_rerun.py) and Docker
(tests/lab/test_docker_engine.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpustack.ansible.results import RunTracker
from gpustack.fleet.plan_summary import summarize
from tests.conftest import ROOT
from tests.unit.host_modules import run_module

STATE_FILES = ROOT / "plugins/modules/gpustack_state_files.py"
RESTART = ROOT / "plugins/modules/gpustack_restart.py"
FAKE_SYSTEMCTL = """#!/bin/sh
# TEST DOUBLE (gpustack unit tests): logs its arguments; `restart broken.service` fails.
echo "$*" >> "$FAKE_DIR/systemctl.log"
if [ "$1" = restart ] && [ "$2" = broken.service ]; then
  echo "Job for broken.service failed because the control process exited with error code." >&2
  exit 1
fi
exit 0
"""


def run(tmp_path, module, args, check=False, diff=False) -> dict:
    return run_module(
        module,
        {**args, "_ansible_check_mode": check, "_ansible_diff": diff},
        tmp_path,
        {"systemctl": FAKE_SYSTEMCTL},
        {"FAKE_DIR": str(tmp_path)},
    )


def planned(task, action, result):
    """`plan`'s summary of a module result, through the tracker as ansible-runner's events reach it
    (a TaskChange built by hand skipped the tracker's choice of keys and hid a lost file list)."""
    tracker = RunTracker(["n1"])
    tracker.handle({"event": "runner_on_ok", "event_data": {
        "host": "n1", "task": task, "role": "container_runtime", "resolved_action": action,
        "res": result}})  # fmt: skip
    return summarize(tracker.hosts["n1"].changes)


def items(tmp_path, marker=True):
    state = tmp_path / "state"
    return [
        {"dest": str(state), "state": "directory"},
        {"dest": str(state / "config.toml.orig"), "src": str(tmp_path / "config.toml"),
         "mode": "0600", "keep": True, "write": (tmp_path / "config.toml").exists()},
        {"dest": str(state / "record.json"), "content": '{"kind": "containerd"}\n', "keep": True},
        {"dest": str(state / "restart-pending"), "content": "pending\n", "write": marker},
        {"dest": str(tmp_path / "conf.d"), "state": "directory"},
    ]  # fmt: skip


def mode(path) -> int:
    return path.stat().st_mode & 0o7777


def test_writes_in_order_with_modes_then_changes_nothing(tmp_path):
    (tmp_path / "config.toml").write_text("version = 2\n# the user's\n")
    first = run(tmp_path, STATE_FILES, {"items": items(tmp_path)})
    state = tmp_path / "state"
    assert first["changed"] is True
    assert [c["path"] for c in first["changes"]] == [
        str(state), str(state / "config.toml.orig"), str(state / "record.json"),
        str(state / "restart-pending"), str(tmp_path / "conf.d")]  # fmt: skip
    assert (state / "config.toml.orig").read_text() == "version = 2\n# the user's\n"
    assert mode(state / "config.toml.orig") == 0o600
    assert mode(state / "record.json") == 0o644 and mode(state) == 0o755
    assert not [p for p in os.listdir(state) if p.startswith(".")]  # no temporary file left
    again = run(tmp_path, STATE_FILES, {"items": items(tmp_path)})
    assert again == {**again, "changed": False, "changes": []}


def test_keep_leaves_an_existing_file_alone_and_others_are_rewritten(tmp_path):
    (tmp_path / "config.toml").write_text("version = 2\n")
    run(tmp_path, STATE_FILES, {"items": items(tmp_path)})
    (tmp_path / "config.toml").write_text("version = 2\n# changed by gpustack since\n")
    (tmp_path / "state/record.json").write_text("older record\n")
    (tmp_path / "state/restart-pending").write_text("other\n")
    result = run(tmp_path, STATE_FILES, {"items": items(tmp_path)})
    assert result["changes"] == [{"path": str(tmp_path / "state/restart-pending"),
                                  "action": "updated"}]  # fmt: skip
    assert (tmp_path / "state/config.toml.orig").read_text() == "version = 2\n"  # the original
    assert (tmp_path / "state/record.json").read_text() == "older record\n"


def test_write_false_and_a_missing_source_without_write(tmp_path):
    result = run(tmp_path, STATE_FILES, {"items": items(tmp_path, marker=False)})
    assert not (tmp_path / "state/restart-pending").exists()
    assert not (tmp_path / "state/config.toml.orig").exists()  # no main configuration: no backup
    assert str(tmp_path / "state/record.json") in [c["path"] for c in result["changes"]]


def test_check_mode_writes_nothing_and_diff_shows_content(tmp_path):
    (tmp_path / "config.toml").write_text("version = 2\n")
    result = run(tmp_path, STATE_FILES, {"items": items(tmp_path)}, check=True, diff=True)
    assert result["changed"] is True and len(result["changes"]) == 5
    assert not (tmp_path / "state").exists() and not (tmp_path / "conf.d").exists()
    assert {d["after_header"]: d["after"] for d in result["diff"]} == {
        str(tmp_path / "state/record.json"): '{"kind": "containerd"}\n',
        str(tmp_path / "state/restart-pending"): "pending\n"}  # fmt: skip
    plan = planned("Keep what existed", "gpustack.gpustack.gpustack_state_files", result)
    assert [f["path"] for f in plan.files] == [c["path"] for c in result["changes"]]
    assert plan.files[2]["diff"][0]["after"] == '{"kind": "containerd"}\n'


def test_stops_at_the_first_failure_with_what_was_done(tmp_path):
    bad = [{"dest": str(tmp_path / "a"), "content": "a\n"},
           {"dest": str(tmp_path / "b"), "src": str(tmp_path / "missing")},
           {"dest": str(tmp_path / "c"), "content": "c\n"}]  # fmt: skip
    result = run(tmp_path, STATE_FILES, {"items": bad})
    assert result["failed"] is True and "cannot read" in result["msg"]
    assert (tmp_path / "a").exists() and not (tmp_path / "c").exists()
    assert result["changes"] == [{"path": str(tmp_path / "a"), "action": "created"}]
    unknown = run(tmp_path, STATE_FILES, {"items": [{"dest": str(tmp_path / "d"), "contnet": "x"}]})
    assert unknown["failed"] is True and "knows only" in unknown["msg"]


def test_restart_waits_then_clears_the_marker(tmp_path):
    marker = tmp_path / "restart-pending"
    marker.write_text("pending\n")
    ready = tmp_path / "ready"
    # answers on the second try: the first poll creates the file the second one finds
    wait = ["sh", "-c", f"test -e {ready} || {{ touch {ready}; echo not yet >&2; exit 1; }}"]
    result = run(tmp_path, RESTART, {"name": "containerd", "wait": wait, "remove": [str(marker)]})
    assert result["changed"] is True and result["restarted"] is True
    assert result["removed"] == [str(marker)] and not marker.exists()
    assert 0.9 <= result["waited_s"] < 5
    assert (tmp_path / "systemctl.log").read_text() == "restart containerd.service\n"


def test_restart_false_only_waits_and_reset_failed_comes_first(tmp_path):
    result = run(tmp_path, RESTART, {"name": "containerd", "restart": False, "wait": ["true"]})
    assert result["changed"] is False and not (tmp_path / "systemctl.log").exists()
    run(tmp_path, RESTART, {"name": "docker", "reset_failed": True})
    assert (tmp_path / "systemctl.log").read_text().splitlines() == [
        "reset-failed docker.service", "restart docker.service"]  # fmt: skip


def test_restart_failures_name_the_reason_and_keep_the_marker(tmp_path):
    marker = tmp_path / "restart-pending"
    marker.write_text("pending\n")
    failed = run(tmp_path, RESTART, {"name": "broken", "remove": [str(marker)]})
    assert failed["failed"] is True
    assert failed["msg"] == ("systemctl restart broken failed: Job for broken.service failed "
                             "because the control process exited with error code.")  # fmt: skip
    silent = run(
        tmp_path,
        RESTART,
        {
            "name": "containerd",
            "timeout": 1,
            "remove": [str(marker)],
            "wait": ["sh", "-c", "echo 'connection refused' >&2; exit 1"],
        },
    )
    assert silent["failed"] is True and marker.exists()
    assert silent["msg"] == ("containerd did not answer `sh -c echo 'connection refused' >&2; "
                             "exit 1` within 1 s: connection refused")  # fmt: skip


def test_restart_check_mode_does_nothing_and_plan_says_restart(tmp_path):
    marker = tmp_path / "restart-pending"
    marker.write_text("pending\n")
    result = run(tmp_path, RESTART, {"name": "docker", "remove": [str(marker)]}, check=True)
    assert result["changed"] is True and marker.exists()
    assert not (tmp_path / "systemctl.log").exists()
    plan = planned("Restart Docker", "gpustack.gpustack.gpustack_restart", result)
    assert plan.services == ["docker: would restart"]
    cleared = run(tmp_path, RESTART, {"name": "containerd", "restart": False,
                                      "remove": [str(marker)]}, check=True)  # fmt: skip
    assert cleared["changed"] is True
    plan = planned("Wait", "gpustack.gpustack.gpustack_restart", cleared)
    assert plan.services == [] and plan.other == []


def test_restart_without_systemctl_says_so(tmp_path):
    """The lent H100 VM (2026-11-27) has no systemd: run_command said only "Error executing
    command."."""
    result = run_module(
        RESTART, {"name": "containerd", "restart": True}, tmp_path, path="/nonexistent"
    )
    assert result["failed"] is True
    assert result["msg"] == (
        "cannot restart containerd: systemctl is not installed (the host does not run systemd)"
    )


def test_backup_keeps_the_previous_content_as_copy_names_it(tmp_path):
    """containerd's drop-in and main configuration are written with backup: an existing file
    whose content changes is copied next to it first (copy's name: FILE.PID.DATE@TIME~) and the
    change names the copy; a new file, an unchanged one and check mode make none."""
    etc = tmp_path / "etc"
    etc.mkdir()
    config, dropin = etc / "config.toml", etc / "99-nvidia.toml"
    config.write_text("version = 2\n# the user's\n")
    config.chmod(0o600)
    args = {"items": [{"dest": str(config), "content": "version = 2\nimports = []\n",
                       "backup": True},
                      {"dest": str(dropin), "content": "# nvidia\n", "backup": True}]}  # fmt: skip
    planned = run(tmp_path, STATE_FILES, args, check=True)
    assert [c.get("backup") for c in planned["changes"]] == [None, None]
    assert sorted(p.name for p in etc.iterdir()) == ["config.toml"]
    result = run(tmp_path, STATE_FILES, args)
    backup = result["changes"][0]["backup"]
    assert result["changes"][0]["action"] == "updated" and backup.endswith("~")
    assert os.path.basename(backup).startswith("config.toml.")
    assert Path(backup).read_text() == "version = 2\n# the user's\n"
    assert result["changes"][1] == {"path": str(dropin), "action": "created"}
    assert config.read_text() == "version = 2\nimports = []\n" and mode(config) == 0o644
    again = run(tmp_path, STATE_FILES, args)
    assert again["changed"] is False
    assert len(list(etc.glob("config.toml.*~"))) == 1


# How ansible's AnsibleModule.atomic_move fails when the final rename is refused: ansible-core
# 2.19 raises a bare Exception (the installed release runs as it is); 2.16-2.18 call fail_json
# themselves (lib/ansible/module_utils/basic.py of ansible-core 2.16.14 and 2.18.6, read from
# their PyPI sdists), which the TEST DOUBLE below reproduces on top of the installed release.
OLD_ATOMIC_MOVE = (
    "from ansible.module_utils import basic\n"
    "def atomic_move(self, src, dest, *args, **kwargs):\n"
    "    try:\n"
    "        os.rename(src, dest)\n"
    "    except OSError as e:\n"
    "        self.fail_json(msg='Could not replace file: %s to %s: %s' % (src, dest, e))\n"
    "basic.AnsibleModule.atomic_move = atomic_move\n"
)


@pytest.mark.parametrize("release", ["raises (2.19)", "fail_json (2.16-2.18)"])
def test_a_file_ansible_cannot_replace_still_returns_what_was_written(tmp_path, release):
    """When atomic_move cannot replace a file (EBUSY where the destination is a mount point, as a
    bind-mounted config.toml is on the lab: test_runtime.py), the result must still list what the
    call wrote, or container_runtime's rescue restores nothing. The kernel's refusal is a TEST
    DOUBLE: os.rename raises EBUSY for one path."""
    busy = tmp_path / "config.toml"
    busy.write_text("version = 2\n")
    wrapper = tmp_path / "busy_state_files.py"
    wrapper.write_text(
        "import errno, os, runpy\n"
        "_rename = os.rename\n"
        "def rename(src, dst, *args, **kwargs):\n"
        f"    if os.fsdecode(dst) == {str(busy)!r}:\n"
        "        raise OSError(errno.EBUSY, 'Device or resource busy', os.fsdecode(dst))\n"
        "    return _rename(src, dst, *args, **kwargs)\n"
        "os.rename = rename\n"
        + (OLD_ATOMIC_MOVE if release.startswith("fail_json") else "")
        + f"runpy.run_path({str(STATE_FILES)!r}, run_name='__main__')\n"
    )
    dropin = tmp_path / "conf.d" / "99-nvidia.toml"
    todo = [{"dest": str(dropin.parent), "state": "directory"},
            {"dest": str(dropin), "content": "version = 2\n", "backup": True},
            {"dest": str(busy), "content": "version = 2\nimports = []\n", "backup": True},
            {"dest": str(tmp_path / "after"), "content": "never\n"}]  # fmt: skip
    result = run(tmp_path, wrapper, {"items": todo})
    assert result["failed"] is True
    assert result["msg"].startswith("gpustack could not write its state files: ")
    assert "busy" in result["msg"].lower(), result["msg"]
    assert [(c["path"], c["action"]) for c in result["changes"]] == [
        (str(dropin.parent), "created"), (str(dropin), "created"), (str(busy), "updated")]  # fmt: skip
    assert Path(result["changes"][2]["backup"]).read_text() == "version = 2\n"
    assert busy.read_text() == "version = 2\n" and not (tmp_path / "after").exists()


def marked(tmp_path, content="blacklist nouveau\n"):
    """nvidia_driver's use: a marker written before its blacklist changes (configure.yml)."""
    marker, blacklist = tmp_path / "initramfs-pending", tmp_path / "blacklist.conf"
    items = [{"dest": str(marker), "content": "pending\n", "marks": str(blacklist)},
             {"dest": str(blacklist), "content": content}]  # fmt: skip
    return marker, blacklist, items


def test_a_marker_is_written_before_the_file_it_marks_changes_and_left_until_cleared(tmp_path):
    marker, blacklist, args = marked(tmp_path)
    first = run(tmp_path, STATE_FILES, {"items": args})
    assert [c["path"] for c in first["changes"]] == [str(marker), str(blacklist)]  # marker first
    assert first["markers"] == [str(marker)] and marker.read_text() == "pending\n"
    # the caller did not clear it (its regeneration failed): the marker stays, the file is as wanted
    again = run(tmp_path, STATE_FILES, {"items": args})
    assert (again["changed"], again["markers"]) == (False, [str(marker)])
    marker.unlink()  # cleared after the regeneration
    done = run(tmp_path, STATE_FILES, {"items": args})
    assert (done["changed"], done["markers"]) == (False, [])
    assert not marker.exists()
    # the file edited by hand: rewritten, marked again
    blacklist.write_text("# edited\n")
    edited = run(tmp_path, STATE_FILES, {"items": args})
    assert [c["path"] for c in edited["changes"]] == [str(marker), str(blacklist)]
    assert edited["markers"] == [str(marker)]


def test_a_marker_in_check_mode_and_a_marker_of_nothing(tmp_path):
    marker, blacklist, args = marked(tmp_path)
    plan = run(tmp_path, STATE_FILES, {"items": args}, check=True)
    assert (plan["changed"], plan["markers"]) == (True, [str(marker)])
    assert not marker.exists() and not blacklist.exists()
    # a marker must name a file item written after it in the same call
    bad = [{"dest": str(marker), "content": "x\n", "marks": str(tmp_path / "other")}, args[1]]
    failed = run(tmp_path, STATE_FILES, {"items": bad})
    assert failed["failed"] is True
    assert "is not a file item written later in this call" in failed["msg"], failed["msg"]
    assert not marker.exists() and not blacklist.exists()
