"""STAND-INS for what a real cluster's kubelets, device plugins and containers would do.

For reads of many nodes at once (`status` pagination, the 10,000-node benchmark): a Node object
with GPUs allocatable and no kubelet behind it, and a device plugin pod bound to it that the API
server is told is Running and Ready. Nothing runs; only the objects a read lists are real.

For flows on kwok nodes: a node's GPU allocatable written by the test (a device plugin's report),
and a pod's container "exiting" (its status written as a kubelet reports it), where kwok has no
stage of its own for it."""

from __future__ import annotations

import contextlib
import threading
from datetime import UTC, datetime

from kubernetes.client.exceptions import ApiException

from gpustack.k8s.cluster import status as cluster_status
from tests.kube.conftest import KWOK_NODE_ANNOTATION

GPU = "nvidia.com/gpu"
JSON = "application/json"
MERGE = "application/merge-patch+json"
VERIFY_SELECTOR = "gpustack.io/verify=true"
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


def kwok_node(cluster, name: str, *, gpus: int = 0, labels: dict | None = None) -> None:
    """A Node that kwok plays the kubelet of (it heartbeats the node and marks it Ready).
    `gpus`: its nvidia.com/gpu capacity and allocatable, as the test writes them: a STAND-IN
    for a device plugin's report, not a GPU."""
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110"}
    if gpus:
        resources[GPU] = str(gpus)
    cluster.raw("POST", "/api/v1/nodes", ctype=JSON, body={
        "metadata": {"name": name, "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                     "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "status": {"capacity": resources, "allocatable": resources}})  # fmt: skip


def set_gpu_allocatable(cluster, name: str, gpus: int) -> None:
    """STAND-IN for a device plugin going away (0) or registering again: the node's
    nvidia.com/gpu allocatable as the kubelet would write it (capacity is kept)."""
    cluster.raw("PATCH", f"/api/v1/nodes/{name}/status", ctype=MERGE,
                body={"status": {"allocatable": {GPU: str(gpus)}}})  # fmt: skip


def node_ready(node: dict) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def finish_pod(cluster, namespace: str, name: str, exit_code: int = 0) -> None:
    """STAND-IN for a container's process exiting: the pod's status as a kubelet reports a
    container that exited with `exit_code` under restartPolicy Never (kwok completes only
    Job-owned pods by itself). Nothing ran and no log was written."""
    pod = cluster.raw("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    reason = "Completed" if exit_code == 0 else "Error"
    statuses = [
        {"name": c["name"], "image": c["image"], "imageID": "", "ready": False, "started": False,
         "restartCount": 0, "state": {"terminated": {"exitCode": exit_code, "reason": reason,
                                                     "startedAt": now, "finishedAt": now}}}
        for c in pod["spec"]["containers"]
    ]  # fmt: skip
    done = {"status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
    cluster.raw("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", ctype=MERGE,
                body={"status": {
                    "phase": "Succeeded" if exit_code == 0 else "Failed",
                    "conditions": [
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                        {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                        {"type": "Ready", **done}, {"type": "ContainersReady", **done}],
                    "containerStatuses": statuses}})  # fmt: skip


@contextlib.contextmanager
def verification_pods_exit(kubeconfig, namespace: str, interval: float = 0.02):
    """STAND-IN for gpustack's verification container (`nvidia-smi -L`) exiting 0: while the
    block runs, every Running pod labelled gpustack.io/verify=true in `namespace` is finished
    with `finish_pod`. No nvidia-smi runs and no log is written: only the pod's phase is real
    to the reader, so only a check that reads nothing but the phase (the upgrade's validation)
    can pass on it. Yields the set of the pods it finished."""
    from gpustack.k8s.cluster.connect import connect

    cluster = connect(str(kubeconfig))
    finished: set[str] = set()
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        path = f"/api/v1/namespaces/{namespace}/pods"
        while not stop.wait(interval):
            try:
                for pod in cluster.raw("GET", path, [("labelSelector", VERIFY_SELECTOR)])["items"]:
                    meta = pod["metadata"]
                    if pod["status"].get("phase") != "Running" or meta.get("deletionTimestamp"):
                        continue
                    try:
                        finish_pod(cluster, namespace, meta["name"])
                    except ApiException as exc:
                        if exc.status != 404:  # gpustack deleted it meanwhile: fine
                            raise
                    finished.add(meta["name"])
            except BaseException as exc:  # reported when the block ends
                errors.append(exc)
                return

    thread = threading.Thread(target=loop, name=f"verify-exit-{namespace}", daemon=True)
    thread.start()
    try:
        yield finished
    finally:
        stop.set()
        thread.join(10)
        cluster.close()
    if errors:
        raise errors[0]
