"""Rolling slot filling: the real orchestrator and planner against a simulated fleet.

`SimFleet` is a TEST DOUBLE for the cluster: it keeps each node's cordon and Ready state and a
timeline of every change, so the tests can check the capacity at every instant. Node upgrades
spend virtual time (SimulatedExecutor) or, where threads matter, real time (ThreadExecutor).
"""

from __future__ import annotations

import random
import threading
from pathlib import Path

import pytest

from gpustack.upgrade.backend import HostOnlyBackend, HostOutcome, NodeCondition, StepOptions
from gpustack.upgrade.executors import SimulatedExecutor, ThreadExecutor
from gpustack.upgrade.orchestrator import Orchestrator, RolloutPolicy
from gpustack.upgrade.planner import Limits, NodeView, plan_batches, select_batch
from gpustack.upgrade.session import open_run
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
TARGET = Target(version=NEW)


class SimFleet:
    """Test double for the cluster backend, in virtual time: cordons, Ready, failures."""

    mode = "simulated"

    def __init__(self, durations, *, cordoned=(), not_ready=(), fail=()):
        self.durations = dict(durations)
        self.cordoned = {n: n in cordoned for n in durations}
        self.ready = {n: n not in not_ready for n in durations}
        self.fail = set(fail)
        self.timeline: list[tuple[float, int, str]] = []  # (time, +1 back / -1 out, node)
        self.starts: dict[str, float] = {}

    def out_of_service(self) -> int:
        return sum(1 for n in self.durations if self.cordoned[n] or not self.ready[n])

    def conditions(self, names):
        return {n: NodeCondition(cordoned=self.cordoned[n], ready=self.ready[n]) for n in names}

    def record_state(self, name, state, reason="", admin_cordoned=False):
        pass

    def cordon(self, name, clock, opts):
        self.starts[name] = clock.now()
        if not self.cordoned[name]:
            self.cordoned[name] = True
            if self.ready[name]:
                self.timeline.append((clock.now(), -1, name))
        return "cordoned"

    def wait_for_jobs(self, name, clock, opts):
        return ""

    def evict_gpu_pods(self, name, clock, opts):
        return ""

    def drain(self, name, clock, opts):
        return ""

    def pause_gpu_clients(self, name, clock, opts):
        return ""

    def resume_gpu_clients(self, name):
        return ""

    def validate(self, name, clock, opts, driver=None):
        return "validated"

    def uncordon(self, name, clock, opts):
        self.cordoned[name] = False
        if self.ready[name]:
            self.timeline.append((clock.now(), +1, name))
        return "uncordoned"

    def upgrade_host(self, name, cancel, clock):
        clock.sleep(self.durations[name])
        if name in self.fail:
            return HostOutcome(ok=False, reason="E: broken on purpose")
        # The node rebooted into the new driver: Ready again, whatever it was before.
        if not self.ready[name]:
            self.ready[name] = True
            if not self.cordoned[name]:
                self.timeline.append((clock.now(), +1, name))
        return HostOutcome(ok=True, driver={"installed_version": NEW, "held": True,
                                            "state": f"loaded {NEW}"})  # fmt: skip

    def peak_out_of_service(self, initially: int) -> int:
        """The most nodes out of service at any instant (back-in-service first at a tie)."""
        level = peak = initially
        for _, delta, _ in sorted(self.timeline, key=lambda e: (e[0], -e[1])):
            level -= delta
            peak = max(peak, level)
        return peak


def new_run(names, durations=None) -> UpgradeRun:
    run = UpgradeRun(inventory="/inv.ini", target=TARGET, mode="simulated")
    run.nodes = {n: NodeRecord(n) for n in names}
    run.durations = dict(durations or {})
    return run


def simulate(fleet: SimFleet, limits: Limits, run=None, **policy):
    names = list(fleet.durations)
    run = run or new_run(names)
    executor = SimulatedExecutor()
    orch = Orchestrator(run, names, MemoryStateStore(run), fleet, fleet.upgrade_host,
                        RolloutPolicy(limits=limits, **policy), executor)  # fmt: skip
    result = orch.execute()
    return result, run, executor.clock.now()


def names_of(count: int) -> list[str]:
    return [f"n{i:02d}" for i in range(count)]


