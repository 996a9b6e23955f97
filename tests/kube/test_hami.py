"""gpustack_k8s_gpu_allocation=hami against a real control plane: HAMi's objects applied with
server-side apply, and switching device-plugin -> hami -> device-plugin removing the other
mode's objects.

Real here: kube-apiserver (OpenAPI validation, defaulting, admission, RBAC objects referencing
the built-in system:kube-scheduler and system:volume-scheduler roles), the DaemonSet and
Deployment controllers creating pods for gpustack's objects, and the garbage collector.

STAND-INS: the node is kwok's (tests/kube/conftest.py), so HAMi's plugin pod and scheduler pod
go Running without running anything, and its `nvidia.com/gpu` capacity is what the test writes.
HAMi's images are not run: nothing here registers HAMi's devices, runs its scheduler extender or
its CUDA interposer, so only the objects are asserted on (docs/sharing.md says what that leaves
unproven). The verification pods go to HAMi's scheduler, which does not run here: their result
is not asserted on.
"""

from __future__ import annotations

import pytest

from gpustack.errors import BadInput
from gpustack.k8s.cluster import flow
from gpustack.k8s.cluster.connect import connect
from gpustack.k8s.cluster.mig import connect_backend
from tests.builders import gpu_facts, inventory, run_result
from tests.kube.stand_ins import kwok_node

pytestmark = pytest.mark.kube

FAST = {"gpustack_k8s_daemonset_timeout": 30, "gpustack_k8s_capacity_timeout": 10,
        "gpustack_k8s_verify_timeout": 10}  # fmt: skip
RBAC = "/apis/rbac.authorization.k8s.io/v1"
HAMI_NAMESPACED = {
    ("DaemonSet", "hami-device-plugin"), ("Deployment", "hami-scheduler"),
    ("ConfigMap", "hami-device-plugin"), ("ConfigMap", "hami-scheduler"),
    ("ConfigMap", "hami-scheduler-device"), ("ServiceAccount", "hami-device-plugin"),
    ("ServiceAccount", "hami-scheduler"), ("Role", "hami-scheduler"),
    ("RoleBinding", "hami-scheduler"),
}  # fmt: skip
HAMI_CLUSTER_ROLES = {"gpustack-hami-device-plugin-monitor", "gpustack-hami-scheduler"}
HAMI_BINDINGS = {
    "gpustack-hami-device-plugin", "gpustack-hami-scheduler", "gpustack-hami-scheduler-kube",
    "gpustack-hami-scheduler-volume",
}  # fmt: skip


@pytest.fixture
def cluster(kubeconfig):
    c = connect(str(kubeconfig))
    yield c
    c.close()


def session_for(kubeconfig, unique, host, allocation=None):
    extravars = {"gpustack_k8s_namespace": f"gs-hami-{unique}", **FAST}
    if allocation:
        extravars["gpustack_k8s_gpu_allocation"] = allocation
    return flow.prepare(str(kubeconfig), inventory(kubeconfig.parent, [host]), extravars)


def managed_names(cluster, path: str) -> set[str]:
    items = cluster.raw("GET", path + "?labelSelector=app.kubernetes.io%2Fmanaged-by%3Dgpustack")
    return {o["metadata"]["name"] for o in items["items"]}


def namespaced(cluster, ns: str) -> set[tuple[str, str]]:
    found = set()
    for kind, path in (
        ("DaemonSet", f"/apis/apps/v1/namespaces/{ns}/daemonsets"),
        ("Deployment", f"/apis/apps/v1/namespaces/{ns}/deployments"),
        ("ConfigMap", f"/api/v1/namespaces/{ns}/configmaps"),
        ("ServiceAccount", f"/api/v1/namespaces/{ns}/serviceaccounts"),
        ("Role", f"{RBAC}/namespaces/{ns}/roles"),
        ("RoleBinding", f"{RBAC}/namespaces/{ns}/rolebindings"),
    ):
        found |= {(kind, name) for name in managed_names(cluster, path)}
    return found


