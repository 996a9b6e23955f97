"""benchmarks/run_profile.py: per-task spans and the per-host package path from job events."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest

from benchmarks import run_profile

T0 = datetime(2026, 11, 26, 12, 0, 0)


def _event(directory, number, host, task, action, start, end, kind="runner_on_ok"):
    stamp = (T0 + timedelta(seconds=end)).isoformat()
    event = {
        "event": kind,
        "created": stamp,
        "event_data": {
            "host": host,
            "task": task,
            "task_uuid": task,
            "task_action": action,
            "start": (T0 + timedelta(seconds=start)).isoformat(),
            "end": stamp,
        },
    }
    (directory / f"{number}.json").write_text(json.dumps(event), encoding="utf-8")


@pytest.fixture
def run(tmp_path):
    """Two hosts; the second waits for the first on the package lock (apt 2-6 on a, 2-10 on b);
    a lists refresh (gpustack_apt_lists) counts as apt work."""
    events = tmp_path / "job_events"
    events.mkdir()
    start = {"event": "playbook_on_start", "created": T0.isoformat(), "event_data": {}}
    (events / "0-start.json").write_text(json.dumps(start), encoding="utf-8")
    rows = [
        ("a", "probe", "gpustack.gpustack.gpustack_host_probe", 0, 2),
        ("b", "probe", "gpustack.gpustack.gpustack_host_probe", 0, 2),
        ("a", "install", run_profile.APT, 2, 6),
        ("b", "install", run_profile.APT, 2, 10),
        ("a", "configure", "ansible.builtin.command", 10, 11),
        ("b", "configure", "ansible.builtin.command", 10, 12),
        ("a", "toolkit", "gpustack.gpustack.gpustack_apt_lists", 12, 13),
        ("b", "toolkit", "gpustack.gpustack.gpustack_apt_lists", 12, 14),
        ("a", "verify", "ansible.builtin.command", 14, 15),
        ("b", "verify", "ansible.builtin.command", 14, 16),
    ]
    for number, (host, task, action, start, end) in enumerate(rows):
        _event(events, number, host, task, action, start, end)
    _event(events, 99, "a", "skipped apt", run_profile.APT, 15, 16, kind="runner_on_skipped")
    return tmp_path


def test_package_path_splits_each_host_around_its_apt_tasks(run):
    tasks, first, last = run_profile.load(run)
    path = run_profile.package_path(tasks, first, last)
    # a: 2 s before, 4 + 1 s in apt, 3 s after its last (13 -> 16, the run's end: a skipped
    # task is no host's apt time); b: its wait for the lock counts as apt time.
    assert path["a"] == pytest.approx((2.0, 5.0, 3.0))
    assert path["b"] == pytest.approx((2.0, 10.0, 2.0))


def test_report_prints_the_path_and_returns_the_apt_wall(run, capsys):
    apt_wall = run_profile.report(run, top=3)
    out = capsys.readouterr().out
    # 2-10, 12-14 and the skipped task's 15-16 (a skipped task's span counts in the task table)
    assert apt_wall == pytest.approx(8.0 + 2.0 + 1.0)
    assert "b: 2.0 s before its first apt task, 10.0 s in apt tasks" in out
    assert "2.0 s in other tasks between them, 2.0 s after its last" in out


def test_the_transaction_calls_steps_are_reported_per_host(run, capsys):
    """gpustack_apt_install's RV steps (a background transaction's come with the join; the
    start call has none): per host, and when apt-get began after the run's first event."""
    base = T0.timestamp()
    steps = [["mask", base + 2.0, base + 2.5], ["apt-get", base + 2.5, base + 9.5],
             ["enable", base + 9.5, base + 9.75]]  # fmt: skip
    path = run / "job_events" / "50.json"
    event = {"event": "runner_on_ok", "created": (T0 + timedelta(seconds=10)).isoformat(),
             "event_data": {"host": "b", "task": "join", "task_uuid": "join",
                            "task_action": "gpustack.gpustack.gpustack_apt_install",
                            "start": (T0 + timedelta(seconds=3)).isoformat(),
                            "end": (T0 + timedelta(seconds=10)).isoformat(),
                            "res": {"changed": True, "steps": steps}}}  # fmt: skip
    path.write_text(json.dumps(event), encoding="utf-8")
    tasks, _, _ = run_profile.load(run)
    assert run_profile.transaction_steps(tasks) == {"b": steps}
    run_profile.report(run, top=1)
    out = capsys.readouterr().out
    assert "b: the transaction call's steps (s): mask 0.50, apt-get 7.00, enable 0.25; " in out
    assert "apt-get began 2.5 s after the first event" in out
