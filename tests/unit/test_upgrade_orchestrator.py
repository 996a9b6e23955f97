"""The upgrade loop on a host-only fleet with a test-double host upgrader (no hosts touched)."""

from __future__ import annotations

import itertools
import json
import threading

import pytest

from gpustack.upgrade.backend import HostOnlyBackend, HostOutcome, StepOptions
from gpustack.upgrade.executors import SimulatedExecutor, ThreadExecutor
from gpustack.upgrade.orchestrator import Orchestrator, RolloutPolicy, check_host
from gpustack.upgrade.planner import Limits
from gpustack.upgrade.state import (
    FileStateStore,
    MemoryStateStore,
    NodeRecord,
    Target,
    UpgradeRun,
    UpgradeState,
)
from tests.upgrade_doubles import NEW, FakeHostUpgrader, in_progress_intervals

S = UpgradeState
FULL_PATH = [
    "upgrade-required", "cordon-required", "wait-for-jobs-required", "pod-deletion-required",
    "drain-required", "pod-restart-required", "validation-required", "uncordon-required",
    "upgrade-done",
]  # fmt: skip


def new_run(n: int) -> UpgradeRun:
    run = UpgradeRun(inventory="/inv.ini", target=Target(version=NEW), mode="host-only")
    for i in range(1, n + 1):
        run.nodes[f"node{i}"] = NodeRecord(f"node{i}")
    return run


def orchestrate(
    run, upgrader, *, store=None, executor=None, backend=None, **policy
) -> Orchestrator:
    limits = Limits(policy.pop("max_unavailable", 1), policy.pop("max_parallel", 1))
    return Orchestrator(
        run,
        list(run.nodes),
        store or MemoryStateStore(run),
        backend or HostOnlyBackend(),
        upgrader,
        RolloutPolicy(limits=limits, steps=StepOptions(poll=0.01), **policy),
        executor or ThreadExecutor(limits.max_parallel, poll=0.01),
    )


def path_of(run: UpgradeRun, node: str) -> list[str]:
    steps = [t for t in run.history if t.node == node]
    return [steps[0].from_state] + [t.to_state for t in steps]


def assert_one_at_a_time(run: UpgradeRun) -> None:
    spans = sorted(s for spans in in_progress_intervals(run.history).values() for s in spans)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start, spans


def test_host_only_rollout_walks_every_state_one_node_at_a_time(tmp_path):
    run = new_run(3)
    store = FileStateStore(tmp_path / "state.json")
    upgrader = FakeHostUpgrader(duration=0.05)
    result = orchestrate(run, upgrader, store=store).execute()
    assert result.status == "done"
    assert upgrader.calls == ["node1", "node2", "node3"] and upgrader.max_active == 1
    for node in run.nodes.values():
        assert path_of(run, node.name) == FULL_PATH
        assert node.driver == {
            "installed_version": NEW, "held": True,
            "state": "installed, not loaded: no NVIDIA device",
        }  # fmt: skip
    assert_one_at_a_time(run)
    assert run.batches == [["node1"], ["node2"], ["node3"]]
    # No-op steps say so in the history.
    notes = {t.to_state: t.note for t in run.history if t.node == "node1"}
    assert notes["wait-for-jobs-required"] == "no Kubernetes: nothing to cordon"
    # What is on disk (the snapshot and the journal of the transitions since) is the same run.
    saved = FileStateStore(tmp_path / "state.json").load()
    assert saved.to_dict() == run.to_dict()
    assert saved.nodes["node3"].state == "upgrade-done" and len(saved.history) == 3 * 8
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json", "state.json.journal"]
    store.save(run)  # a snapshot folds the journal in
    assert list(tmp_path.iterdir()) == [tmp_path / "state.json"], "no temporary files left"
    assert (
        json.loads((tmp_path / "state.json").read_text())["history"] == saved.to_dict()["history"]
    )


def test_parallel_nodes_respect_max_parallel():
    run = new_run(8)
    upgrader = FakeHostUpgrader(duration=0.05)
    result = orchestrate(run, upgrader, max_unavailable=3, max_parallel=3).execute()
    assert result.status == "done"
    assert upgrader.max_active == 3
    spans = in_progress_intervals(run.history)
    events = sorted([(s, 1) for v in spans.values() for s, _ in v] + [(e, -1) for v in spans.values() for _, e in v])  # fmt: skip
    level = peak = 0
    for _, delta in events:
        level += delta
        peak = max(peak, level)
    assert peak <= 3