def test_switching_to_hami_and_back_replaces_the_plugin_and_removes_hamis_objects(
    cluster, kubeconfig, unique
):
    host = f"gpu1-{unique}"
    ns = f"gs-hami-{unique}"
    kwok_node(cluster, host, gpus=10)  # a stand-in for either plugin's registration
    facts = run_result({host: gpu_facts(host, 1)})

    first = flow.install(session_for(kubeconfig, unique, host), facts)
    assert ("DaemonSet", "nvidia-device-plugin") in namespaced(cluster, ns)
    assert first.gpu_allocation == "device-plugin"

    session = session_for(kubeconfig, unique, host, "hami")
    report = flow.install(session, facts)

    assert report.gpu_allocation == "hami"
    objects = namespaced(cluster, ns)
    assert objects >= HAMI_NAMESPACED
    assert ("DaemonSet", "nvidia-device-plugin") not in objects
    assert f"DaemonSet {ns}/nvidia-device-plugin" in report.removed
    assert managed_names(cluster, f"{RBAC}/clusterroles") >= HAMI_CLUSTER_ROLES
    assert managed_names(cluster, f"{RBAC}/clusterrolebindings") >= HAMI_BINDINGS
    labels = cluster.raw("GET", f"/api/v1/nodes/{host}")["metadata"]["labels"]
    assert labels["nvidia.com/gpu.deploy.hami-device-plugin"] == "true"
    assert labels["gpu"] == "on"
    assert "nvidia.com/gpu.deploy.device-plugin" not in labels
    # the DaemonSet controller placed HAMi's plugin on the labelled node (kwok runs the pod)
    (plugin,) = [d for d in report.daemonsets if d.name == "hami-device-plugin"]
    assert plugin.ready and host in plugin.nodes, plugin
    # kube-scheduler at the API server's own version, as HAMi's chart resolves it
    deployment = cluster.raw("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/hami-scheduler")
    kube = deployment["spec"]["template"]["spec"]["containers"][0]
    assert kube["image"].endswith(":" + session.version.split("+")[0].split("-")[0])
    # capacity read as GPUs x deviceSplitCount (the node's stand-in allocatable is 10)
    assert report.nodes[0].check("capacity").status == "passed", report.to_dict()
    # install waited for HAMi's scheduler Deployment too (kwok runs its pod)
    (scheduler,) = [r for r in report.daemonsets if r.kind == "Deployment"]
    assert scheduler.name == "hami-scheduler" and scheduler.ready, scheduler
    # gpustack mig refuses to partition GPUs HAMi hands out: configured, or only deployed
    inv = inventory(kubeconfig.parent, [host])
    for extravars in ({"gpustack_k8s_gpu_allocation": "hami"}, {}):
        with pytest.raises(BadInput, match="gpustack mig: gpustack_k8s_gpu_allocation is"):
            connect_backend(str(kubeconfig), inv, {"gpustack_k8s_namespace": ns, **extravars})

    back = flow.install(session_for(kubeconfig, unique, host), facts)

    objects = namespaced(cluster, ns)
    assert not HAMI_NAMESPACED & objects
    assert ("DaemonSet", "nvidia-device-plugin") in objects
    assert {f"{kind} {ns}/{name}" for kind, name in HAMI_NAMESPACED} <= set(back.removed)
    labels = cluster.raw("GET", f"/api/v1/nodes/{host}")["metadata"]["labels"]
    assert "nvidia.com/gpu.deploy.hami-device-plugin" not in labels and "gpu" not in labels
    assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
    # cluster-scoped RBAC stays until uninstall (prune touches gpustack's namespace only)
    assert managed_names(cluster, f"{RBAC}/clusterroles") >= HAMI_CLUSTER_ROLES

    result = flow.uninstall(session_for(kubeconfig, unique, host))

    assert f"ClusterRole {sorted(HAMI_CLUSTER_ROLES)[0]}" in result["deleted"]
    assert not HAMI_CLUSTER_ROLES & managed_names(cluster, f"{RBAC}/clusterroles")
    assert not HAMI_BINDINGS & managed_names(cluster, f"{RBAC}/clusterrolebindings")


def test_check_mode_validates_hamis_objects_and_creates_nothing(cluster, kubeconfig, unique):
    host = f"gpu1-{unique}"
    kwok_node(cluster, host, gpus=10)
    session = session_for(kubeconfig, unique, host, "hami")
    report = flow.install(session, run_result({host: gpu_facts(host, 1)}), check=True)
    refs = {a.ref for a in report.applied}
    assert any("hami-scheduler" in r and "Deployment" in r for r in refs), refs
    assert {a.action for a in report.applied if a.kind != "RuntimeClass"} == {"would create"}
    assert not HAMI_CLUSTER_ROLES & managed_names(cluster, f"{RBAC}/clusterroles")
