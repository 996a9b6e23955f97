"""`gpustack status` Kubernetes columns against a real control plane.

gpustack's device plugin DaemonSet (the objects gpustack renders, applied as gpustack applies
them) gets its pods from the real kube-controller-manager's DaemonSet controller and the real
kube-scheduler. The nodes are kwok's STAND-IN nodes: their `nvidia.com/gpu` allocatable is a
number the test writes (a stand-in for a device plugin's report) and kwok plays the kubelet,
marking the plugin pods Running and Ready. No GPU and no device plugin binary is involved.

API calls are counted from the API server's audit log (what the server answered, per user
agent), not by wrapping the client.

Not covered: a plugin pod that crash-loops by itself on a node without GPUs (that needs NVIDIA's
image and a node without a driver). kwok runs no container, so here the test writes that pod's
status as a kubelet would report a crash-looping container (Running, not Ready, CrashLoopBackOff).
"""

from __future__ import annotations

import json
import math
import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpustack.ansible.inventory import load_inventory
from gpustack.k8s.cluster import apply
from gpustack.k8s.cluster import status as cluster_status
from gpustack.k8s.cluster.connect import connect
from gpustack.k8s.manifests import ClusterConfig, render
from tests.conftest import run_cli, wait_until
from tests.kube.conftest import KWOK_NODE_ANNOTATION
from tests.kube.stand_ins import gpu_node_with_plugin_pod

pytestmark = pytest.mark.kube

GPU = "nvidia.com/gpu"
PLUGIN_LABEL = "nvidia.com/gpu.deploy.device-plugin"
GFD_DEPLOY_LABEL = "nvidia.com/gpu.deploy.gpu-feature-discovery"
NAMESPACE = "gpustack-system"
JSON = "application/json"


@pytest.fixture(scope="module")
def device_plugin(kube):
    """gpustack's namespace, RuntimeClass and device plugin (ConfigMap, DaemonSet), applied
    once per control plane: gpustack-system is cluster-wide, so each test reads only the nodes
    it created (names unique to the test)."""
    cluster = connect(str(kube.kubeconfig))
    try:
        objects = [
            o
            for o in render(ClusterConfig())
            if o["kind"] in ("Namespace", "RuntimeClass")
            or o["metadata"]["name"].startswith("nvidia-device-plugin")
        ]
        apply.apply_objects(cluster, objects)
    finally:
        cluster.close()


def node(cluster, name: str, gpus: int, *, plugin=True, gfd=False, state="", kwok=True):
    """A Node with `gpus` as its nvidia.com/gpu allocatable (a stand-in for a device plugin's
    report); `kwok`: kwok plays its kubelet; `plugin`/`gfd`: labelled for gpustack's device
    plugin / GPU Feature Discovery (no GFD runs, so it never gets GFD's labels)."""
    labels = {"kubernetes.io/hostname": name}
    if plugin:
        labels[PLUGIN_LABEL] = "true"
    if gfd:
        labels[GFD_DEPLOY_LABEL] = "true"
    if state:
        labels[cluster_status.UPGRADE_STATE_LABEL] = state
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110", GPU: str(gpus)}
    metadata = {"name": name, "labels": labels}
    if kwok:
        metadata["annotations"] = {KWOK_NODE_ANNOTATION: "fake"}
    body = {"apiVersion": "v1", "kind": "Node", "metadata": metadata,
            "status": {"capacity": resources, "allocatable": resources}}  # fmt: skip
    cluster.raw("POST", "/api/v1/nodes", body=body, ctype=JSON)


def plugin_pod(cluster, node_name: str, ready: bool = True) -> dict | None:
    pods = cluster.raw(
        "GET",
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        [("labelSelector", cluster_status.DEVICE_PLUGIN_SELECTOR),
         ("fieldSelector", f"spec.nodeName={node_name}")],
    )["items"]  # fmt: skip
    return next((p for p in pods if not ready or cluster_status._ready(p)), None)


def crash_loop(cluster, pod: dict) -> None:
    """Write the status a kubelet reports for a plugin container that keeps exiting (the
    device plugin with `failOnInitError` on a node without GPUs)."""
    statuses = [
        {"name": c["name"], "image": c["image"], "imageID": "", "ready": False,
         "restartCount": 3, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}
        for c in pod["spec"]["containers"]
    ]  # fmt: skip
    patch = {"status": {
        "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
                       {"type": "ContainersReady", "status": "False"}],
        "containerStatuses": statuses}}  # fmt: skip
    name = pod["metadata"]["name"]
    cluster.raw("PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/status", body=patch,
                ctype="application/strategic-merge-patch+json")  # fmt: skip


def client_calls(events: list[dict]) -> list[tuple[str, str]]:
    """(verb, path) of the requests gpustack's Kubernetes client made (kwok's are left out)."""
    return sorted(
        (e["verb"], e["requestURI"].split("?")[0])
        for e in events
        if not e.get("userAgent", "").startswith("kwok")
    )


