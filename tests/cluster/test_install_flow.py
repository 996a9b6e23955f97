"""install's Kubernetes phase against the emulator: apply, label, wait, verify."""

from __future__ import annotations

from gpustack.k8s.cluster import flow
from tests.cluster.helpers import (
    gpu_cluster,
    gpu_facts,
    inventory,
    run_result,
    verify_pods,
)

NS = "gpustack-system"
MANAGED = "app.kubernetes.io/managed-by=gpustack"


def session_for(kubeconfig, hosts, extravars=None, hostvars=None):
    return flow.prepare(
        str(kubeconfig), inventory(kubeconfig.parent, hosts, hostvars), extravars or {}
    )


def test_install_applies_labels_waits_and_verifies(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 2, "gpu2": 4})
    facts = {"gpu1": gpu_facts("gpu1", 2), "gpu2": gpu_facts("gpu2", 4)}
    report = flow.install(session_for(kubeconfig, ["gpu1", "gpu2"]), run_result(facts), clock=clock)

    assert report.passed, report.to_dict()
    for node in report.nodes:
        names = [c.name for c in node.checks]
        assert names == ["node", "gpus", "operands", "capacity", "pod", "gfd"]
        assert all(c.status == "passed" for c in node.checks[:-1])
        assert "UUID matches one of the host's" in node.check("pod").message
        assert node.check("gfd").status == "skipped"  # no NFD in this cluster
        assert "GFD labels need Node Feature Discovery running" in node.check("gfd").message
    assert report.gfd_mode == "feature-file" and report.nfd_api is False
    assert {a.action for a in report.applied} == {"created"}
    kinds = {(a.kind, a.name) for a in report.applied}
    assert ("RuntimeClass", "nvidia") in kinds and ("DaemonSet", "nvidia-device-plugin") in kinds
    assert ("ServiceMonitor", "dcgm-exporter") not in kinds  # no CRD in this cluster
    daemonsets = emu.objects("apps/v1", "DaemonSet", NS, selector=MANAGED)
    assert len(daemonsets) == 3
    for ds in daemonsets:
        assert ds["metadata"]["managedFields"][0]["manager"] == "gpustack"
        status = ds["status"]  # computed by the emulated DaemonSet controller from its pods
        assert status["numberReady"] == status["desiredNumberScheduled"] == 2
    labels = emu.get("v1", "Node", "gpu2")["metadata"]["labels"]
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
    pods_created = emu.count("POST", f"/api/v1/namespaces/{NS}/pods")
    assert pods_created == 2
    assert verify_pods(emu) == []  # cleaned up


def test_second_install_changes_nothing(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 1})
    facts = {"gpu1": gpu_facts("gpu1", 1)}
    flow.install(session_for(kubeconfig, ["gpu1"]), run_result(facts), clock=clock)
    before = {
        (o["kind"], o["metadata"]["name"]): o["metadata"]["resourceVersion"]
        for kind in (("apps/v1", "DaemonSet"), ("v1", "ConfigMap"), ("v1", "Service"))
        for o in emu.objects(*kind, NS)
    }
    node_rv = emu.get("v1", "Node", "gpu1")["metadata"]["resourceVersion"]
    node_patches = emu.count("PATCH", "/api/v1/nodes/gpu1")

    report = flow.install(session_for(kubeconfig, ["gpu1"]), run_result(facts), clock=clock)

    assert report.passed
    assert {a.action for a in report.applied} == {"unchanged"}
    after = {
        (o["kind"], o["metadata"]["name"]): o["metadata"]["resourceVersion"]
        for kind in (("apps/v1", "DaemonSet"), ("v1", "ConfigMap"), ("v1", "Service"))
        for o in emu.objects(*kind, NS)
    }
    assert after == before
    assert emu.get("v1", "Node", "gpu1")["metadata"]["resourceVersion"] == node_rv
    assert emu.count("PATCH", "/api/v1/nodes/gpu1") == node_patches  # labels already right


def test_check_mode_changes_nothing_in_the_cluster(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 1})
    node_rv = emu.get("v1", "Node", "gpu1")["metadata"]["resourceVersion"]
    report = flow.install(
        session_for(kubeconfig, ["gpu1"]),
        run_result({"gpu1": gpu_facts("gpu1", 1)}),
        check=True,
        clock=clock,
    )
    assert {a.action for a in report.applied} == {"would create"}
    assert report.labels["gpu1"]["nvidia.com/gpu.present"] == "true"
    assert report.nodes == []
    assert emu.objects("apps/v1", "DaemonSet") == []
    assert emu.get("v1", "Namespace", NS) is None
    assert emu.get("v1", "Node", "gpu1")["metadata"]["resourceVersion"] == node_rv
