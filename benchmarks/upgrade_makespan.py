"""Rolling-upgrade makespan and capacity on a simulated 200-node fleet.

A discrete-event simulation that drives the REAL orchestrator loop and planner
(gpustack.upgrade.orchestrator / planner) with `SimulatedExecutor`: every node walks the real
state machine; only the fleet is simulated — a backend that records cordon/uncordon instants and
a host upgrader that spends virtual time instead of running Ansible.

Figures per scenario:
- makespan / (ceil(N/k) * t): how close rolling gets to the ideal of ceil(N/k) full rounds
  (k = min(max-unavailable, max-parallel); target <= 1.05, with a uniform or a jittered t);
  With jittered t the ideal is not reachable by any scheduler that does not know durations in
  advance; "vs LB" compares with max(sum(t_i)/k, max t_i), a bound no schedule beats;
- the minimum schedulable GPU capacity over the run, against the bound (N - k) * GPUs per node.

Ordering at equal instants: the orchestrator starts a node only after collecting the nodes that
finished (uncordoned) at that instant, so uncordons at time T are applied before cordons at T.

Run: python benchmarks/upgrade_makespan.py   (exit 1 if a target is missed)
"""

from __future__ import annotations

import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpustack.upgrade.backend import HostOutcome, NodeCondition, StepOptions
from gpustack.upgrade.orchestrator import Orchestrator, RolloutPolicy
from gpustack.upgrade.planner import Limits
from gpustack.upgrade.runtime import SimulatedExecutor
from gpustack.upgrade.state import MemoryStateStore, NodeRecord, Target, UpgradeRun

VERSION = "580.95.05-1"
GPUS_PER_NODE = 8
EVICT_S, VALIDATE_S = 30.0, 60.0  # of each node's t; the host upgrade takes the rest


class SimulatedFleet:
    """Simulated cluster backend: cordon state per node and a timeline of capacity changes."""

    mode = "simulated"

    def __init__(self, names, durations, admin_cordoned=()):
        self.cordoned = {n: n in admin_cordoned for n in names}
        self.durations = durations
        self.events: list[tuple[float, int, str]] = []  # (time, +1 uncordon / -1 cordon, node)

    def conditions(self, names):
        return {n: NodeCondition(cordoned=self.cordoned[n]) for n in names}

    def record_state(self, name, state, reason="", admin_cordoned=False):
        pass

    def cordon(self, name, clock, opts):
        if not self.cordoned[name]:
            self.cordoned[name] = True
            self.events.append((clock.now(), -1, name))
        return "cordoned"

    def wait_for_jobs(self, name, clock, opts):
        return ""

    def evict_gpu_pods(self, name, clock, opts):
        clock.sleep(EVICT_S)
        return "evicted"

    def drain(self, name, clock, opts):
        return ""

    def validate(self, name, clock, opts):
        clock.sleep(VALIDATE_S)
        return "validated"

    def uncordon(self, name, clock, opts):
        self.cordoned[name] = False
        self.events.append((clock.now(), +1, name))
        return "uncordoned"

    def upgrade_host(self, name, cancel, clock):
        clock.sleep(self.durations[name] - EVICT_S - VALIDATE_S)
        return HostOutcome(
            ok=True,
            driver={"installed_version": VERSION, "held": True, "state": f"loaded {VERSION}"},
        )

    def min_capacity(self, total_nodes: int) -> int:
        schedulable = sum(1 for c in self.cordoned.values() if not c)  # at the end
        schedulable += sum(1 for _, delta, _ in self.events if delta < 0)  # undo the run
        schedulable -= sum(1 for _, delta, _ in self.events if delta > 0)
        lowest = schedulable
        for _, delta, _ in sorted(self.events, key=lambda e: (e[0], -e[1])):
            schedulable += delta
            lowest = min(lowest, schedulable)
        return lowest * GPUS_PER_NODE


@dataclass
class Scenario:
    name: str
    nodes: int = 200
    t: float = 600.0
    k: int = 10
    parallel: int | None = None  # default: k
    jitter: float = 0.0  # t varies uniformly by +-jitter
    admin_cordoned: int = 0
    gated: bool = True  # the makespan target applies


