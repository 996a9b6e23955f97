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
is asserted on only where `HamiBinding` (below) binds them and `VerificationPods` plays their
container's nvidia-smi output.
"""

from __future__ import annotations

import threading

import pytest

from gpustack.errors import BadInput
from gpustack.k8s.cluster import flow
from gpustack.k8s.cluster.mig import connect_backend
from gpustack.k8s.cluster.pods import RUN_LABEL
from tests.builders import gpu_facts, inventory, run_result, uuids_for
from tests.kube.stand_ins import JSON, Outcome, VerificationPods, kwok_node

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


def session_for(kubeconfig, unique, host, allocation=None, **settings):
    extravars = {"gpustack_k8s_namespace": f"gs-hami-{unique}", **FAST, **settings}
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


class HamiBinding:
    """STAND-IN for HAMi's scheduler (which does not run here): binds each verification pod
    that names `hami-scheduler` to the node its required node affinity names, through the
    pods/binding subresource a scheduler uses. Nothing else HAMi's scheduler does (filtering by
    free GPU memory, the device annotations its device plugin reads) is played. The kubelet
    admits the pod's `nvidia.com/gpumem` without any node having it (kubelet
    removeMissingExtendedResources, pkg/kubelet/lifecycle/predicate.go@v1.36.3), so kwok
    running it is not kinder than a kubelet."""

    def __init__(self, cluster):
        self.cluster, self.bound = cluster, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)

    def _run(self):
        while not self._stop.wait(0.1):
            pods = self.cluster.raw("GET", "/api/v1/pods", [("labelSelector", RUN_LABEL)])
            for pod in pods["items"]:
                spec, meta = pod["spec"], pod["metadata"]
                if spec.get("schedulerName") != "hami-scheduler" or spec.get("nodeName"):
                    continue
                terms = spec["affinity"]["nodeAffinity"][
                    "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]  # fmt: skip
                node = terms[0]["matchFields"][0]["values"][0]
                self.cluster.raw(
                    "POST", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/binding",
                    ctype=JSON, body={"apiVersion": "v1", "kind": "Binding",
                                      "metadata": {"name": meta["name"]},
                                      "target": {"apiVersion": "v1", "kind": "Node", "name": node}},
                )  # fmt: skip
                self.bound.append(meta["name"])


def test_verify_under_hami_checks_the_memory_limit_nvidia_smi_reports(
    cluster, kubeconfig, unique, tmp_path
):
    """The verification pod asks HAMi for gpustack_k8s_hami_verify_memory MiB; the real API
    server admits it, and the pod check reads the limit back from what nvidia-smi printed: the
    limit (HAMi-core's answer inside a limited container) passes, the whole GPU's memory fails.
    The nvidia-smi output is the stand-in's (`VerificationPods`); no HAMi-core ran."""
    host = f"gpu1-{unique}"
    kwok_node(cluster, host, gpus=10)
    facts = run_result({host: gpu_facts(host, 1)})
    [uuid] = uuids_for(host, 1)
    session = session_for(kubeconfig, unique, host, "hami", gpustack_k8s_hami_verify_memory=2048)
    limited = Outcome(f"NVIDIA A100-SXM4-80GB, {uuid}, 2048 MiB\n")
    with HamiBinding(cluster) as binding, VerificationPods(cluster, tmp_path, {host: limited}):
        report = flow.install(session, facts)
    pod = report.nodes[0].check("pod")
    assert pod.status == "passed", report.to_dict()
    assert pod.message.endswith(
        "; GPU memory limit 2048 MiB in effect (nvidia-smi's total in the pod)"
        "; 1 nvidia.com/gpu of 10 free"
    ), pod.message
    assert len(binding.bound) == 1

    whole = Outcome(f"NVIDIA A100-SXM4-80GB, {uuid}, 81920 MiB\n")
    (tmp_path / "whole").mkdir()
    with HamiBinding(cluster), VerificationPods(cluster, tmp_path / "whole", {host: whole}):
        report = flow.verify_cluster(session_for(kubeconfig, unique, host, "hami",
                                                 gpustack_k8s_hami_verify_memory=2048), facts)  # fmt: skip
    pod = report.nodes[0].check("pod")
    assert pod.status == "failed"
    assert pod.message.startswith(
        "the pod asked HAMi for 2048 MiB (nvidia.com/gpumem) but nvidia-smi in it reports "
        f"81920 MiB as {uuid}'s total memory: HAMi-core's memory limit is not in effect"
    ), pod.message
    flow.uninstall(session_for(kubeconfig, unique, host))
