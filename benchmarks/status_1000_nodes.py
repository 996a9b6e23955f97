"""Benchmark: the Kubernetes side of `gpustack status` over 1000 emulated nodes.

Starts the API emulator (tests/cluster/emulator/) on 127.0.0.1 with 1000 GPU nodes (SIMULATED
hardware) running gpustack's device plugin DaemonSet (one pod per node, from the emulated
DaemonSet controller and kubelet), then times what `status` does with a kubeconfig: connect and
GET /version, NFD's API discovery, list the nodes and the device plugin pods (pages of 500),
map them to the 1000 inventory hosts. Prints the time and the API calls served. Target: <= 2 s.

    python benchmarks/status_1000_nodes.py [--nodes 1000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpustack.cluster import status as cluster_status
from gpustack.inventory import load_inventory
from tests.cluster.emulator import EmulatorThread
from tests.cluster.status_helpers import gpu_node, install_device_plugin


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    thread = EmulatorThread().start()
    try:
        em = thread.emulator
        names = [f"gpu{i:04d}" for i in range(args.nodes)]
        for name in names:
            gpu_node(em, name, 8)
        install_device_plugin(em)
        tmp = Path(tempfile.mkdtemp(prefix="gpustack-bench-"))
        kubeconfig = thread.write_kubeconfig(tmp / "kubeconfig")
        inv = tmp / "inventory.ini"
        inv.write_text("[gpu_nodes]\n" + "\n".join(names) + "\n")
        inventory = load_inventory(inv)
        times, calls = [], []
        for _ in range(args.repeat):
            before = em.count()
            start = time.perf_counter()
            session = cluster_status.prepare(str(kubeconfig), inventory, {})
            views = cluster_status.read_nodes(session)
            times.append(time.perf_counter() - start)
            calls.append(em.count() - before)
            assert len(views) == args.nodes and all(
                v["device_plugin_ready"] for v in views.values()
            )
        median = statistics.median(times)
        print(f"nodes: {args.nodes}")
        print(f"status Kubernetes read: median {median:.3f} s over {args.repeat} runs "
              f"(min {min(times):.3f} s, max {max(times):.3f} s)")  # fmt: skip
        print(f"API calls per status: {calls[-1]} (GET /version, NFD discovery, nodes and device "
              f"plugin pods in pages of {cluster_status.PAGE})")  # fmt: skip
        print(f"target <= 2 s: {'met' if median <= 2 else 'MISSED'}")
        return 0 if median <= 2 else 1
    finally:
        thread.stop()


if __name__ == "__main__":
    raise SystemExit(main())