def simulate(sc: Scenario) -> dict:
    rng = random.Random(42)
    names = [f"gpu{i:03d}" for i in range(sc.nodes)]
    durations = {n: sc.t * (1 + rng.uniform(-sc.jitter, sc.jitter)) for n in names}
    admin = set(names[len(names) - sc.admin_cordoned :])
    fleet = SimulatedFleet(names, durations, admin)
    run = UpgradeRun(inventory="simulated", target=Target(version=VERSION), mode=fleet.mode)
    run.nodes = {n: NodeRecord(n) for n in names}
    executor = SimulatedExecutor()
    policy = RolloutPolicy(
        limits=Limits(sc.k, sc.parallel or sc.k), steps=StepOptions(), assume_yes=True
    )
    orch = Orchestrator(
        run, names, MemoryStateStore(run), fleet, fleet.upgrade_host, policy, executor
    )
    result = orch.execute()
    assert result.status == "done", result
    assert all(r.state == "upgrade-done" for r in run.nodes.values())
    makespan = executor.clock.now()
    width = min(sc.k, sc.parallel or sc.k)  # nodes that may be upgrading at once
    ideal = math.ceil(sc.nodes / width) * sc.t
    return {
        "makespan": makespan,
        "ideal": ideal,
        "ratio": makespan / ideal,
        # No schedule of these durations on `width` slots can beat this bound.
        "lower_bound": max(sum(durations.values()) / width, max(durations.values())),
        "min_capacity": fleet.min_capacity(sc.nodes),
        "bound": (sc.nodes - sc.k) * GPUS_PER_NODE,
        "batches": len(run.batches),
    }


SCENARIOS = [
    Scenario("k=1 (upstream default)", k=1),
    Scenario("k=10", k=10),
    Scenario("k=25% (50)", k=50),
    Scenario("k=16, N/k not whole", k=16),
    Scenario("k=10, max-parallel 5", k=10, parallel=5),
    Scenario("k=10, t +-20%", k=10, jitter=0.2, gated=False),
    Scenario("k=50, t +-20%", k=50, jitter=0.2, gated=False),
    Scenario("k=10, 3 nodes admin-cordoned", k=10, admin_cordoned=3, gated=False),
]


def main() -> int:
    missed = []
    head = ("scenario", "N", "k", "par", "t/s", "makespan/s", "ceil(N/k)*t", "ratio", "vs LB",
            "min GPUs", "(N-k)*8")  # fmt: skip
    widths = (32, 4, 3, 3, 5, 11, 11, 6, 6, 8, 7)
    cells = [head[0].ljust(widths[0])] + [
        h.rjust(w) for h, w in zip(head[1:], widths[1:], strict=True)
    ]
    print(" ".join(cells))
    for sc in SCENARIOS:
        r = simulate(sc)
        note = (
            ""
            if sc.gated
            else "  (t varies: ratio informative)"
            if sc.jitter
            else "  (informative)"
        )
        print(f"{sc.name:32} {sc.nodes:>4} {sc.k:>3} {sc.parallel or sc.k:>3} {sc.t:>5.0f} "
              f"{r['makespan']:>11.0f} {r['ideal']:>11.0f} {r['ratio']:>6.3f} "
              f"{r['makespan'] / r['lower_bound']:>6.3f} {r['min_capacity']:>8} {r['bound']:>7}"
              f"{note}")  # fmt: skip
        if sc.gated and r["ratio"] > 1.05:
            missed.append(f"{sc.name}: ratio {r['ratio']:.3f} > 1.05")
        if r["min_capacity"] < r["bound"]:
            missed.append(f"{sc.name}: capacity {r['min_capacity']} < {r['bound']}")
    if missed:
        print("TARGETS MISSED:\n  " + "\n  ".join(missed))
        return 1
    print("targets met: ratio <= 1.05, capacity never below (N - k) * 8 GPUs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
