"""The upgrade's node steps (cordon, GPU pod eviction) against a real control plane: the
Eviction API, a real PodDisruptionBudget kept by kube-controller-manager's disruption
controller, the Deployment and ReplicaSet controllers and the scheduler placing replacements.

The nodes are kwok's STAND-IN nodes: their "GPUs" are allocatable numbers the test writes,
and kwok plays the kubelet (pods Running and Ready, deletions finished)."""

from __future__ import annotations

import threading
import time

import pytest

from gpustack.k8s.cluster.connect import connect
from gpustack.k8s.cluster.upgrade import KubernetesBackend
from gpustack.upgrade.backend import StepOptions
from tests.conftest import wait_until
from tests.kube.conftest import KWOK_NODE_ANNOTATION

pytestmark = pytest.mark.kube

GPU = "nvidia.com/gpu"


class RealClock:
    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def kwok_node(cluster, name: str, gpus: int, unschedulable: bool = False) -> None:
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110", GPU: str(gpus)}
    body = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {KWOK_NODE_ANNOTATION: "fake"},
            "labels": {"kubernetes.io/hostname": name, "type": "kwok"},
        },
        "spec": {"unschedulable": unschedulable},
        "status": {"capacity": resources, "allocatable": resources},
    }
    cluster.raw("POST", "/api/v1/nodes", body=body, ctype="application/json")


def running_pods(cluster, namespace: str) -> list[dict]:
    pods = cluster.raw("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
    return [
        p
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


def test_gpu_pods_leave_one_at_a_time_under_a_real_pdb(kubeconfig, unique):
    cluster = connect(str(kubeconfig))
    old, new, ns = f"old-{unique}", f"new-{unique}", f"work-{unique}"
    kwok_node(cluster, old, gpus=8)
    kwok_node(cluster, new, gpus=8, unschedulable=True)  # both replicas start on `old`
    cluster.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}},
                ctype="application/json")  # fmt: skip
    labels = {"app": "trainer"}
    # fmt: off
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "trainer", "namespace": ns},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{
                            "key": "kubernetes.io/hostname", "operator": "In",
                            "values": [old, new]}]}]}}},
                    "containers": [{
                        "name": "train", "image": "lab.gpustack.local/trainer:1",
                        "resources": {"limits": {GPU: "1"}}}],
                },
            },
        },
    }
    # fmt: on
    cluster.raw(
        "POST",
        f"/apis/apps/v1/namespaces/{ns}/deployments",
        body=deployment,
        ctype="application/json",
    )  # fmt: skip
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "trainer", "namespace": ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}},
    }
    cluster.raw("POST", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", body=pdb,
                ctype="application/json")  # fmt: skip
    wait_until(lambda: len(running_pods(cluster, ns)) == 2, what="2 trainer pods Running")
    assert {p["spec"]["nodeName"] for p in running_pods(cluster, ns)} == {old}
    wait_until(
        lambda: (
            cluster.raw("GET", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/trainer")
            .get("status", {})
            .get("disruptionsAllowed")
            == 1
        ),
        what="the disruption controller to allow one disruption",
    )
    backend = KubernetesBackend(cluster, {old: old, new: new})
    opts = StepOptions(pod_deletion_timeout=120, poll=0.5)
    backend.cordon(old, RealClock(), opts)
    first, second = sorted(p["metadata"]["name"] for p in running_pods(cluster, ns))
    # The budget allows one disruption: the API server takes the first eviction and refuses
    # the second with 429 until a replacement is Ready. `new` stays cordoned until then: kwok
    # makes a replacement Ready within milliseconds, before a second eviction could be refused.
    assert backend._evict_one(ns, first) == ""
    refused = backend._evict_one(ns, second)
    assert refused.startswith("blocked by a PodDisruptionBudget"), refused
    assert "disruption budget trainer needs 1 healthy pods" in refused, refused
    cluster.raw("PATCH", f"/api/v1/nodes/{new}", body={"spec": {"unschedulable": False}},
                ctype="application/merge-patch+json")  # fmt: skip
    wait_until(lambda: first not in {p["metadata"]["name"] for p in backend.pods_on(old)},
         what="the evicted pod gone")  # fmt: skip
    message = backend.evict_gpu_pods(old, RealClock(), opts)

    assert message == "evicted 1 GPU pod(s)"  # the second; the first was gone already
    pods = wait_until(lambda: len(running_pods(cluster, ns)) == 2 and running_pods(cluster, ns),
                what="replacements Running")  # fmt: skip
    assert {p["spec"]["nodeName"] for p in pods} == {new}


def test_an_accepted_eviction_is_not_asked_again_while_the_pod_terminates(kube, kubeconfig, unique):
    """A pod that takes a while to go (a finalizer holds it here; on a kubelet, its grace period)
    was evicted once: gpustack waits for it and posts no more evictions (each would be another
    DELETE of a terminating pod). The emulator finished deletions before the next list."""
    cluster = connect(str(kubeconfig))
    node, ns = f"slow-{unique}", f"slow-{unique}"
    kwok_node(cluster, node, gpus=8)
    cluster.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}},
                ctype="application/json")  # fmt: skip
    labels = {"app": "slow"}
    cluster.raw("POST", f"/apis/apps/v1/namespaces/{ns}/replicasets", ctype="application/json",
                body={"metadata": {"name": "slow"}, "spec": {
                    "replicas": 1, "selector": {"matchLabels": labels}, "template": {
                        "metadata": {"labels": labels},
                        "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                                 "containers": [{"name": "c", "image": "slow:1",
                                                 "resources": {"limits": {GPU: "1"}}}]}}}})  # fmt: skip
    pod = wait_until(lambda: next(iter(running_pods(cluster, ns)), None), what="the pod Running")
    name = pod["metadata"]["name"]
    held = {"metadata": {"finalizers": ["gpustack.io/test-hold"]}}
    cluster.raw("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}", body=held,
                ctype="application/merge-patch+json")  # fmt: skip
    backend = KubernetesBackend(cluster, {node: node})
    opts = StepOptions(pod_deletion_timeout=20, poll=0.1)
    backend.cordon(node, RealClock(), opts)  # the ReplicaSet's replacement stays Pending
    mark = kube.audit_mark()
    done = []
    evicting = threading.Thread(target=lambda: done.append(
        backend.evict_gpu_pods(node, RealClock(), opts)))  # fmt: skip
    evicting.start()
    try:
        wait_until(lambda: cluster.raw("GET", f"/api/v1/namespaces/{ns}/pods/{name}")["metadata"]
                   .get("deletionTimestamp"), what="the pod terminating", interval=0.05)  # fmt: skip
        time.sleep(1)  # ten of gpustack's polls with the pod still there
    finally:
        cluster.raw("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}",
                    body={"metadata": {"finalizers": None}}, ctype="application/merge-patch+json")  # fmt: skip
        evicting.join(30)

    assert done == ["evicted 1 GPU pod(s)"]
    evictions = [e for e in kube.audit_events(mark)
                 if (e.get("objectRef") or {}).get("subresource") == "eviction"]  # fmt: skip
    assert [e["objectRef"]["name"] for e in evictions] == [name], evictions
    cluster.raw("DELETE", f"/api/v1/namespaces/{ns}")
    cluster.raw("DELETE", f"/api/v1/nodes/{node}")
