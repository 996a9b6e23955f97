"""gpustack_apt_install's whole call (the driver role's transaction with what surrounds it) and its
background start and join.

apt-get, systemctl and dpkg are TEST DOUBLES here (scripts that log their calls to one file, in
order; dpkg keeps its selections in a file, as in test_dpkg_selections.py): a real transaction
would change this machine. dpkg-query is the real one (the packages named do not exist here, so
they are "needed"), and the record is written from this machine's real package list. On lab nodes
the call runs for real in every first install, upgrade and kill/re-run (tests/lab).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from tests.conftest import ROOT
from tests.unit.host_modules import run_module
from tests.unit.test_dpkg_selections import FAKE_DPKG

MODULE = ROOT / "plugins/modules/gpustack_apt_install.py"
PACKAGES = ["gpustack-fixture-driver=1.0-1", "gpustack-fixture-persistenced=1.0-1"]
UNIT = "gpustack-fixture-persistenced.service"
# TEST DOUBLES: each logs its arguments; apt-get sleeps FAKE_APT_SLEEP s and exits FAKE_APT_RC.
FAKE_APT_GET = r"""#!/bin/sh
# TEST DOUBLE (gpustack unit tests): apt-get that installs nothing.
echo "apt-get $*" >> "$FAKE_LOG"
sleep "${FAKE_APT_SLEEP:-0}"
[ "${FAKE_APT_RC:-0}" = 0 ] || { echo "E: Sub-process /usr/bin/dpkg returned an error code (1)" >&2; exit "$FAKE_APT_RC"; }
echo "Unpacking gpustack-fixture-driver (1.0-1) ..."
echo "Setting up gpustack-fixture-driver (1.0-1) ..."
"""
FAKE_SYSTEMCTL = r"""#!/bin/sh
# TEST DOUBLE (gpustack unit tests): systemctl that logs; a unit is enabled once enable ran
# (or where FAKE_ENABLED is 1); `show` answers LoadState FAKE_LOADSTATE (not-found: a unit
# systemd does not know, as before a first install; one line per unit).
echo "systemctl $*" >> "$FAKE_LOG"
case "$1" in
is-enabled) [ "${FAKE_ENABLED:-0}" = 1 ] || grep -q "^systemctl enable" "$FAKE_LOG" ;;
show) shift 3; for unit in "$@"; do echo "${FAKE_LOADSTATE:-not-found}"; done ;;
esac
"""
FAKE_DPKG_LOGGED = FAKE_DPKG.replace(
    "--set-selections)\n", '--set-selections)\n  echo "dpkg --set-selections" >> "$FAKE_LOG"\n', 1
)


def call(tmp_path, check=False, **args) -> dict:
    extra_env = args.pop("_env", {})
    extra_fakes = args.pop("_fakes", {})
    params = {"packages": PACKAGES, "record": str(tmp_path / "state/packages-before"),
              "mask_runtime": [UNIT], "enable": [UNIT],
              "hold": ["gpustack-fixture-driver", "gpustack-fixture-persistenced"],
              "reads": {"commands": {"echo": ["echo", "read after"]}},
              "job_dir": str(tmp_path / "jobs"), "lock_timeout": 0,
              "_ansible_check_mode": check, **args}  # fmt: skip
    env = {"FAKE_LOG": str(tmp_path / "calls"), "FAKE_DPKG_STATE": str(tmp_path / "selections"),
           **extra_env}  # fmt: skip
    fakes = {"apt-get": FAKE_APT_GET, "systemctl": FAKE_SYSTEMCTL, "dpkg": FAKE_DPKG_LOGGED,
             **extra_fakes}  # fmt: skip
    return run_module(MODULE, params, tmp_path / "work", fakes, env)


def calls(tmp_path) -> list[str]:
    path = tmp_path / "calls"
    return [line.split(" -")[0] if line.startswith("apt-get") else line
            for line in path.read_text().splitlines()] if path.exists() else []  # fmt: skip


def selections_file(tmp_path, text="gpustack-fixture-driver\tinstall\n"):
    (tmp_path / "selections").write_text(text)


def step_names(result) -> list[str]:
    """The steps the call timed, in order; their times ascend and do not overlap."""
    ends = [0.0]
    for _name, start, end in result["steps"]:
        assert ends[-1] <= start <= end, result["steps"]
        ends.append(end)
    return [name for name, _start, _end in result["steps"]]


def test_one_call_records_masks_installs_unmasks_enables_holds_and_reads_in_that_order(tmp_path):
    selections_file(tmp_path)
    result = call(tmp_path)
    assert not result.get("failed"), result
    # systemd reloads once: the enable's (a unit systemd does not know is masked without it)
    assert calls(tmp_path) == [
        f"systemctl show --property=LoadState --value {UNIT}",
        f"systemctl mask --runtime --no-reload {UNIT}",
        "apt-get",
        f"systemctl unmask --runtime --no-reload {UNIT}",
        f"systemctl is-enabled --quiet {UNIT}",
        f"systemctl enable --quiet {UNIT}",
        "dpkg --set-selections",
    ]
    assert result["changed"] is True and result["recorded"] is True
    assert result["enabled"] == {UNIT: "enabled"}
    assert result["holds"] == [
        {"item": "gpustack-fixture-driver", "before": "install", "after": "hold"},
        {"item": "gpustack-fixture-persistenced", "before": "not present", "after": "hold"},
    ]
    assert "Setting up gpustack-fixture-driver" in result["stdout"]
    assert result["reads"]["commands"]["echo"]["stdout"] == "read after"
    assert step_names(result) == ["dpkg-query", "record", "mask", "apt-get", "unmask", "enable",
                                  "holds", "reads"]  # fmt: skip
    record = (tmp_path / "state/packages-before").read_text().splitlines()
    assert "dpkg" in record and "gpustack-fixture-driver" not in record  # this machine's own
    assert result["job"] == ""


def test_a_failed_transaction_lifts_the_mask_and_holds_enables_reads_nothing(tmp_path):
    selections_file(tmp_path)
    result = call(tmp_path, _env={"FAKE_APT_RC": "100"})
    assert result["failed"] is True
    assert "Sub-process /usr/bin/dpkg returned an error code" in result["msg"]
    assert calls(tmp_path) == [f"systemctl show --property=LoadState --value {UNIT}",
                               f"systemctl mask --runtime --no-reload {UNIT}", "apt-get",
                               f"systemctl unmask --runtime --no-reload {UNIT}",
                               "systemctl daemon-reload"]  # fmt: skip
    assert "selections.calls" not in os.listdir(tmp_path)
    # the failed step is timed too; nothing after the unmask ran
    assert step_names(result) == ["dpkg-query", "record", "mask", "apt-get", "unmask"]


def test_a_unit_systemd_has_loaded_is_masked_with_its_reload(tmp_path):
    """An upgrade: systemd knows nvidia-persistenced, and the mask must be in force before the
    package scripts run (without the reload systemd would still run the unit as loaded)."""
    selections_file(tmp_path)
    result = call(tmp_path, _env={"FAKE_LOADSTATE": "loaded"})
    assert not result.get("failed"), result
    assert calls(tmp_path)[:3] == [f"systemctl show --property=LoadState --value {UNIT}",
                                   f"systemctl mask --runtime {UNIT}", "apt-get"]  # fmt: skip


def test_a_unit_enabled_already_gets_the_reload_its_unmask_left_out(tmp_path):
    selections_file(tmp_path)
    result = call(tmp_path, _env={"FAKE_ENABLED": "1"})
    assert not result.get("failed"), result
    assert result["enabled"] == {UNIT: "was enabled"}
    assert calls(tmp_path)[3:] == [f"systemctl unmask --runtime --no-reload {UNIT}",
                                   f"systemctl is-enabled --quiet {UNIT}",
                                   "systemctl daemon-reload", "dpkg --set-selections"]  # fmt: skip


def test_check_mode_changes_nothing_and_reports_the_record_and_the_holds(tmp_path):
    selections_file(tmp_path)
    result = call(tmp_path, check=True)
    assert not result.get("failed"), result
    assert calls(tmp_path) == ["apt-get"]  # the simulation
    assert "--simulate" in result["cmd"]
    assert result["recorded"] is True and not (tmp_path / "state/packages-before").exists()
    assert [h["item"] for h in result["holds"]] == ["gpustack-fixture-driver",
                                                     "gpustack-fixture-persistenced"]  # fmt: skip
    assert result["enabled"] == {} and "selections.calls" not in os.listdir(tmp_path)
    assert result["reads"]["commands"]["echo"]["rc"] == 0


def test_nothing_needed_still_holds_and_enables_and_lifts_no_mask_it_did_not_find(tmp_path):
    selections_file(tmp_path, "dpkg\tinstall\n")
    own = os.popen("dpkg-query -W -f='${Version}' dpkg").read()
    (tmp_path / "state").mkdir()
    (tmp_path / "state/packages-before").write_text("kept\n")
    result = call(tmp_path, packages=[f"dpkg={own}"], hold=["dpkg"], background=True)
    assert not result.get("failed"), result
    assert result["job"] == ""  # nothing to do in the background: the call did it all
    assert calls(tmp_path) == [f"systemctl is-enabled --quiet {UNIT}",
                               f"systemctl enable --quiet {UNIT}", "dpkg --set-selections"]  # fmt: skip
    assert result["recorded"] is False
    assert (tmp_path / "state/packages-before").read_text() == "kept\n"


def test_background_start_returns_at_once_and_join_returns_the_calls_result(tmp_path):
    selections_file(tmp_path)
    started = time.monotonic()
    launch = call(tmp_path, background=True, _env={"FAKE_APT_SLEEP": "3"})
    took = time.monotonic() - started
    assert not launch.get("failed"), launch
    assert launch["changed"] is True and launch["job"]
    assert took < 2.5, took  # did not wait for apt-get's 3 s
    job = launch["job"]
    assert json.loads(Path(job + ".pid").read_text())["pid"] > 0
    assert not os.path.exists(job + ".json")
    joined = run_module(MODULE, {"join": job}, tmp_path / "join")
    assert not joined.get("failed"), joined
    assert "Setting up gpustack-fixture-driver" in joined["stdout"]
    assert joined["enabled"] == {UNIT: "enabled"} and len(joined["holds"]) == 2
    assert joined["reads"]["commands"]["echo"]["stdout"] == "read after"
    assert calls(tmp_path)[-1] == "dpkg --set-selections"
    assert os.listdir(tmp_path / "jobs") == []  # the join took the result and the pid file
    # the job's steps come with the join's result, apt-get's 3 s in its own
    steps = {name: end - start for name, start, end in joined["steps"]}
    assert step_names(joined)[3:5] == ["apt-get", "unmask"] and steps["apt-get"] >= 3, steps


def test_a_background_transaction_that_fails_fails_the_join_with_apts_words(tmp_path):
    selections_file(tmp_path)
    launch = call(tmp_path, background=True, _env={"FAKE_APT_RC": "100", "FAKE_APT_SLEEP": "1"})
    joined = run_module(MODULE, {"join": launch["job"]}, tmp_path / "join")
    assert joined["failed"] is True
    assert "Sub-process /usr/bin/dpkg returned an error code" in joined["msg"]
    assert calls(tmp_path)[-2:] == [f"systemctl unmask --runtime --no-reload {UNIT}",
                                    "systemctl daemon-reload"]  # fmt: skip


def test_join_of_a_job_that_died_without_a_result_fails_with_a_hint(tmp_path):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "apt-install-1-1.pid").write_text(json.dumps({"pid": 2**22 + 12345}))  # no such pid
    joined = run_module(MODULE, {"join": str(jobs / "apt-install-1-1")}, tmp_path / "join")
    assert joined["failed"] is True
    assert "ended without a result" in joined["msg"] and "Hint:" in joined["msg"]


def test_a_start_clears_results_no_run_joined_and_pid_files_of_dead_jobs(tmp_path):
    selections_file(tmp_path)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "apt-install-1-1.json").write_text("{}")
    (jobs / "apt-install-1-1.pid").write_text(json.dumps({"pid": 2**22 + 12345}))
    launch = call(tmp_path, background=True)
    run_module(MODULE, {"join": launch["job"]}, tmp_path / "join")
    assert os.listdir(jobs) == []


def test_a_record_that_cannot_be_written_fails_before_anything_is_masked_or_installed(tmp_path):
    selections_file(tmp_path)
    (tmp_path / "state").write_text("a file where the state directory should be")
    result = call(tmp_path)
    assert result["failed"] is True
    assert "could not write" in result["msg"] and "nothing was installed" in result["msg"]
    assert calls(tmp_path) == []


# TEST DOUBLE: apt-get that logs what the pin file holds when it runs (the pin must be there).
FAKE_APT_GET_READS_PIN = FAKE_APT_GET.replace(
    'echo "apt-get $*" >> "$FAKE_LOG"\n',
    'echo "apt-get $*" >> "$FAKE_LOG"\necho "pin: $(cat "$FAKE_PIN" 2>/dev/null)" >> "$FAKE_LOG"\n',
)


def source_changes(tmp_path) -> tuple[Path, Path, Path]:
    """An uncommitted change of the archive components and of a repository source, as
    gpustack_apt_components and gpustack_apt_source leave them before their commit."""
    state = tmp_path / "root/var/lib/gpustack"
    (state / "apt-txn").mkdir(parents=True)
    components = state / "apt-components.json"
    components.write_text(json.dumps({"entries": [{"uris": ["u"], "suites": ["s"],
                                                   "added": ["non-free"]}],
                                      "uncommitted": [{"uris": ["u"], "suites": ["s"],
                                                       "added": ["non-free"]}]}))  # fmt: skip
    pending = state / "apt-txn/archive-components.pending"
    pending.write_text("archive components changed\n")
    source = state / "apt-txn/nvidia-cuda.json"
    source.write_text(json.dumps({"files": {}, "dirs": []}))
    return components, pending, source


def test_the_sources_are_committed_and_the_pins_written_before_the_transaction(tmp_path):
    selections_file(tmp_path)
    components, pending, source = source_changes(tmp_path)
    pin = tmp_path / "pins/gpustack-driver"
    pin.parent.mkdir()
    items = [{"dest": str(pin), "content": "Package: gpustack-fixture-driver\n"}]
    result = call(tmp_path, files=items, commit_components=str(components),
                  commit_sources=["nvidia-cuda", "not-changed"], sources_root=str(tmp_path / "root"),
                  _ansible_diff=True,
                  _fakes={"apt-get": FAKE_APT_GET_READS_PIN}, _env={"FAKE_PIN": str(pin)})  # fmt: skip
    assert not result.get("failed"), result
    assert "pin: Package: gpustack-fixture-driver" in calls(tmp_path)
    assert result["committed"] == ["archive components", "nvidia-cuda"]
    assert "uncommitted" not in json.loads(components.read_text()) and not pending.exists()
    assert json.loads(components.read_text())["entries"][0]["added"] == ["non-free"]
    assert not source.exists()
    assert result["changes"] == [{"path": str(pin), "action": "created"}]
    # the file's diff and the holds' both (plan lists the pin as a file, the holds as holds)
    assert [d.get("after_header") for d in result["diff"]] == [str(pin), None]


def test_check_mode_commits_nothing_writes_no_file_and_reports_the_pins_change(tmp_path):
    selections_file(tmp_path)
    components, pending, source = source_changes(tmp_path)
    pin = tmp_path / "pin"
    result = call(tmp_path, check=True, files=[{"dest": str(pin), "content": "x\n"}],
                  commit_components=str(components), commit_sources=["nvidia-cuda"],
                  sources_root=str(tmp_path / "root"))  # fmt: skip
    assert not result.get("failed"), result
    assert result["changes"] == [{"path": str(pin), "action": "created"}] and not pin.exists()
    assert result["committed"] == [] and pending.exists() and source.exists()
    assert "uncommitted" in json.loads(components.read_text())


def test_a_file_that_cannot_be_written_fails_the_call_before_anything_else(tmp_path):
    selections_file(tmp_path)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    items = [{"dest": str(tmp_path / "first"), "content": "1\n"},
             {"dest": str(blocker / "pin"), "content": "2\n"}]  # fmt: skip
    result = call(tmp_path, files=items, background=True)
    assert result["failed"] is True
    assert result["msg"].startswith("gpustack could not write its state files:")
    # what the call wrote, and the item that failed (as gpustack_state_files reports it)
    assert [c["path"] for c in result["changes"]] == [str(tmp_path / "first"), str(blocker / "pin")]
    assert calls(tmp_path) == [] and not (tmp_path / "state/packages-before").exists()
    assert not (tmp_path / "jobs").exists() or os.listdir(tmp_path / "jobs") == []


def test_a_background_start_writes_the_files_first_and_reports_their_markers(tmp_path):
    selections_file(tmp_path)
    marker, blacklist = tmp_path / "marker", tmp_path / "blacklist"
    items = [{"dest": str(marker), "content": "regenerate\n", "marks": str(blacklist)},
             {"dest": str(blacklist), "content": "blacklist nouveau\n"}]  # fmt: skip
    started = call(tmp_path, files=items, background=True)
    assert started["started"] is True and started["job"], started
    assert started["markers"] == [str(marker)] and blacklist.read_text() == "blacklist nouveau\n"
    joined = call(tmp_path, join=started["job"], packages=[])
    # the message and the steps first: pytest cuts a long result short
    assert not joined.get("failed"), (joined.get("msg"), joined.get("steps"), joined)
    assert "changes" not in joined  # the start reported them


# The initramfs regeneration the nouveau blacklist's marker asks for, at the end of the call
# (configure.yml's round trip of its own where this call ran). The tool is a TEST DOUBLE that logs.
FAKE_TOOL = '#!/bin/sh\necho "update-initramfs $*" >> "$FAKE_LOG"\nexit "${FAKE_TOOL_RC:-0}"\n'


def initramfs(tmp_path, tool=True) -> dict:
    marker = tmp_path / "state/initramfs-pending"
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text("regenerate the initramfs\n")
    path = tmp_path / "sbin/update-initramfs"
    if tool:
        path.parent.mkdir(exist_ok=True)
        path.write_text(FAKE_TOOL)
        path.chmod(0o755)
    return {"marker": str(marker), "argv": [str(path), "-u"]}


def test_a_pending_initramfs_is_regenerated_last_and_its_marker_removed(tmp_path):
    selections_file(tmp_path)
    spec = initramfs(tmp_path)
    result = call(tmp_path, initramfs=spec)
    assert not result.get("failed"), result
    assert calls(tmp_path)[-2:] == ["dpkg --set-selections", "update-initramfs -u"]
    assert result["initramfs"] == "regenerated" and not os.path.exists(spec["marker"])
    again = call(tmp_path, initramfs=dict(spec), packages=[])  # no marker: nothing runs
    assert again["initramfs"] == "" and calls(tmp_path).count("update-initramfs -u") == 1


def test_a_host_without_the_tool_has_nothing_to_regenerate(tmp_path):
    selections_file(tmp_path)
    spec = initramfs(tmp_path, tool=False)
    result = call(tmp_path, initramfs=spec)
    assert result["initramfs"] == "no tool" and not os.path.exists(spec["marker"]), result


def test_a_failing_tool_fails_the_call_and_keeps_the_marker(tmp_path):
    selections_file(tmp_path)
    spec = initramfs(tmp_path)
    result = call(tmp_path, initramfs=spec, _env={"FAKE_TOOL_RC": "1"})
    assert result["failed"] is True and "update-initramfs -u' failed" in result["msg"], result
    assert os.path.exists(spec["marker"])
    assert "Setting up gpustack-fixture-driver" in result["stdout"]  # the transaction's result


def test_check_mode_and_a_failed_transaction_regenerate_nothing(tmp_path):
    selections_file(tmp_path)
    spec = initramfs(tmp_path)
    assert call(tmp_path, check=True, initramfs=spec)["initramfs"] == ""
    failed = call(tmp_path, initramfs=spec, _env={"FAKE_APT_RC": "100"})
    assert failed["failed"] is True and os.path.exists(spec["marker"])
    assert "update-initramfs -u" not in calls(tmp_path)


def test_a_background_transaction_regenerates_the_initramfs_before_its_result(tmp_path):
    selections_file(tmp_path)
    spec = initramfs(tmp_path)
    launch = call(tmp_path, background=True, initramfs=spec)
    joined = run_module(MODULE, {"join": launch["job"]}, tmp_path / "join")
    assert joined["initramfs"] == "regenerated" and not os.path.exists(spec["marker"]), joined


def joined_with_containerd_check(tmp_path, apt_rc="0", **check) -> dict:
    """A background transaction joined with containerd_loaded: the fake containerd and ctr of
    test_containerd_read (TEST DOUBLES), no CRI socket (the configured binary stands in)."""
    from tests.unit.test_containerd_read import FAKE_CONTAINERD, FAKE_CTR

    selections_file(tmp_path)
    launch = call(tmp_path, background=True, _env={"FAKE_APT_RC": apt_rc})
    (tmp_path / "config.toml").write_text("# wired\n")
    (tmp_path / "nvidia-container-runtime").write_text("")
    (tmp_path / "ok-from").write_text("1\n")
    options = {"config": str(tmp_path / "config.toml"), "socket": str(tmp_path / "none.sock"),
               "binary": str(tmp_path / "nvidia-container-runtime"),
               "test_container": {"image": "localhost/busybox:1", "container": "gpustack-verify-n1"},
               **check}  # fmt: skip
    return run_module(
        MODULE, {"join": launch["job"], "containerd_loaded": options}, tmp_path / "join",
        {"containerd": FAKE_CONTAINERD, "ctr": FAKE_CTR}, {"FAKE_CONTAINERD_DIR": str(tmp_path)},
    )  # fmt: skip


def test_join_runs_containerds_loaded_check_after_the_transaction(tmp_path):
    """site.yml hands container_runtime's verify read to the join (one round trip fewer): the
    result is gpustack_containerd_loaded's, the test container through the configured binary."""
    joined = joined_with_containerd_check(tmp_path)
    assert not joined.get("failed"), joined
    assert "Setting up gpustack-fixture-driver" in joined["stdout"]
    check = joined["containerd_loaded"]
    assert check["binary_exists"] is True and check["restart_needed"] is False
    assert check["dump"]["stdout"] == "version = 2\n# wired\n"
    assert check["loaded"]["available"] is False  # no CRI socket here
    assert check["run"]["rc"] == 0 and "gpustack-runtime-ok" in check["run"]["stdout"]
    assert (tmp_path / "ctr.log").read_text().split()[-8:] == [
        "--runc-binary", str(tmp_path / "nvidia-container-runtime"), "localhost/busybox:1",
        "gpustack-verify-n1", "/bin/sh", "-c", "echo", "gpustack-runtime-ok"]  # fmt: skip


def test_a_failed_transaction_runs_no_containerd_check(tmp_path):
    joined = joined_with_containerd_check(tmp_path, apt_rc="100")
    assert joined["failed"] is True and "containerd_loaded" not in joined
    assert not (tmp_path / "ctr.log").exists() and not (tmp_path / "dumps").exists()


def test_an_unknown_containerd_check_option_fails_the_join(tmp_path):
    joined = joined_with_containerd_check(tmp_path, image="busybox")
    assert joined["failed"] is True
    assert "Unsupported parameters" in joined["msg"] and "containerd_loaded.image" in joined["msg"]
