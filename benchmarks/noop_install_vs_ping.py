"""Benchmark: a no-op `gpustack install` re-run vs. `ansible -m ping` over the same 3 nodes.

Brings up its own lab (`fleetbench`, 3 Debian 12 nodes with Debian's containerd and the
stand-in toolkit repository of tests/fixtures/lab_fixtures.py), installs once, then times
`gpustack install` again (nothing to change) and `ansible -m ping` on the same inventory, each
`--repeat` times after one warm-up, and prints the medians and their ratio (target <= 6); then
the same re-run with `--full` (no converged-host fast path) for comparison.
The lab is torn down at the end (--keep leaves it up).

    python benchmarks/noop_install_vs_ping.py [--repeat 3] [--keep] [--lab NAME]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.fixtures import lab_fixtures  # noqa: E402

LAB = "fleetbench"
GPUSTACK = [sys.executable, "-m", "gpustack"]
ANSIBLE = str(Path(sys.executable).parent / "ansible")


def run(args: list[str], timeout: int = 3600) -> tuple[float, subprocess.CompletedProcess]:
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=timeout)
    return time.perf_counter() - start, proc


def must(proc: subprocess.CompletedProcess, what: str) -> None:
    if proc.returncode != 0:
        sys.exit(
            f"{what} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="leave the lab up")
    parser.add_argument("--lab", default=LAB, help=f"lab name (default {LAB})")
    args = parser.parse_args()
    lab = args.lab
    inventory = Path(f"/tmp/gpustack-{lab}.ini")
    varsfile = inventory.with_suffix(".vars.json")
    try:
        _, proc = run([*GPUSTACK, "lab", "up", "--name", lab, "--nodes", "3", "--os", "debian12",
                       "--inventory", str(inventory)])  # fmt: skip
        must(proc, "lab up")
        containers = [f"gpustack-{lab}-node{i}" for i in (1, 2, 3)]
        lab_fixtures.prepare(containers, varsfile)
        install = [*GPUSTACK, "install", str(inventory), "-e", f"@{varsfile}", "--output", "json"]
        first, proc = run(install)
        must(proc, "first install")
        print(f"first install: {first:.1f} s")
        ping = [ANSIBLE, "-i", str(inventory), "gpu_nodes", "-m", "ansible.builtin.ping"]
        for command, what in ((install, "warm-up install"), (ping, "warm-up ping")):
            must(run(command)[1], what)
        installs, pings = [], []
        for _ in range(args.repeat):
            seconds, proc = run(install)
            must(proc, "no-op install")
            doc = json.loads(proc.stdout)
            if doc["summary"]["changed"]:
                sys.exit(f"the re-run was not a no-op: {doc['summary']['changed']} change(s)")
            skipped = sum(1 for h in doc["hosts"].values() if h.get("converged"))
            installs.append(seconds)
            seconds, proc = run(ping)
            must(proc, "ansible -m ping")
            pings.append(seconds)
        install_s, ping_s = statistics.median(installs), statistics.median(pings)
        ratio = install_s / ping_s
        print(
            f"no-op install: median {install_s:.2f} s ({', '.join(f'{s:.2f}' for s in installs)})"
        )
        print(f"ansible -m ping: median {ping_s:.2f} s ({', '.join(f'{s:.2f}' for s in pings)})")
        print(f"ratio install/ping: {ratio:.1f} (target <= 6: {'met' if ratio <= 6 else 'MISSED'})")
        print(f"hosts skipped by the converged-host fast path: {skipped} of {len(doc['hosts'])}")
        fulls = []
        for _ in range(args.repeat):
            seconds, proc = run([*install, "--full"])
            must(proc, "install --full")
            fulls.append(seconds)
        print(
            f"install --full (whole play, no fast path): median {statistics.median(fulls):.2f} s "
            f"({', '.join(f'{s:.2f}' for s in fulls)})"
        )
        return 0
    finally:
        if not args.keep:
            subprocess.run([*GPUSTACK, "lab", "down", "--name", lab], capture_output=True, cwd=ROOT)


if __name__ == "__main__":
    raise SystemExit(main())
