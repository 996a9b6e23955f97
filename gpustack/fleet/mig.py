"""MIG views, pure: the node labels, the cluster's MIG strategy, the GPU resources a layout gives.

From the GPUs the nvidia_mig role reports (its `gpustack_mig` fact) and a node's allocatable:
what k8s-device-plugin should advertise, and whether the node does. The change itself (one
node at a time, label-driven) is gpustack/mig/.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
ENABLED = "Enabled"  # nvidia-smi's mig.mode.current, as the role's fact carries it


# -- the MIG strategy and what the device plugin should advertise ------------------------------


def _mig_on(gpu: Mapping[str, Any], desired: bool) -> bool:
    if desired:
        return gpu.get("desired_mode") == ENABLED
    return gpu.get("mode_current") == ENABLED


def _devices(gpu: Mapping[str, Any], desired: bool) -> dict[str, int]:
    devices = gpu.get("desired" if desired else "applied") or {}
    return {str(k): int(v) for k, v in devices.items() if int(v) > 0}


def node_strategy(gpus: Sequence[Mapping[str, Any]], desired: bool = True) -> str:
    """Pure: none (no GPU in MIG mode), single (every GPU in MIG mode, one profile), else mixed.

    "single" is what k8s-device-plugin accepts as single (NVIDIA/k8s-device-plugin@1b826acc
    `internal/rm/device_map.go`: all GPUs with the same migEnabled value, every MIG-enabled GPU
    with MIG devices, one MIG device type on the node).
    """
    gpus = [g for g in gpus if g.get("mig_capable", True) or _mig_on(g, desired)]
    on = [g for g in gpus if _mig_on(g, desired)]
    if not on:
        return "none"
    profiles = {p for g in on for p in _devices(g, desired)}
    if len(on) == len(gpus) and len(profiles) == 1 and all(_devices(g, desired) for g in on):
        return "single"
    return "mixed"


def derive_strategy(nodes: Mapping[str, Sequence[Mapping[str, Any]]], desired: bool = True) -> str:
    """Pure: one strategy for the cluster (the device plugin's is cluster-wide).

    none when no node has a GPU in MIG mode; single when every node with MIG is single (nodes
    without MIG advertise whole GPUs as nvidia.com/gpu under single too); else mixed.
    """
    per_node = {node_strategy(gpus, desired) for gpus in nodes.values()}
    if per_node <= {"none"}:
        return "none"
    if per_node <= {"none", "single"}:
        return "single"
    return "mixed"


def expected_resources(
    gpus: Sequence[Mapping[str, Any]], strategy: str, desired: bool = True
) -> dict[str, int]:
    """Pure: the GPU resources k8s-device-plugin advertises for these GPUs under `strategy`.

    As `internal/rm/device_map.go`@1b826acc: with none every GPU is one nvidia.com/gpu (MIG
    or not); otherwise a MIG-enabled GPU gives its MIG devices — as nvidia.com/gpu (single) or
    nvidia.com/mig-<profile> (mixed) — and the others one nvidia.com/gpu each.
    """
    out: dict[str, int] = {}
    for gpu in gpus:
        if strategy == "none" or not _mig_on(gpu, desired):
            out["nvidia.com/gpu"] = out.get("nvidia.com/gpu", 0) + 1
            continue
        for profile, count in _devices(gpu, desired).items():
            if "c." in profile.split("+")[0]:  # compute-instance profiles: not a device type
                continue
            name = "nvidia.com/gpu" if strategy == "single" else f"nvidia.com/mig-{profile}"
            out[name] = out.get(name, 0) + count
    return out


def resource_drift(expected: Mapping[str, int], advertised: Mapping[str, Any]) -> str:
    """Pure: '' when the node's GPU allocatable equals `expected`, else what differs."""
    have = {
        k: int(str(v))
        for k, v in advertised.items()
        if k.startswith(("nvidia.com/gpu", "nvidia.com/mig-")) and str(v).isdigit() and int(v)
    }
    want = {k: v for k, v in expected.items() if v}
    if have == want:
        return ""
    names = sorted(set(have) | set(want))
    return ", ".join(f"{n}: {have.get(n, 0)} (layout: {want.get(n, 0)})" for n in names
                     if have.get(n, 0) != want.get(n, 0))  # fmt: skip
