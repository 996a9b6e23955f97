"""SIMULATED node hardware: what a host would have. A test fixture, not a measurement.

There is no GPU on the machines these tests run on. A `NodeHardware` says what the emulated
kubelet and the emulated operand images find on a node: NVIDIA GPUs (UUIDs, model, MIG
layout), the loaded driver, which container runtime handlers are configured (`nvidia` once
the toolkit wired the runtime), and the host files pods write through hostPath volumes
(GFD's feature file). Tests build it from the same simulated host facts as
tests/cluster/helpers.py, so host facts and node agree.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


@dataclass
class Gpu:
    uuid: str
    name: str = "NVIDIA A100-SXM4-80GB"
    memory_mib: int = 81920
    # MIG mode on: the profiles of its MIG devices ("1g.10gb", ...); [] MIG on without instances
    mig: list[str] | None = None
    healthy: bool = True  # False: an XID error took it off the bus (the plugin marks it unhealthy)

    @property
    def mig_enabled(self) -> bool:
        return self.mig is not None

    def mig_devices(self) -> list[tuple[str, str]]:
        """(MIG UUID, profile) of each MIG device (deterministic, derived from the GPU UUID)."""
        devices = []
        for i, profile in enumerate(self.mig or []):
            digest = hashlib.sha1(f"{self.uuid}/{i}".encode()).hexdigest()
            uuid = (
                f"MIG-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
            )
            devices.append((uuid, profile))
        return devices


@dataclass
class NodeHardware:
    gpus: list[Gpu] = field(default_factory=list)
    driver: str | None = None  # loaded NVIDIA driver version; None: not loaded
    cuda: str = "12.9"
    runtime_handlers: set[str] = field(default_factory=lambda: {"runc"})
    default_runtime: str = "runc"
    files: dict[str, str] = field(default_factory=dict)  # host path -> content

    @classmethod
    def gpu_node(cls, uuids: list[str], *, driver: str = "580.95.05",
                 mig: dict[int, list[str]] | None = None) -> NodeHardware:  # fmt: skip
        """GPUs with a loaded driver and the `nvidia` runtime handler configured."""
        gpus = [Gpu(u, mig=(mig or {}).get(i)) for i, u in enumerate(uuids)]
        return cls(gpus=gpus, driver=driver, runtime_handlers={"runc", "nvidia"})

    def nvml(self, runtime: str) -> str:
        """'' when NVML initialises in a container run by `runtime`, else NVML's error."""
        if runtime != "nvidia":
            return "ERROR_LIBRARY_NOT_FOUND"  # libnvidia-ml.so not injected without the runtime
        if not self.gpus or not self.driver:
            return "ERROR_DRIVER_NOT_LOADED"
        return ""
