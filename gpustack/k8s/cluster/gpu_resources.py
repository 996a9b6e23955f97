"""Pure: which GPU resources a node advertises, how many are free, which one to verify with.

Both families count, as the GPU Operator's validator counts them
(cmd/nvidia-validator/main.go@10ee5b3638b89e11e949412aafa5ba99279c3721, countGPUResources /
getGPUResourceName): `nvidia.com/gpu*` (whole GPUs, time-sliced or MPS replicas, `.shared`,
MIG single) and `nvidia.com/mig-<profile>` (MIG mixed). A node whose GPUs are all in MIG mode
under the mixed strategy advertises only the latter.

Free units = allocatable minus what the node's pods that still hold devices request (pods not
Succeeded/Failed, terminating ones included: the kubelet frees their devices only when they
are gone). Extended resources are requested in whole units and requests equal limits.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# volcano.sh/vgpu-number: Volcano's vGPU device plugin (gpustack_k8s_gpu_allocation=volcano),
# deviceSplitCount shares per GPU
GPU_PREFIXES = ("nvidia.com/gpu", "nvidia.com/mig-", "volcano.sh/vgpu-number")


def _int(value: Any) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def is_gpu_resource(name: str) -> bool:
    return name.startswith(GPU_PREFIXES)


def gpu_allocatable(node: dict[str, Any]) -> dict[str, int]:
    """GPU resources in the node's allocatable, both families."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return {k: _int(v) for k, v in sorted(allocatable.items()) if is_gpu_resource(k)}


def pod_requests(pod: dict[str, Any]) -> dict[str, int]:
    """GPU units a pod holds: the sum over its containers, at least its largest init container."""
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}

    def units(container: dict) -> dict[str, int]:
        resources = container.get("resources") or {}
        merged = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        return {k: _int(v) for k, v in merged.items() if is_gpu_resource(k)}

    for container in spec.get("containers") or []:
        for key, value in units(container).items():
            total[key] = total.get(key, 0) + value
    for container in spec.get("initContainers") or []:
        for key, value in units(container).items():
            total[key] = max(total.get(key, 0), value)
    return total


def holds_devices(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


@dataclass
class Units:
    resource: str
    allocatable: int
    used: int = 0
    holders: list[str] = field(default_factory=list)  # namespace/name of pods holding some

    @property
    def free(self) -> int:
        return max(self.allocatable - self.used, 0)


def units(node: dict[str, Any], pods: list[dict[str, Any]]) -> dict[str, Units]:
    """Per GPU resource of the node: allocatable, used by its pods, who uses them."""
    out = {name: Units(name, amount) for name, amount in gpu_allocatable(node).items()}
    for pod in pods:
        if not holds_devices(pod):
            continue
        meta = pod.get("metadata") or {}
        for resource, amount in pod_requests(pod).items():
            entry = out.setdefault(resource, Units(resource, 0))
            entry.used += amount
            entry.holders.append(f"{meta.get('namespace', 'default')}/{meta.get('name', '?')}")
    return out


def choose(found: dict[str, Units], preferred: str) -> Units | None:
    """The resource one verification unit is taken from, or None when nothing is free.

    MIG resources first (as the validator does), then `preferred` (the configured resource),
    then any other GPU resource; the first with a free unit wins.
    """
    mig = sorted(n for n in found if n.startswith("nvidia.com/mig-"))
    rest = sorted(n for n in found if n not in mig and n != preferred)
    for name in [*mig, preferred, *rest]:
        entry = found.get(name)
        if entry and entry.free > 0:
            return entry
    return None


def summary(found: dict[str, Units]) -> str:
    """`nvidia.com/mig-1g.10gb: 7, nvidia.com/mig-3g.40gb: 2` (allocatable per resource)."""
    return ", ".join(f"{u.resource}: {u.allocatable}" for u in found.values() if u.allocatable)


def busy_message(found: dict[str, Units]) -> str:
    """Why no verification pod runs: every GPU unit is held by other pods."""
    held = [u for u in found.values() if u.allocatable]
    counts = ", ".join(f"{u.used}/{u.allocatable} {u.resource}" for u in held)
    holders = sorted({h for u in held for h in u.holders})
    shown = ", ".join(holders[:5]) + (" …" if len(holders) > 5 else "")
    return (
        f"every GPU unit is in use ({counts}) by {shown}; no verification pod was started, "
        "so running workloads are not disturbed (run verify again when a unit is free)"
    )
