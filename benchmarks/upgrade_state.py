"""Benchmark: what recording one upgrade transition costs, against the fleet's size.

The orchestrator makes every transition durable before it goes on, under its lock (the other
nodes' threads wait). Two ways of recording, both with FileStateStore on this machine's disk, on
a run half-way through (4 transitions per node in its history):

- rewrite: the whole record written again (tmp file, fsync, rename) after every transition, as
  gpustack did until 2026-11-27: O(N) per transition;
- journal: the transition appended to the journal (one fsynced line), folded into a snapshot once
  the journal has grown to the snapshot's size: O(1) amortised.

Prints milliseconds per transition for each (the journal's over half an upgrade's transitions,
its folds into snapshots included), their ratio, and what a whole upgrade would spend recording
(about 9 transitions per node) at that size. Figures: docs/performance.md.

    python benchmarks/upgrade_state.py [--nodes 100 1000 10000] [--transitions 200]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpustack.upgrade.state import FileStateStore, NodeRecord, Target, Transition, UpgradeRun

PER_NODE = 9  # transitions a node makes in a whole upgrade (upgrade-required .. upgrade-done)


def half_way(n: int) -> UpgradeRun:
    run = UpgradeRun(inventory="/fleet.ini", target=Target(version="535.309.01-0+deb12u1"),
                     mode="kubernetes")  # fmt: skip
    for i in range(n):
        name = f"gpu-node-{i:05d}"
        run.nodes[name] = NodeRecord(
            name, state="drain-required", attempts=1, started_at=time.time(),
            driver={"installed_version": "535.261.03-1", "held": True, "state": "loaded"},
            artifacts=f"/var/lib/gpustack/artifacts/{name}",
        )  # fmt: skip
        for to in ("cordon-required", "wait-for-jobs-required", "pod-deletion-required",
                   "drain-required"):  # fmt: skip
            run.history.append(Transition(name, "upgrade-required", to, time.time(), "note"))
    return run


def per_transition(n: int, count: int, journal: bool) -> float:
    """Seconds per recorded transition, `count` transitions on a half-way run of n nodes."""
    run = half_way(n)
    names = list(run.nodes)
    with tempfile.TemporaryDirectory() as tmp:
        store = FileStateStore(Path(tmp) / "state.json")
        store.save(run)
        start = time.perf_counter()
        for i in range(count):
            name = names[i % n]
            run.history.append(Transition(name, "drain-required", "pod-restart-required", 0.0))
            run.nodes[name].state = "pod-restart-required"
            store.save(run, nodes=[name] if journal else None)  # None: a snapshot
        return (time.perf_counter() - start) / count


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--transitions", type=int, default=200)
    args = parser.parse_args()
    print(f"{'nodes':>6} | {'rewrite ms':>10} | {'journal ms':>10} | {'ratio':>7} | "
          f"{'whole upgrade: rewrite':>22} | {'journal':>8}")  # fmt: skip
    for n in args.nodes:
        # the rewrite grows with n: fewer samples keep the run short (at least 10)
        rewrite = per_transition(n, max(10, min(args.transitions, 200_000 // n)), journal=False)
        # the journal: as many transitions as half an upgrade makes, so that its folds into new
        # snapshots (one per snapshot's size of journal) are in the figure
        journal = per_transition(n, max(args.transitions, min(4 * n, 40_000)), journal=True)
        total = n * PER_NODE
        print(f"{n:>6} | {rewrite * 1000:>10.2f} | {journal * 1000:>10.2f} | "
              f"{rewrite / journal:>6.1f}x | {rewrite * total:>20.0f} s | "
              f"{journal * total:>6.0f} s")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
