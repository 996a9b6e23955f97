"""Clusters for `gpustack status` tests: GPU nodes running gpustack's device plugin DaemonSet.

The device plugin pods come from the emulator's DaemonSet controller and kubelet, from the
manifests gpustack renders; whether one is ready follows from the node's SIMULATED hardware
(a node without GPUs crash-loops the plugin, as `failOnInitError` makes it do).
"""

from __future__ import annotations

from gpustack.k8s.cluster.status import UPGRADE_STATE_LABEL
from gpustack.k8s.manifests import ClusterConfig, render
from tests.cluster.emulator import NodeHardware
from tests.cluster.helpers import uuids_for

PLUGIN_LABEL = "nvidia.com/gpu.deploy.device-plugin"


def install_device_plugin(emulator, config: ClusterConfig | None = None) -> None:
    """Apply gpustack's namespace, RuntimeClass and device plugin objects (as kubectl would)."""
    for obj in render(config or ClusterConfig()):
        name = obj["metadata"]["name"]
        if obj["kind"] in ("Namespace", "RuntimeClass") or "nvidia-device-plugin" in name:
            emulator.create(obj)


def gpu_node(
    emulator, name: str, gpus: int, *, plugin: bool = True, gfd: bool = False, state: str = ""
) -> None:
    """A node with `gpus` SIMULATED GPUs (0: none, but the nvidia runtime is configured);
    `gfd`: labelled for GPU Feature Discovery too (no GFD runs here, so it has no GFD labels)."""
    labels = {UPGRADE_STATE_LABEL: state} if state else {}
    if plugin:
        labels[PLUGIN_LABEL] = "true"
    if gfd:
        labels["nvidia.com/gpu.deploy.gpu-feature-discovery"] = "true"
    hardware = NodeHardware.gpu_node(uuids_for(name, gpus))
    if not gpus:
        hardware.driver = None
    emulator.add_node(name, labels=labels, hardware=hardware)