def _local_inventory(tmp_path, hosts: dict[str, str]):
    lines = ["[gpu_nodes]"] + [
        f"{h} ansible_connection=local ansible_python_interpreter=/usr/bin/python3 k8s_node_name={n}"
        for h, n in hosts.items()
    ]
    path = tmp_path / "inv.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_status_reads_nodes_and_plugin_pods_with_list_calls(
    tmp_path, kube, kubeconfig, state_dir, unique, device_plugin
):
    cluster = connect(str(kubeconfig))
    a, b = f"a-{unique}", f"b-{unique}"
    cpus = [f"cpu{i}-{unique}" for i in range(3)]
    try:
        node(cluster, a, 1, gfd=True, state="upgrade-done")
        node(cluster, b, 0)  # labelled for the plugin, without a GPU: the plugin crash-loops
        for name in cpus:
            node(cluster, name, 0, plugin=False)
        wait_until(lambda: plugin_pod(cluster, a), what=f"the device plugin pod Ready on {a}")
        crash_loop(cluster, wait_until(lambda: plugin_pod(cluster, b), what=f"a plugin pod on {b}"))
        assert plugin_pod(cluster, b) is None and plugin_pod(cluster, b, ready=False)

        inv = _local_inventory(tmp_path, {"local-a": a, "local-b": b, "local-c": "missing"})
        mark = kube.audit_mark()
        proc = run_cli("status", str(inv), "--kubeconfig", str(kubeconfig), "-o", "json",
                       timeout=300)  # fmt: skip
        calls = client_calls(kube.audit_events(mark))
        assert proc.returncode == 5, proc.stderr
        doc = json.loads(proc.stdout)
        va, vb, vc = (doc["nodes"][h]["kubernetes"] for h in ("local-a", "local-b", "local-c"))
        assert va["node"] == a and va["allocatable_gpus"] == 1
        assert va["device_plugin_ready"] is True
        assert doc["nodes"]["local-a"]["upgrade_state"] == "upgrade-done"
        assert vb["node"] == b and vb["allocatable_gpus"] == 0
        assert vb["device_plugin_ready"] is False
        assert va["gfd_labels"] is False and "note" not in vb  # b is not meant to run GFD
        assert va["note"].startswith("GFD labels need Node Feature Discovery running")
        assert "not installed" in va["note"]  # this API server serves no NFD API
        assert vc["node"] is None
        assert "no Node named 'missing' for host local-c" in doc["drift"]["local-c"]
        # Reads only: GET /version, NFD's API discovery, one page of nodes, one of plugin pods.
        assert calls == [
            ("get", "/apis/nfd.k8s-sigs.io/v1alpha1"),
            ("get", "/version"),
            ("list", "/api/v1/namespaces/gpustack-system/pods"),
            ("list", "/api/v1/nodes"),
        ], calls

        text = run_cli("status", str(inv), "--kubeconfig", str(kubeconfig), "-o", "wide",
                       timeout=300)  # fmt: skip
        assert text.returncode == 5
        assert re.search(rf"local-a .* {a}\s+1\s+ready\s+upgrade-done", text.stdout), text.stdout
        assert "Note: GFD labels need Node Feature Discovery running" in text.stdout
        short = run_cli("status", str(inv), "--kubeconfig", str(kubeconfig), timeout=300)
        assert re.search(r"local-a .* 1\s+upgrade-done", short.stdout), short.stdout  # gpus
        assert max(len(line) for line in short.stdout.splitlines()) <= 120
    finally:
        for name in (a, b, *cpus):
            cluster.raw("DELETE", f"/api/v1/nodes/{name}")
        cluster.close()


NODES = 2 * cluster_status.PAGE + 1  # three pages of nodes and three of plugin pods


def test_pagination_follows_continue_tokens(kube, kubeconfig, tmp_path, unique):
    """NODES nodes and a plugin pod on each: three pages of each list, never a call per node.

    Sized by PAGE (product code), so only as large as three pages need. The Node objects have
    no kubelet (not even kwok: heartbeating a thousand nodes would load the worker for the
    rest of its tests), and their plugin pods are created by the test, bound to them and given
    the status a kubelet reports for a Ready pod: STAND-INS for the DaemonSet controller and
    kubelet, in a namespace of the test's own (gpustack_k8s_namespace) so that no DaemonSet
    claims them."""
    cluster = connect(str(kubeconfig))
    namespace, group = f"page-{unique}", f"gpustack.test/page={unique}"
    names = [f"p{unique}-{i:04d}" for i in range(NODES)]
    key, value = group.split("=")

    def add(name: str) -> None:
        gpu_node_with_plugin_pod(cluster, name, namespace, {key: value})

    cluster.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}}, ctype=JSON)
    try:
        wait_until(
            lambda: cluster.raw("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts")["items"],
            what="the namespace's default service account",
        )
        with ThreadPoolExecutor(max_workers=4) as pool:
            list(pool.map(add, names))

        inv = tmp_path / "big.ini"
        inv.write_text("[gpu_nodes]\n" + "\n".join(names) + "\n")
        session = cluster_status.prepare(
            str(kubeconfig), load_inventory(inv), {"gpustack_k8s_namespace": namespace}
        )
        mark = kube.audit_mark()
        views = cluster_status.read_nodes(session)
        calls = client_calls(kube.audit_events(mark))
        all_nodes = len(kube.kubectl_get("/api/v1/nodes")["items"])  # other tests' nodes too

        assert len(views) == NODES and all(v["device_plugin_ready"] for v in views.values())
        assert all(v["allocatable_gpus"] == 8 for v in views.values())
        assert calls == sorted(
            [("get", "/apis/nfd.k8s-sigs.io/v1alpha1")]
            + [("list", f"/api/v1/namespaces/{namespace}/pods")] * 3
            + [("list", "/api/v1/nodes")] * math.ceil(all_nodes / cluster_status.PAGE)
        ), calls
    finally:
        cluster.raw("DELETE", "/api/v1/nodes", [("labelSelector", group)])
        cluster.raw("DELETE", f"/api/v1/namespaces/{namespace}")
        cluster.close()
