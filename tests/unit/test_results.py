from gpustack.ansible.results import RunResult, RunTracker, host_to_dict
from gpustack.errors import ExitCode
from gpustack.terminal import junit


def ev(kind, host=None, **data):
    event_data = {"host": host, "task": data.pop("task", "t"), "role": data.pop("role", "r")}
    event_data.update(data)
    return {"event": kind, "event_data": event_data}


def result(tracker, status="successful", rc=0):
    return RunResult("site.yml", status, rc, "/tmp/a", tracker.hosts)


def test_facts_changes_and_failures_are_folded_per_host():
    t = RunTracker(["a", "b"])
    t.handle(
        ev(
            "runner_on_ok",
            "a",
            res={
                "changed": False,
                "ansible_facts": {"gpustack_preflight": {"kernel": "6.1"}, "other": 1},
            },
        )
    )
    t.handle(
        ev(
            "runner_on_ok",
            "a",
            task="write",
            res={"changed": True, "diff": {"before": "x", "after": "y"}},
        )
    )
    t.handle(
        ev(
            "runner_on_failed",
            "b",
            task="apt",
            role="nvidia_driver",
            res={"msg": "No package matching 'x'", "stderr": "E: boom"},
        )
    )
    t.handle(ev("runner_on_failed", "b", task="probe", ignore_errors=True, res={"msg": "m"}))
    a, b = t.hosts["a"], t.hosts["b"]
    assert a.facts == {"gpustack_preflight": {"kernel": "6.1"}}
    assert (a.ok, a.changed, a.status) == (2, 1, "changed")
    assert a.changes[0].task == "write" and a.changes[0].diff == [{"before": "x", "after": "y"}]
    assert b.status == "failed" and b.failed == 1
    assert b.failures[0].role == "nvidia_driver"
    assert b.failures[0].message == "No package matching 'x' | E: boom"
    assert result(t, "failed", 2).exit_code == ExitCode.HOST_FAILED


def test_unreachable_gives_exit_4_and_keeps_ssh_message():
    t = RunTracker(["a", "b"])
    t.handle(ev("runner_on_ok", "a", res={}))
    t.handle(ev("runner_on_unreachable", "b", res={"msg": "ssh: connect to host x port 22"}))
    t.handle(
        {
            "event": "playbook_on_stats",
            "event_data": {
                "ok": {"a": 1},
                "dark": {"b": 1},
                "changed": {},
                "failures": {},
                "skipped": {},
            },
        }
    )
    assert t.hosts["b"].status == "unreachable"
    assert "ssh: connect" in t.hosts["b"].unreachable_message
    assert result(t, "failed", 4).exit_code == ExitCode.UNREACHABLE
    assert result(t, "failed", 4).summary() == {
        "hosts": 2,
        "ok": 1,
        "changed": 0,
        "failed": 0,
        "unreachable": 1,
        "stopped": 0,
    }


def test_stats_are_authoritative_and_clean_run_exits_0():
    t = RunTracker(["a"])
    t.handle(ev("runner_on_ok", "a", res={"changed": True}))
    t.handle(
        {
            "event": "playbook_on_stats",
            "event_data": {
                "ok": {"a": 3},
                "changed": {"a": 0},
                "failures": {},
                "dark": {},
                "skipped": {"a": 1},
            },
        }
    )
    host = t.hosts["a"]
    assert (host.ok, host.changed, host.skipped) == (3, 0, 1)
    assert result(t).exit_code == ExitCode.OK
    assert result(t, "canceled", 254).exit_code == ExitCode.CANCELED


def test_a_canceled_run_reports_the_hosts_it_stopped_and_the_signals_exit_code(monkeypatch):
    """A run stopped by Ctrl-C or SIGTERM before its play recap: the hosts it had started are
    "stopped", not "ok" (seen on a lab node on 2026-11-29: a SIGTERM'd install read "1 ok"), and
    its report carries the exit code the process exits with (143 after SIGTERM, not 130)."""
    from gpustack import errors

    t = RunTracker(["a", "b", "c"])
    t.handle(ev("runner_on_start", "a", task="Refresh the package lists"))
    t.handle(ev("runner_on_ok", "a", res={"changed": True}))
    t.handle(ev("runner_on_failed", "b", res={"msg": "boom"}))
    t.ended()
    assert [t.hosts[h].status for h in "abc"] == ["stopped", "failed", "not run"]
    canceled = result(t, "canceled", 254)
    assert canceled.summary()["stopped"] == 1 and canceled.summary()["ok"] == 0
    assert host_to_dict(t.hosts["a"])["status"] == "stopped"
    assert canceled.exit_code == ExitCode.CANCELED
    monkeypatch.setitem(errors._SIGTERM, "seen", True)
    assert canceled.exit_code == ExitCode.TERMINATED
    cases = {(c.classname, c.name): c for c in junit.host_cases(canceled)}
    assert cases[("a", "host stack")].status == "failed"
    assert "ended before this host's play" in cases[("a", "host stack")].message
    from gpustack.k8s.cluster.flow import _host_problem

    assert _host_problem(canceled, "a") == (
        "host stack not ready: the run ended before the host play did"
    )


def test_a_canceled_run_after_the_recap_stops_no_host():
    t = RunTracker(["a"])
    t.handle(ev("runner_on_ok", "a", res={}))
    t.handle({"event": "playbook_on_stats", "event_data": {"ok": {"a": 1}}})
    t.ended()
    assert t.hosts["a"].status == "ok"


def test_a_run_whose_playbook_died_stops_the_hosts_it_had_started():
    """ansible-playbook killed (OOM, a crash) before its recap: not "1 ok" with exit 1."""
    t = RunTracker(["a"])
    t.handle(ev("runner_on_ok", "a", res={"changed": True}))
    t.ended()
    died = result(t, "failed", -9)
    assert t.hosts["a"].status == "stopped" and died.summary()["ok"] == 0
    assert died.exit_code == ExitCode.HOST_FAILED


def test_host_never_reached_is_not_reported_ok():
    t = RunTracker(["a"])
    assert t.hosts["a"].status == "not run"
    assert result(t, "failed", 1).exit_code == ExitCode.HOST_FAILED


def test_notes_a_role_publishes_are_printed_under_the_run_table(capsys):
    """gpustack_notes: what a role left undone on purpose (the driver role on a host without
    systemd) is said under the table, per host, not only in --output json."""
    from gpustack.terminal import output

    t = RunTracker(["a", "b"])
    note = "nvidia-persistenced not enabled or started by gpustack: the host does not run systemd"
    t.handle(ev("runner_on_start", "a"))
    t.handle(ev("runner_on_ok", "a", res={"ansible_facts": {"gpustack_notes": [note]}}))
    t.handle(ev("runner_on_start", "b"))
    t.handle(ev("runner_on_ok", "b", res={}))
    output.print_run(result(t))
    out = " ".join(capsys.readouterr().out.split())
    assert f"a: {note}" in out
    assert out.count(note) == 1  # host b published none