def test_a_failed_node_stops_the_rollout_and_keeps_its_reason():
    run = new_run(4)
    upgrader = FakeHostUpgrader(fail={"node2": "Install the driver packages: E: Broken source"})
    result = orchestrate(run, upgrader).execute()
    assert result.status == "failed"
    assert result.failed_now == ["node2"]
    assert "1 node(s) failed (max-failures 0); last: node2" in result.message
    states = {n: r.state for n, r in run.nodes.items()}
    assert states == {"node1": "upgrade-done", "node2": "upgrade-failed",
                      "node3": "upgrade-required", "node4": "upgrade-required"}  # fmt: skip
    assert run.nodes["node2"].reason == "driver role: Install the driver packages: E: Broken source"
    assert path_of(run, "node2")[-2:] == ["pod-restart-required", "upgrade-failed"]


def test_max_failures_tolerates_that_many():
    run = new_run(4)
    # A failed node stays cordoned and so uses one of the two unavailable slots.
    upgrader = FakeHostUpgrader(fail={"node1": "x"})
    result = orchestrate(run, upgrader, max_failures=1, max_unavailable=2).execute()
    assert result.status == "done"
    assert [r.state for r in run.nodes.values()] == ["upgrade-failed"] + ["upgrade-done"] * 3
    run = new_run(4)
    upgrader = FakeHostUpgrader(fail={"node1": "x", "node2": "y"})
    result = orchestrate(run, upgrader, max_failures=1, max_unavailable=3).execute()
    assert result.status == "failed" and upgrader.calls == ["node1", "node2"]


def test_in_flight_nodes_finish_when_another_fails():
    run = new_run(6)
    upgrader = FakeHostUpgrader(fail={"node1": "boom"}, durations={"node2": 0.5})
    result = orchestrate(run, upgrader, max_unavailable=2, max_parallel=2).execute()
    assert result.status == "failed"
    assert run.nodes["node2"].state == "upgrade-done"  # was in flight: finished
    assert {run.nodes[n].state for n in ("node3", "node4", "node5", "node6")} == {
        "upgrade-required"
    }


def test_validation_catches_wrong_version_and_missing_hold():
    run = new_run(2)
    result = orchestrate(
        run, FakeHostUpgrader(wrong_version={"node1": "535.261.03-1"}), max_failures=5,
        max_unavailable=2,
    ).execute()  # fmt: skip
    assert result.status == "done"
    assert run.nodes["node1"].state == "upgrade-failed"
    assert run.nodes["node1"].reason == (
        f"validation: driver 535.261.03-1 after the upgrade, wanted {NEW}"
    )
    run = new_run(1)
    orchestrate(run, FakeHostUpgrader(not_held={"node1"})).execute()
    assert run.nodes["node1"].reason == f"validation: driver {NEW} is installed but not held"


def test_check_host_rules():
    target = Target(version=NEW)
    ok = {"installed_version": NEW, "held": True, "state": "loaded 535.309.01"}
    assert check_host(target, HostOutcome(True, driver=ok)) == ""
    assert "published no gpustack_driver" in check_host(target, HostOutcome(True))
    reboot = {
        **ok,
        "state": "installed, loaded 535.261.03: reboot required",
        "reboot_required": True,
    }
    assert "nvidia_driver_reboot=if_needed" in check_host(target, HostOutcome(True, driver=reboot))
    branch = Target(branch="535")
    assert check_host(branch, HostOutcome(True, driver=ok)) == ""
    assert "wanted newest of branch 550" in check_host(
        Target(branch="550"), HostOutcome(True, driver=ok)
    )


def test_resume_skips_done_nodes_and_continues_interrupted_ones():
    run = new_run(3)
    run.nodes["node1"].state = S.DONE.value
    run.nodes["node1"].attempts = 1
    run.nodes["node2"].state = S.POD_RESTART.value  # a run was aborted while upgrading it
    upgrader = FakeHostUpgrader()
    result = orchestrate(run, upgrader).execute()
    assert result.status == "done"
    assert upgrader.calls == ["node2", "node3"]
    assert run.nodes["node1"].attempts == 1
    assert path_of(run, "node2") == FULL_PATH[5:]
    assert not [t for t in run.history if t.node == "node1"]


