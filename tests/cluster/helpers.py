"""Builders for cluster-flow tests: the emulator's nodes with SIMULATED hardware
(tests/cluster/emulator/hardware.py) matching the SIMULATED host facts of tests/builders.py,
which are re-exported here. They stand in for hosts; they prove nothing about real GPUs.
"""

from __future__ import annotations

from tests.builders import (  # noqa: F401 (re-exported: the cluster tests import them from here)
    DRIVER,
    gpu_facts,
    inventory,
    no_gpu_facts,
    run_result,
    smi_output,
    uuids_for,
)
from tests.cluster.emulator import ClusterEmulator, NodeHardware


def gpu_cluster(
    emu: ClusterEmulator,
    gpus: dict[str, int],
    *,
    mig: dict[str, dict[int, list[str]]] | None = None,
    unhealthy: dict[str, int] | None = None,
) -> dict[str, list[str]]:
    """Nodes named like the hosts, with SIMULATED GPUs (the UUIDs of `gpu_facts`), a loaded
    driver and the `nvidia` runtime handler; capacity comes from the emulated device plugin.

    `mig`: host -> {GPU index: [MIG profiles]} puts those GPUs in MIG mode;
    `unhealthy`: host -> how many GPUs fell off the bus (the plugin reports them unhealthy).
    """
    uuids = {host: uuids_for(host, count) for host, count in gpus.items()}
    for host, count in gpus.items():
        hardware = NodeHardware.gpu_node(uuids[host], mig=(mig or {}).get(host)) if count else None
        for gpu in (hardware.gpus if hardware else [])[: (unhealthy or {}).get(host, 0)]:
            gpu.healthy = False
        emu.add_node(host, hardware=hardware)
    return uuids


def verify_pods(emu: ClusterEmulator) -> list[dict]:
    return emu.objects("v1", "Pod", selector="gpustack.io/verify=true")
