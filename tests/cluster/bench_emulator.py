"""Prints how fast the emulator serves a 1000-node list to the real client (a figure, not a test).

python -m tests.cluster.bench_emulator
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from kubernetes import client, config

from tests.cluster.emulator import EmulatorThread


def main(nodes: int = 1000, rounds: int = 5) -> None:
    thread = EmulatorThread().start()
    try:
        thread.emulator.add_nodes(nodes)
        with tempfile.TemporaryDirectory() as tmp:
            api = config.new_client_from_config(str(thread.write_kubeconfig(Path(tmp) / "kc")))
            core = client.CoreV1Api(api)
            raw, typed = [], []
            for _ in range(rounds):
                start = time.perf_counter()
                core.list_node(_preload_content=False).read()
                raw.append(time.perf_counter() - start)
                start = time.perf_counter()
                core.list_node()
                typed.append(time.perf_counter() - start)
            api.close()
        print(f"{nodes} nodes: raw JSON list {min(raw) * 1000:.1f} ms, typed client list "
              f"{min(typed) * 1000:.1f} ms (best of {rounds})")  # fmt: skip
    finally:
        thread.stop()


if __name__ == "__main__":
    main()
