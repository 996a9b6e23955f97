"""install's Kubernetes phase against a real control plane: apply, label, wait, verify.

Real: the API server (server-side apply, admission, RBAC), the DaemonSet controller placing the
operands on the labelled nodes, the scheduler placing the verification pods by their GPU
requests, namespaces and garbage collection. STAND-INS, each labelled: kwok plays the nodes'
kubelets (operand pods go Running and Ready without running anything); a node's
`nvidia.com/gpu` is what the test writes, as a device plugin would register it; the
verification container's `nvidia-smi -L` output and exit are the test's (`VerificationPods`),
served by kwok through the API server's `pods/NAME/log`. No GPU, driver or container is involved:
the host facts are SIMULATED (tests/builders.py).
"""

from __future__ import annotations

import pytest

from gpustack.k8s.cluster import flow
from gpustack.upgrade.executors import RealClock
from tests.builders import gpu_facts, inventory, run_result, smi_output, uuids_for
from tests.kube.conftest import gpustack_calls, gpustack_requests
from tests.kube.stand_ins import Outcome, VerificationPods, kwok_node

pytestmark = pytest.mark.kube

MANAGED = "app.kubernetes.io/managed-by=gpustack"


def session_for(kubeconfig, hosts, namespace):
    return flow.prepare(
        str(kubeconfig), inventory(kubeconfig.parent, hosts), {"gpustack_k8s_namespace": namespace}
    )


def test_install_applies_labels_waits_and_verifies(kube, kubeconfig, unique, tmp_path):
    ns, one, two = f"gs-{unique}", f"gpu1-{unique}", f"gpu2-{unique}"
    cluster = kube.stand_in()
    kwok_node(cluster, one, gpus=2)
    kwok_node(cluster, two, gpus=4)
    facts = {one: gpu_facts(one, 2), two: gpu_facts(two, 4)}
    # each pod asks for one GPU: the device plugin would have given it one of the host's
    outputs = {h: Outcome(smi_output(uuids_for(h, n)[-1:])) for h, n in ((one, 2), (two, 4))}
    mark = kube.audit_mark()
    with VerificationPods(cluster, tmp_path, outputs) as pods:
        report = flow.install(session_for(kubeconfig, [one, two], ns), run_result(facts),
                              clock=RealClock())  # fmt: skip
    calls = gpustack_calls(kube.audit_events(mark))

    assert report.passed, report.to_dict()
    for node in report.nodes:
        names = [c.name for c in node.checks]
        assert names == ["node", "gpus", "operands", "capacity", "pod", "gfd"]
        assert all(c.status == "passed" for c in node.checks[:-1]), node.checks
        assert "UUID matches one of the host's" in node.check("pod").message
        assert node.check("gfd").status == "skipped"  # no NFD in this cluster
        assert "GFD labels need Node Feature Discovery running" in node.check("gfd").message
    assert report.gfd_mode == "feature-file" and report.nfd_api is False
    assert {a.action for a in report.applied if a.namespace == ns} == {"created"}
    # cluster-scoped ones (the RuntimeClass) are shared with the worker's earlier tests
    assert {a.action for a in report.applied} <= {"created", "unchanged"}
    kinds = {(a.kind, a.name) for a in report.applied}
    assert ("RuntimeClass", "nvidia") in kinds and ("DaemonSet", "nvidia-device-plugin") in kinds
    assert ("ServiceMonitor", "dcgm-exporter") not in kinds  # no CRD in this cluster
    daemonsets = cluster.raw("GET", f"/apis/apps/v1/namespaces/{ns}/daemonsets",
                             [("labelSelector", MANAGED)])["items"]  # fmt: skip
    assert len(daemonsets) == 3
    for ds in daemonsets:
        assert ds["metadata"]["managedFields"][0]["manager"] == "gpustack"
        status = ds["status"]  # the real DaemonSet controller's, from kwok's Ready pods
        assert status["numberReady"] == status["desiredNumberScheduled"] == 2, status
    labels = cluster.raw("GET", f"/api/v1/nodes/{two}")["metadata"]["labels"]
    assert labels["nvidia.com/gpu.present"] == "true"
    assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
    assert calls.count(("create", f"/api/v1/namespaces/{ns}/pods")) == 2
    assert (
        sorted(pods.handled) == sorted(p for p in pods.handled if p.startswith("gpustack-verify-"))
        and len(pods.handled) == 2
    )
    left = cluster.raw("GET", f"/api/v1/namespaces/{ns}/pods",
                       [("labelSelector", "gpustack.io/verify-run")])["items"]  # fmt: skip
    assert [p for p in left if not p["metadata"].get("deletionTimestamp")] == []  # cleaned up


def test_second_install_changes_nothing(kube, kubeconfig, unique, tmp_path):
    ns, node = f"gs-{unique}", f"gpu1-{unique}"
    cluster = kube.stand_in()
    kwok_node(cluster, node, gpus=1)
    facts = {node: gpu_facts(node, 1)}
    outputs = {node: Outcome(smi_output(uuids_for(node, 1)))}

    def objects():
        return {
            (path, o["metadata"]["name"]): o["metadata"]["resourceVersion"]
            for path in (
                "apis/apps/v1/namespaces/{}/daemonsets",
                "api/v1/namespaces/{}/configmaps",
                "api/v1/namespaces/{}/services",
            )
            for o in _items(cluster, "/" + path.format(ns))
        }

    with VerificationPods(cluster, tmp_path, outputs):
        flow.install(session_for(kubeconfig, [node], ns), run_result(facts), clock=RealClock())
        before = objects()
        mark = kube.audit_mark()
        report = flow.install(session_for(kubeconfig, [node], ns), run_result(facts),
                              clock=RealClock())  # fmt: skip
    calls = gpustack_calls(kube.audit_events(mark))

    assert report.passed, report.to_dict()
    assert {a.action for a in report.applied} == {"unchanged"}
    assert objects() == before
    assert not [c for c in calls if c == ("patch", f"/api/v1/nodes/{node}")]  # labels right


def test_check_mode_changes_nothing_in_the_cluster(kube, kubeconfig, unique):
    ns, node = f"gs-{unique}", f"gpu1-{unique}"
    cluster = kube.stand_in()
    kwok_node(cluster, node, gpus=1)
    labels_before = cluster.raw("GET", f"/api/v1/nodes/{node}")["metadata"]["labels"]
    mark = kube.audit_mark()
    report = flow.install(
        session_for(kubeconfig, [node], ns),
        run_result({node: gpu_facts(node, 1)}),
        check=True,
        clock=RealClock(),
    )
    requests = gpustack_requests(kube.audit_events(mark))
    writes = [(verb, uri) for verb, uri in requests if verb not in ("get", "list", "watch")]

    actions = {(a.kind, a.name): a.action for a in report.applied}
    assert {a.action for a in report.applied if a.namespace == ns} == {"would create"}, actions
    assert report.labels[node]["nvidia.com/gpu.present"] == "true"
    assert report.nodes == []
    assert writes and all("dryRun=All" in uri for _, uri in writes), writes  # server dry run
    assert cluster.raw("GET", f"/api/v1/nodes/{node}")["metadata"]["labels"] == labels_before
    assert _items(cluster, f"/apis/apps/v1/namespaces/{ns}/daemonsets") == []
    names = {n["metadata"]["name"] for n in _items(cluster, "/api/v1/namespaces")}
    assert ns not in names


def _items(cluster, path: str) -> list[dict]:
    from kubernetes.client.exceptions import ApiException

    try:
        return cluster.raw("GET", path)["items"]
    except ApiException as exc:
        if exc.status == 404:
            return []
        raise