def test_one_slow_node_does_not_hold_back_the_others():
    names = names_of(12)
    durations = {n: 100.0 for n in names} | {"n00": 1000.0}
    fleet = SimFleet(durations)
    result, _, makespan = simulate(fleet, Limits(3, 3))
    assert result.status == "done"
    # While n00 takes 1000 s, the two other slots upgrade the 11 others, 100 s each: in
    # batches n00 would hold its two companions' slots and the rollout would need 1300 s.
    assert makespan == pytest.approx(1000.0)
    assert fleet.starts["n03"] == pytest.approx(100.0)  # the first slot to free is refilled
    assert max(fleet.starts.values()) == pytest.approx(500.0)
    assert fleet.peak_out_of_service(0) == 3


def test_threads_refill_a_slot_while_a_slow_node_is_still_upgrading():
    run = new_run(["node1", "node2", "node3", "node4"])
    upgrader = FakeHostUpgrader(durations={"node1": 0.8}, duration=0.05)
    orch = Orchestrator(run, list(run.nodes), MemoryStateStore(run), HostOnlyBackend(), upgrader,
                        RolloutPolicy(limits=Limits(2, 2), steps=StepOptions(poll=0.01)),
                        ThreadExecutor(2, poll=0.01))  # fmt: skip
    assert orch.execute().status == "done"
    spans = {n: s[0] for n, s in in_progress_intervals(run.history).items()}
    assert spans["node3"][0] < spans["node1"][1] and spans["node4"][0] < spans["node1"][1]
    assert upgrader.max_active == 2


@pytest.mark.parametrize("seed", range(20))
def test_capacity_never_below_n_minus_k_at_any_instant(seed):
    rng = random.Random(seed)
    names = names_of(rng.randint(5, 40))
    k = rng.randint(1, 6)
    down = set(rng.sample(names, rng.randint(0, min(3, k - 1))))  # already out of service
    admin = {n for n in down if rng.random() < 0.5}
    durations = {n: rng.choice([100.0, 130.0, 400.0]) * rng.uniform(0.8, 1.2) for n in names}
    fail = set(rng.sample(names, rng.randint(0, 2)))
    fleet = SimFleet(durations, cordoned=admin, not_ready=down - admin, fail=fail)
    limits = Limits(k, rng.randint(1, k + 2))
    history = {n: rng.uniform(50, 500) for n in names if rng.random() < 0.7}
    result, run, _ = simulate(fleet, limits, run=new_run(names, history), max_failures=1)
    assert result.status in ("done", "failed", "blocked")
    # Out of service at once: never more than max-unavailable (N - k of N stay schedulable),
    # counting the nodes that were down before, the failed ones (they stay cordoned) and the
    # admin-cordoned ones (they stay cordoned after their upgrade).
    assert fleet.peak_out_of_service(len(down)) <= k
    spans = in_progress_intervals(run.history)
    starts = sorted((s, 1) for v in spans.values() for s, _ in v)
    ends = sorted((e, -1) for v in spans.values() for _, e in v)
    level = 0
    for _, delta in sorted(starts + ends, key=lambda e: (e[0], e[1])):
        level += delta
        assert level <= limits.max_parallel
    assert all(run.nodes[n].state == "upgrade-failed" for n in fail if n in spans)
    for name in admin:
        assert fleet.cordoned[name], "an admin-cordoned node stays cordoned"


def test_longest_measured_first_and_unmeasured_before_measured():
    names = names_of(6)
    durations = {n: 100.0 for n in names}
    run = new_run(names, {"n00": 10.0, "n01": 50.0, "n02": 300.0, "n04": 200.0})
    fleet = SimFleet(durations)
    result, run, _ = simulate(fleet, Limits(1, 1), run=run)
    assert result.status == "done"
    order = sorted(fleet.starts, key=fleet.starts.get)
    assert order == ["n03", "n05", "n02", "n04", "n01", "n00"]


def test_longest_first_shortens_the_end_of_the_rollout():
    # 2 slots; n06 takes 400 s, the others 100 s. In inventory order n06 comes last and runs
    # alone at the end (700 s); measured in the last upgrade, it goes first: 500 s, the bound
    # max(sum/k, max) that no schedule beats.
    names = names_of(7)
    durations = {n: 100.0 for n in names} | {"n06": 400.0}
    _, _, inventory_order = simulate(SimFleet(durations), Limits(2, 2))
    _, _, longest_first = simulate(SimFleet(durations), Limits(2, 2), run=new_run(names, durations))
    assert inventory_order == pytest.approx(700.0)
    assert longest_first == pytest.approx(500.0)