def test_failed_nodes_are_retried_only_with_retry_failed():
    run = new_run(2)
    run.nodes["node1"].state = S.FAILED.value
    run.nodes["node1"].reason = "old"
    upgrader = FakeHostUpgrader()
    assert orchestrate(run, upgrader, max_unavailable=2).execute().status == "done"
    assert upgrader.calls == ["node2"] and run.nodes["node1"].state == "upgrade-failed"
    # Retried with max-unavailable 1: the failed node is out of service already, so it may go.
    result = orchestrate(run, upgrader, retry_failed=True).execute()
    assert result.status == "done" and upgrader.calls == ["node2", "node1"]
    assert run.nodes["node1"].state == "upgrade-done" and run.nodes["node1"].reason == ""
    assert path_of(run, "node1")[:2] == ["upgrade-failed", "cordon-required"]


def test_canary_pauses_then_resume_continues_without_a_second_canary():
    run = new_run(5)
    upgrader = FakeHostUpgrader()
    result = orchestrate(run, upgrader, canary=2, max_unavailable=3, max_parallel=3).execute()
    assert result.status == "paused"
    assert run.canary_done and upgrader.calls == ["node1", "node2"]
    assert run.batches == [["node1", "node2"]]
    result = orchestrate(run, upgrader, canary=2, max_unavailable=3, max_parallel=3).execute()
    assert result.status == "done"
    assert run.batches == [["node1", "node2"], ["node3", "node4", "node5"]]


def test_canary_with_yes_or_pause_continues_and_a_failed_canary_halts():
    run = new_run(4)
    result = orchestrate(run, FakeHostUpgrader(), canary=1, assume_yes=True).execute()
    assert result.status == "done" and run.batches[0] == ["node1"]
    run = new_run(3)
    executor = SimulatedExecutor()
    result = orchestrate(run, FakeHostUpgrader(), canary=1, canary_pause=600, executor=executor).execute()  # fmt: skip
    assert result.status == "done" and executor.clock.now() >= 600
    run = new_run(4)
    upgrader = FakeHostUpgrader(fail={"node1": "bad"})
    result = orchestrate(run, upgrader, canary=1, max_failures=3, assume_yes=True).execute()
    assert result.status == "failed" and "canary node node1 failed" in result.message
    assert upgrader.calls == ["node1"]


def test_stop_request_lets_the_current_node_finish_and_starts_no_other():
    run = new_run(3)
    holder = {}

    def signal_during(host):
        if host == "node2":
            holder["orch"].request_stop()  # as a Ctrl-C / SIGTERM arriving now would

    upgrader = FakeHostUpgrader(before=signal_during, duration=0.05)
    orch = holder["orch"] = orchestrate(run, upgrader)
    result = orch.execute()
    assert result.status == "interrupted"
    assert [r.state for r in run.nodes.values()] == ["upgrade-done", "upgrade-done", "upgrade-required"]  # fmt: skip


def test_abort_leaves_the_node_in_its_state_for_resume():
    run = new_run(2)
    holder = {}

    def abort_during(host):
        holder["orch"].request_stop()
        holder["orch"].request_stop()  # the second interrupt aborts nodes in progress

    orch = holder["orch"] = orchestrate(run, FakeHostUpgrader(before=abort_during, duration=5))
    result = orch.execute()
    assert result.status == "interrupted"
    assert run.nodes["node1"].state == "pod-restart-required"
    result = orchestrate(run, FakeHostUpgrader()).execute()
    assert result.status == "done"
    assert path_of(run, "node1")[-4:] == FULL_PATH[-4:]


class PausingBackend(HostOnlyBackend):
    """TEST DOUBLE: records the pause and resume of the GPU clients around the driver role."""

    def __init__(self, calls: list):
        self.calls = calls

    def pause_gpu_clients(self, name, clock, opts):
        self.calls.append(("pause", name))
        return "paused GPU clients (device-plugin)"

    def resume_gpu_clients(self, name):
        self.calls.append(("resume", name))
        return "resumed GPU clients (1)"


