"""Extensions of the emulator for `gpustack status` tests (kept out of tests/cluster/emulator.py).

The emulator plays no DaemonSet controller that creates pods; these helpers put device plugin
pods on nodes the way the DaemonSet controller and kubelet would (SIMULATED: no kubelet here).
"""

from __future__ import annotations

from gpustack.cluster.status import UPGRADE_STATE_LABEL

PLUGIN_LABELS = {
    "app.kubernetes.io/name": "nvidia-device-plugin",
    "app.kubernetes.io/instance": "gpustack",
}


def add_plugin_pod(emulator, node: str, ready: bool, namespace: str = "gpustack-system") -> None:
    """A device plugin pod bound to `node`, Ready or not (as a kubelet would report it)."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"nvidia-device-plugin-{node}",
            "namespace": namespace,
            "labels": dict(PLUGIN_LABELS),
        },
        "spec": {"nodeName": node, "containers": [{"name": "plugin", "image": "x"}]},
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
    emulator.create(pod)


def add_gpu_node(emulator, name: str, gpus: int, plugin_ready: bool | None, state: str = ""):
    labels = {UPGRADE_STATE_LABEL: state} if state else {}
    emulator.add_node(name, labels=labels, allocatable={"nvidia.com/gpu": str(gpus)})
    if plugin_ready is not None:
        add_plugin_pod(emulator, name, plugin_ready)
