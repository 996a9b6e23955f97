"""benchmarks/round_trip_cost.py: the playbooks it times and the task counts it applies costs to."""

from __future__ import annotations

import yaml

from benchmarks import round_trip_cost, run_profile
from tests.unit.test_run_profile import _event


def test_playbooks_have_the_task_counts_the_per_task_cost_divides_by(tmp_path):
    books = round_trip_cost.playbooks(tmp_path)
    assert set(books) == {"empty", "remote", "controller", "loop"}
    tasks = {name: yaml.safe_load(path.read_text())[0]["tasks"] for name, path in books.items()}
    assert tasks["empty"] == []
    assert len(tasks["remote"]) == len(tasks["controller"]) == round_trip_cost.TASKS
    assert all("ansible.builtin.command" in t for t in tasks["remote"])
    assert all("ansible.builtin.set_fact" in t for t in tasks["controller"])
    (loop,) = tasks["loop"]
    assert len(loop["loop"]) == round_trip_cost.TASKS


def test_counts_are_per_host_module_calls_and_controller_tasks_that_ran(tmp_path):
    events = tmp_path / "job_events"
    events.mkdir()
    rows = [
        ("a", "probe", "gpustack.gpustack.gpustack_host_probe", 0, 1),
        ("b", "probe", "gpustack.gpustack.gpustack_host_probe", 0, 1),
        ("a", "decide", "ansible.builtin.set_fact", 1, 2),
        ("b", "decide", "ansible.builtin.set_fact", 1, 2),
        ("a", "install", run_profile.APT, 2, 5),
        ("b", "install", run_profile.APT, 2, 6),
        ("a", "check", "ansible.builtin.assert", 6, 7),
    ]
    for number, (host, task, action, start, end) in enumerate(rows):
        _event(events, number, host, task, action, start, end)
    _event(events, 99, "b", "check", "ansible.builtin.assert", 6, 7, kind="runner_on_skipped")
    # 2 module calls on each host; set_fact on both, the assert on a only (skipped on b): 3 / 2
    assert round_trip_cost.counts(tmp_path) == (2.0, 1.5)