def test_canary_finishes_and_validates_before_any_other_node_starts():
    names = names_of(8)
    durations = {n: 100.0 for n in names} | {"n00": 700.0}
    # The last upgrade measured n05 as the longest: the canary is still the inventory's first.
    run = new_run(names, {n: 100.0 for n in names} | {"n05": 999.0})
    fleet = SimFleet(durations)
    result, run, _ = simulate(fleet, Limits(4, 4), run=run, canary=1, assume_yes=True)
    assert result.status == "done"
    canary_done = next(
        t.at for t in run.history if t.node == "n00" and t.to_state == "upgrade-done"
    )
    validated = [
        t for t in run.history if t.node == "n00" and t.from_state == "validation-required"
    ]
    assert validated and validated[0].at <= canary_done == pytest.approx(700.0)
    others = {n: s for n, s in fleet.starts.items() if n != "n00"}
    assert min(others.values()) >= canary_done
    assert sorted(others, key=others.get)[0] == "n05"  # after the canary: longest first
    assert run.batches[0] == ["n00"] and run.canary_done


def test_a_failing_canary_starts_nothing_else():
    names = names_of(5)
    fleet = SimFleet(dict.fromkeys(names, 100.0), fail={"n00"})
    result, run, _ = simulate(fleet, Limits(3, 3), canary=1, assume_yes=True, max_failures=4)
    assert result.status == "failed" and "canary node n00 failed" in result.message
    assert list(fleet.starts) == ["n00"]
    assert not run.canary_done


def test_failures_halt_mid_stream_and_in_flight_nodes_finish():
    names = names_of(20)
    durations = {n: 100.0 for n in names} | {"n05": 30.0, "n07": 60.0, "n06": 500.0}
    fleet = SimFleet(durations, fail={"n05", "n07"})
    result, run, _ = simulate(fleet, Limits(5, 4), max_failures=1)
    assert result.status == "failed" and result.failed_now == ["n05", "n07"]
    assert "2 node(s) failed (max-failures 1); last: n07" in result.message
    halted_at = next(
        t.at for t in run.history if t.node == "n07" and t.to_state == "upgrade-failed"
    )
    # Nothing starts once the second failure is known; what was in flight finishes.
    assert all(at <= halted_at for at in fleet.starts.values())
    in_flight = [n for n, at in fleet.starts.items() if n not in fleet.fail]
    assert all(run.nodes[n].state == "upgrade-done" for n in in_flight)
    assert run.nodes["n06"].state == "upgrade-done"  # started before the halt, finished after
    # One failure is within max-failures: its slot was refilled (the failed node stays
    # cordoned, so it still counts against max-unavailable 5).
    assert fleet.starts["n08"] == pytest.approx(130.0)
    assert {run.nodes[n].state for n in names if n not in fleet.starts} == {"upgrade-required"}
    assert fleet.cordoned["n05"] and fleet.cordoned["n07"], "failed nodes stay cordoned"


def test_a_node_given_back_by_the_admin_refills_a_slot_without_waiting_for_a_finish():
    """Every pass reads the fleet again while a slot is free (the GPU Operator recomputes its
    free slots on every reconcile): capacity an admin gives back is used at once."""

    class Fleet(HostOnlyBackend):
        def __init__(self):
            self.cordoned = {"node4"}

        def conditions(self, names):
            return {n: NodeCondition(cordoned=n in self.cordoned) for n in names}

    def run_with(refill_every: float):
        run = new_run(["node1", "node2", "node3", "node4"])
        run.nodes["node4"].state = S.DONE.value  # upgraded, still cordoned by the admin
        fleet = Fleet()
        upgrader = FakeHostUpgrader(durations={"node1": 1.0, "node2": 0.05, "node3": 0.05})
        orch = Orchestrator(run, list(run.nodes), MemoryStateStore(run), fleet, upgrader,
                            RolloutPolicy(limits=Limits(2, 2), steps=StepOptions(poll=0.01),
                                          refill_every=refill_every),
                            ThreadExecutor(2, poll=0.01))  # fmt: skip
        threading.Timer(0.2, fleet.cordoned.clear).start()  # the admin uncordons node4
        assert orch.execute().status == "done"
        spans = {n: s[0] for n, s in in_progress_intervals(run.history).items()}
        return spans

    spans = run_with(refill_every=0.05)
    assert spans["node2"][0] < spans["node1"][1], "node2 started while node1 was upgrading"
    spans = run_with(refill_every=3600)  # read only when a node finishes: node2 waits
    assert spans["node2"][0] >= spans["node1"][1]