def test_the_gpu_clients_are_paused_around_the_driver_role_and_resumed_when_it_fails():
    calls: list = []
    run = new_run(2)
    upgrader = FakeHostUpgrader(fail={"node2": "apt failed"},
                                before=lambda host: calls.append(("driver role", host)))  # fmt: skip
    result = orchestrate(run, upgrader, backend=PausingBackend(calls)).execute()
    assert result.status == "failed"
    assert calls == [(step, node) for node in ("node1", "node2")
                     for step in ("pause", "driver role", "resume")]  # fmt: skip
    note = next(t.note for t in run.history if t.node == "node1" and t.to_state == S.VALIDATION)
    assert note.startswith("paused GPU clients (device-plugin); driver role ran")
    assert note.endswith("; resumed GPU clients (1)")
    assert run.nodes["node2"].reason == "driver role: apt failed"


def test_an_aborted_driver_role_leaves_the_clients_paused_for_the_resumed_run():
    calls: list = []
    run = new_run(1)
    holder = {}

    def abort_during(host):
        holder["orch"].request_stop()
        holder["orch"].request_stop()

    orch = holder["orch"] = orchestrate(run, FakeHostUpgrader(before=abort_during, duration=5),
                                        backend=PausingBackend(calls))  # fmt: skip
    assert orch.execute().status == "interrupted"
    assert calls == [("pause", "node1")]
    result = orchestrate(run, FakeHostUpgrader(), backend=PausingBackend(calls)).execute()
    assert result.status == "done"
    assert calls == [("pause", "node1"), ("pause", "node1"), ("resume", "node1")]


def test_blocked_when_unavailable_budget_is_used_up():
    run = new_run(3)
    run.nodes["node1"].state = S.FAILED.value
    result = orchestrate(run, FakeHostUpgrader()).execute()
    assert result.status == "blocked"
    assert "already unavailable (node1)" in result.message


def test_state_file_round_trip_and_intervals(tmp_path):
    store = FileStateStore(tmp_path / "deep" / "s.json")
    run = new_run(2)
    orchestrate(run, FakeHostUpgrader(), store=store).execute()
    again = FileStateStore(tmp_path / "deep" / "s.json").load()
    assert again.to_dict() == run.to_dict()
    spans = in_progress_intervals(again.history)
    assert set(spans) == {"node1", "node2"}
    assert spans["node1"][0][1] <= spans["node2"][0][0]


def test_unreadable_state_file_is_bad_input(tmp_path):
    from gpustack.errors import BadInput

    (tmp_path / "s.json").write_text("{not json")
    with pytest.raises(BadInput, match="not readable"):
        FileStateStore(tmp_path / "s.json").load()


def test_simulated_executor_runs_the_same_loop_in_virtual_time():
    run = new_run(10)

    executor = SimulatedExecutor()
    orch = orchestrate(
        run, FakeHostUpgrader(), executor=executor, max_unavailable=3, max_parallel=3
    )

    original = orch._step

    def slow_step(name, state, clock, opts):
        if state == S.POD_RESTART:
            clock.sleep(100)
        return original(name, state, clock, opts)

    orch._step = slow_step
    assert orch.execute().status == "done"
    assert executor.clock.now() == pytest.approx(400)  # ceil(10/3) rounds of 100 s
    assert max(len(b) for b in run.batches) <= 3
    spans = in_progress_intervals(run.history)
    assert spans["node1"] == [(0.0, 100.0)] and spans["node10"] == [(300.0, 400.0)]


def test_thread_safety_of_parallel_saves(tmp_path):
    run = new_run(12)
    store = FileStateStore(tmp_path / "s.json")
    barrier = threading.Barrier(4, timeout=5)
    upgrader = FakeHostUpgrader(before=lambda h: barrier.wait() if h in {"node1", "node2", "node3", "node4"} else None)  # fmt: skip
    result = orchestrate(run, upgrader, store=store, max_unavailable=4, max_parallel=4).execute()
    assert result.status == "done"
    assert store.load().to_dict()["nodes"] == run.to_dict()["nodes"]


def test_simulated_200_node_fleet_keeps_capacity_and_rolls_without_gaps():
    """The benchmark's discrete-event simulation, as an invariant check (no timing)."""
    from benchmarks.upgrade_makespan import Scenario, simulate

    for scenario in (Scenario("k=16", k=16), Scenario("jitter", k=10, jitter=0.2),
                     Scenario("admin", k=10, admin_cordoned=3)):  # fmt: skip
        figures = simulate(scenario)
        assert figures["min_capacity"] >= figures["bound"], (scenario, figures)
    assert simulate(Scenario("k=16", k=16))["ratio"] == pytest.approx(1.0)
