"""STAND-INS for what a real cluster's kubelets and DaemonSet controller would make, for reads of
many nodes at once (`status` pagination, the 10,000-node benchmark): a Node object with GPUs
allocatable and no kubelet behind it, and a device plugin pod bound to it that the API server is
told is Running and Ready. Nothing runs; only the objects a read lists are real."""

from __future__ import annotations

from gpustack.k8s.cluster import status as cluster_status

JSON = "application/json"
SINCE = "2026-01-01T00:00:00Z"
READY = [{"type": "Ready", "status": "True", "lastTransitionTime": SINCE}]


def gpu_node_with_plugin_pod(cluster, name: str, namespace: str, node_labels: dict,
                             gpus: int = 8, node_ready: bool = False) -> None:  # fmt: skip
    """Node `name` (`gpus` nvidia.com/gpu allocatable; a Ready condition with `node_ready`) and
    the pod nvidia-device-plugin-NAME in `namespace`, with the device plugin's labels, Ready."""
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110",
                 cluster_status.GPU_RESOURCE: str(gpus)}  # fmt: skip
    status = {"capacity": resources, "allocatable": resources}
    if node_ready:
        status["conditions"] = READY
    cluster.raw("POST", "/api/v1/nodes", ctype=JSON,
                body={"metadata": {"name": name, "labels": node_labels}, "status": status})  # fmt: skip
    labels = dict(item.split("=") for item in cluster_status.DEVICE_PLUGIN_SELECTOR.split(","))
    pod = f"nvidia-device-plugin-{name}"
    cluster.raw("POST", f"/api/v1/namespaces/{namespace}/pods", ctype=JSON, body={
        "metadata": {"name": pod, "labels": labels},
        "spec": {"nodeName": name, "automountServiceAccountToken": False,
                 "containers": [{"name": "plugin", "image": "stand-in"}]}})  # fmt: skip
    cluster.raw("PATCH", f"/api/v1/namespaces/{namespace}/pods/{pod}/status",
                ctype="application/merge-patch+json",
                body={"status": {"phase": "Running", "conditions": READY}})  # fmt: skip