def test_stop_request_starts_no_new_node_while_others_finish():
    names = names_of(10)
    run = new_run(names)
    holder = {}

    def stop_on(host):
        if host == "n02":
            holder["orch"].request_stop()

    upgrader = FakeHostUpgrader(before=stop_on, durations={"n00": 0.3, "n01": 0.3}, duration=0.05)
    orch = holder["orch"] = Orchestrator(
        run, names, MemoryStateStore(run), HostOnlyBackend(), upgrader,
        RolloutPolicy(limits=Limits(3, 3), steps=StepOptions(poll=0.01), refill_every=0.01),
        ThreadExecutor(3, poll=0.01),
    )  # fmt: skip
    result = orch.execute()
    assert result.status == "interrupted"
    assert sorted(upgrader.calls) == ["n00", "n01", "n02"]
    assert [run.nodes[n].state for n in names[:3]] == ["upgrade-done"] * 3
    assert {run.nodes[n].state for n in names[3:]} == {"upgrade-required"}


def test_durations_are_recorded_and_carried_to_the_next_run(tmp_path):
    names = names_of(4)
    fleet = SimFleet({"n00": 100.0, "n01": 400.0, "n02": 200.0, "n03": 300.0}, fail={"n03"})
    result, first, _ = simulate(fleet, Limits(2, 2), max_failures=1)
    assert result.status == "done"
    store = FileStateStore(tmp_path / "s.json")
    store.save(first)
    first = store.load()
    assert first.durations == {}  # nothing known before the first run
    nxt = open_run(first, inventory=Path("/inv.ini"), target=TARGET,
                   hosts=names, mode="simulated", resume=False, state_file=None)  # fmt: skip
    # Done nodes: from the start of their attempt to upgrade-done; the failed one: unknown.
    assert nxt.durations == pytest.approx({"n00": 100.0, "n01": 400.0, "n02": 200.0})
    assert nxt.history == [] and {r.state for r in nxt.nodes.values()} == {"upgrade-required"}
    # The next measurement is averaged with the earlier one.
    fleet = SimFleet({"n00": 300.0, "n01": 400.0, "n02": 200.0, "n03": 50.0})
    result, second, _ = simulate(fleet, Limits(2, 2), run=nxt)
    assert result.status == "done"
    assert sorted(fleet.starts, key=fleet.starts.get)[:2] == ["n03", "n01"]  # unknown, longest
    assert second.measured_durations() == pytest.approx(
        {"n00": 200.0, "n01": 400.0, "n02": 200.0, "n03": 50.0}
    )
    # A resumed run keeps its figures; the state file holds them.
    store.save(second)
    assert FileStateStore(tmp_path / "s.json").load().durations == second.durations


def test_planner_orders_by_expected_duration_but_keeps_free_nodes_first():
    nodes = [NodeView("a", expected=100.0), NodeView("b", expected=500.0),
             NodeView("c", unavailable=True, expected=1.0), NodeView("d"),
             NodeView("e", expected=300.0)]  # fmt: skip
    assert select_batch(nodes, (), Limits(3, 5)) == ["c", "d", "b"]
    assert select_batch(nodes, (), Limits(3, 5), longest_first=False) == ["c", "a", "b"]
    assert select_batch(nodes, (), Limits(3, 5), cap=1, longest_first=False) == ["c"]
    # The dry-run plan: the canary from the inventory, then longest first.
    plain = [NodeView(v.name, expected=v.expected) for v in nodes]
    assert plan_batches(plain, Limits(2, 2), canary=1) == [["a"], ["d", "b"], ["e", "c"]]


def test_rolling_simulation_matches_list_scheduling_in_inventory_order():
    """With no durations known, a slot takes the next node in inventory order the instant it
    frees: the makespan is exactly that of greedy list scheduling (no batch barrier)."""
    import heapq

    rng = random.Random(7)
    names = names_of(60)
    durations = {n: rng.uniform(60, 600) for n in names}
    _, _, makespan = simulate(SimFleet(durations), Limits(7, 7))
    slots = [0.0] * 7
    for name in names:
        heapq.heappush(slots, heapq.heappop(slots) + durations[name])
    assert makespan == pytest.approx(max(slots))
