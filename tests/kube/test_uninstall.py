"""`uninstall --components k8s` against a real control plane, and install's refusal of a
RuntimeClass of someone else's with another handler.

What is real: the API server (its discovery, label selectors, deletions, managedFields), the
garbage collector removing the deleted DaemonSets' pods, the DaemonSet controller and the
scheduler that roll out what `flow.install` applies, a RuntimeClass of someone else's as the API
server stores it. A deleted namespace is asserted Terminating or gone: its finalization is the
namespace controller's, in its own time.

STAND-INS: the nodes are kwok's, their "GPUs" allocatable numbers the test writes (no device
plugin, no GPU); the host facts are SIMULATED (tests/builders.py). The verification pods'
containers: in the uninstall tests they only "exit 0" (`verification_pods_exit`, no log, so
install's verification fails there: those tests use install to have gpustack's objects and node
labels in place and assert nothing of its verification); with a RuntimeClass of someone else's,
`VerificationPods` prints the `nvidia-smi -L` of a container given one GPU, served by kwok as the
pod's log, and install's verification must pass. kwok runs a pod under any RuntimeClass: that
the node's container runtime has the handler is not checked here (a real kubelet fails the pod's
sandbox otherwise: tests/kube/test_verify_flow.py's stand-in kubelet shows gpustack's report of
that).

Each test has its own namespace, RuntimeClass name and nodes (names ending in the test's
`unique`): the control plane is shared by the tests of a worker. `flow.uninstall` deletes
gpustack's cluster-scoped objects and node labels cluster-wide, so its lists may name objects
and nodes other tests left behind; the assertions read this test's own.
"""

from __future__ import annotations

import time

import pytest
from kubernetes.client.exceptions import ApiException

from gpustack.errors import GpustackError
from gpustack.k8s.cluster import connect, flow
from gpustack.k8s.cluster.connect import FIELD_MANAGER
from tests.builders import gpu_facts, inventory, run_result, smi_output, uuids_for
from tests.conftest import wait_until
from tests.kube.stand_ins import (
    VERIFY_SELECTOR,
    Outcome,
    VerificationPods,
    kwok_node,
    node_ready,
    verification_pods_exit,
)

pytestmark = pytest.mark.kube

JSON = "application/json"


class PollingClock:
    """Real time; waits poll at most every 50 ms (gpustack polls every second; kwok and the
    controllers answer within milliseconds). Timeouts are measured in real time."""

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, 0.05))


def group_vars(unique: str, namespace: str | None = None) -> dict[str, str]:
    runtime = f"nvidia-{unique}"
    return {
        "gpustack_k8s_namespace": namespace or f"gs-{unique}",
        "gpustack_k8s_runtime_class": runtime,
        "container_runtime_nvidia_name": runtime,
    }


def nodes_ready(cluster, *names: str) -> None:
    wait_until(lambda: all(node_ready(cluster.raw("GET", f"/api/v1/nodes/{n}")) for n in names),
               what=f"{', '.join(names)} Ready", timeout=30, interval=0.05)  # fmt: skip


def get_or_none(cluster, path: str):
    try:
        return cluster.raw("GET", path)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def test_uninstall_removes_only_gpustacks_objects_and_labels(kubeconfig, unique):
    ns, gpu, cpu = f"gs-{unique}", f"gpu1-{unique}", f"cpu1-{unique}"
    runtime = f"nvidia-{unique}"
    cluster = connect.connect(str(kubeconfig))
    kwok_node(cluster, gpu, gpus=1)
    kwok_node(cluster, cpu, labels={"team": "ml"})
    nodes_ready(cluster, gpu, cpu)
    inv = inventory(kubeconfig.parent, [gpu], **group_vars(unique))
    session = flow.prepare(str(kubeconfig), inv, {})
    with verification_pods_exit(kubeconfig, ns):
        report = flow.install(session, run_result({gpu: gpu_facts(gpu, 1)}), clock=PollingClock())
    assert report.daemonsets and all(d.ready for d in report.daemonsets), report.daemonsets
    assert report.labels[gpu], "gpustack labelled the node"
    # A user's own objects and labels, some in gpustack's namespace.
    cluster.raw("POST", f"/api/v1/namespaces/{ns}/configmaps", body={"metadata": {"name": "mine"}},
                ctype=JSON)  # fmt: skip
    cluster.raw("POST", "/apis/node.k8s.io/v1/runtimeclasses", ctype=JSON,
                body={"metadata": {"name": f"kata-{unique}"}, "handler": "kata"})  # fmt: skip
    cluster.raw("PATCH", f"/api/v1/nodes/{gpu}", body={"metadata": {"labels": {"team": "vision"}}},
                ctype="application/merge-patch+json")  # fmt: skip

    removed = flow.uninstall(session)

    assert f"RuntimeClass {runtime}" in removed["deleted"]
    assert f"DaemonSet {ns}/nvidia-device-plugin" in removed["deleted"]
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        assert f"{kind} {ns}/gpu-feature-discovery" in removed["deleted"]
    assert [n for n in removed["unlabelled_nodes"] if n.endswith(unique)] == [gpu]
    assert cluster.raw("GET", f"/apis/apps/v1/namespaces/{ns}/daemonsets")["items"] == []
    assert get_or_none(cluster, f"/apis/node.k8s.io/v1/runtimeclasses/{runtime}") is None
    assert get_or_none(cluster, f"/apis/node.k8s.io/v1/runtimeclasses/kata-{unique}") is not None
    # gpustack created the namespace, but a user's ConfigMap lives there: it stays.
    assert get_or_none(cluster, f"/api/v1/namespaces/{ns}/configmaps/mine") is not None
    assert removed["kept"] == [
        f"Namespace {ns} (it holds objects gpustack did not create: ConfigMap mine)"
    ]
    node = cluster.raw("GET", f"/api/v1/nodes/{gpu}")
    labels = node["metadata"]["labels"]
    assert labels["team"] == "vision" and labels["kubernetes.io/hostname"] == gpu
    assert not any(k.startswith("nvidia.com/") for k in labels)
    assert "gpustack.io/managed-labels" not in (node["metadata"].get("annotations") or {})
    assert cluster.raw("GET", f"/api/v1/nodes/{cpu}")["metadata"]["labels"]["team"] == "ml"
    verify_pods = cluster.raw("GET", f"/api/v1/namespaces/{ns}/pods",
                              [("labelSelector", VERIFY_SELECTOR)])["items"]  # fmt: skip
    assert verify_pods == []
    # The garbage collector removes the DaemonSets' pods (background propagation).
    wait_until(lambda: cluster.raw("GET", f"/api/v1/namespaces/{ns}/pods")["items"] == [],
               what=f"no pod left in {ns}", timeout=30, interval=0.05)  # fmt: skip
    # Again: nothing left to do, no error; without the user's object the namespace goes.
    cluster.raw("DELETE", f"/api/v1/namespaces/{ns}/configmaps/mine")
    again = flow.uninstall(session)
    assert again == {"deleted": [f"Namespace {ns}"], "kept": [], "unlabelled_nodes": []}
    # The API server took the deletion; the namespace controller finalizes it in its time.
    namespace = get_or_none(cluster, f"/api/v1/namespaces/{ns}")
    assert namespace is None or namespace["metadata"].get("deletionTimestamp"), namespace
    for name in (gpu, cpu):
        cluster.raw("DELETE", f"/api/v1/nodes/{name}")
    cluster.raw("DELETE", f"/apis/node.k8s.io/v1/runtimeclasses/kata-{unique}")


def test_uninstall_keeps_a_namespace_gpustack_did_not_create(kubeconfig, unique):
    ns = f"gpu-ops-{unique}"
    cluster = connect.connect(str(kubeconfig))
    cluster.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}}, ctype=JSON)
    inv = inventory(kubeconfig.parent, [f"gpu1-{unique}"], **group_vars(unique, ns))
    session = flow.prepare(str(kubeconfig), inv, {})
    removed = flow.uninstall(session)
    assert f"Namespace {ns}" not in removed["deleted"]
    namespace = cluster.raw("GET", f"/api/v1/namespaces/{ns}")
    assert "deletionTimestamp" not in namespace["metadata"]
    cluster.raw("DELETE", f"/api/v1/namespaces/{ns}")


def k3s_runtime_class(unique: str, handler: str) -> dict:
    """What k3s's deploy controller creates (k3s-io/k3s issue 8700), under the test's name."""
    return {"metadata": {"name": f"nvidia-{unique}",
                         "labels": {"objectset.rio.cattle.io/hash": "0123abcd"}},
            "handler": handler}  # fmt: skip


def test_a_runtimeclass_of_someone_elses_is_kept_and_verification_passes_with_it(
    kubeconfig, unique, tmp_path
):
    """k3s and the GPU Operator create RuntimeClass nvidia themselves: gpustack uses it as it is
    and leaves it to its owner on uninstall: the object keeps its labels and no field of it
    becomes gpustack's (managedFields), the DaemonSets' and the verification pod are admitted
    with it, and install's verification passes."""
    ns, gpu, runtime = f"gs-{unique}", f"gpu1-{unique}", f"nvidia-{unique}"
    cluster = connect.connect(str(kubeconfig))
    kwok_node(cluster, gpu, gpus=1)
    nodes_ready(cluster, gpu)
    theirs = k3s_runtime_class(unique, handler=runtime)
    cluster.raw("POST", "/apis/node.k8s.io/v1/runtimeclasses", body=theirs, ctype=JSON)
    inv = inventory(kubeconfig.parent, [gpu], **group_vars(unique))
    session = flow.prepare(str(kubeconfig), inv, {})

    outcome = Outcome(smi_output(uuids_for(gpu, 1)))
    with RuntimeClassRecorder(cluster, tmp_path, {gpu: outcome}) as verifying:
        report = flow.install(session, run_result({gpu: gpu_facts(gpu, 1)}), clock=PollingClock())

    assert report.passed, report.to_dict()
    actions = {(a.kind, a.name): a.action for a in report.applied}
    assert actions[("RuntimeClass", runtime)] == "kept (not gpustack's)"
    assert report.daemonsets and all(d.ready for d in report.daemonsets), report.daemonsets
    pods = cluster.raw("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
    plugin = [p for p in pods if p["metadata"]["name"].startswith("nvidia-device-plugin-")]
    assert [p["spec"].get("runtimeClassName") for p in plugin] == [runtime]
    assert list(verifying.runtime_classes.values()) == [runtime], verifying.runtime_classes
    stored = cluster.raw("GET", f"/apis/node.k8s.io/v1/runtimeclasses/{runtime}")
    assert stored["metadata"]["labels"] == theirs["metadata"]["labels"]
    managers = {m.get("manager") for m in stored["metadata"].get("managedFields") or []}
    assert FIELD_MANAGER not in managers, managers
    removed = flow.uninstall(session)
    assert f"RuntimeClass {runtime}" not in removed["deleted"]
    assert get_or_none(cluster, f"/apis/node.k8s.io/v1/runtimeclasses/{runtime}") is not None
    cluster.raw("DELETE", f"/api/v1/nodes/{gpu}")
    cluster.raw("DELETE", f"/apis/node.k8s.io/v1/runtimeclasses/{runtime}")


class RuntimeClassRecorder(VerificationPods):
    """`VerificationPods` (STAND-IN for the verification containers) that also records the
    RuntimeClass each verification pod ran with (gpustack deletes the pods before it returns)."""

    def __init__(self, cluster, directory, outcomes):
        super().__init__(cluster, directory, outcomes)
        self.runtime_classes: dict[str, str | None] = {}

    def _end(self, pod: dict, outcome: Outcome) -> None:
        self.runtime_classes[pod["metadata"]["name"]] = pod["spec"].get("runtimeClassName")
        super()._end(pod, outcome)


def test_a_runtimeclass_of_that_name_with_another_handler_is_refused(kubeconfig, unique):
    ns, gpu, runtime = f"gs-{unique}", f"gpu1-{unique}", f"nvidia-{unique}"
    cluster = connect.connect(str(kubeconfig))
    kwok_node(cluster, gpu, gpus=1)
    nodes_ready(cluster, gpu)
    cluster.raw("POST", "/apis/node.k8s.io/v1/runtimeclasses", ctype=JSON,
                body=k3s_runtime_class(unique, handler="runc"))  # fmt: skip
    session = flow.prepare(str(kubeconfig), inventory(kubeconfig.parent, [gpu], **group_vars(unique)), {})  # fmt: skip

    with pytest.raises(GpustackError) as info:
        flow.install(session, run_result({gpu: gpu_facts(gpu, 1)}), clock=PollingClock())

    assert "handler 'runc'" in info.value.message and "nothing was applied" in info.value.message
    assert "gpustack_k8s_runtime_class" in info.value.hint
    assert get_or_none(cluster, f"/api/v1/namespaces/{ns}") is None
    assert cluster.raw("GET", f"/apis/apps/v1/namespaces/{ns}/daemonsets")["items"] == []
    labels = cluster.raw("GET", f"/api/v1/nodes/{gpu}")["metadata"]["labels"]
    assert not [key for key in labels if key.startswith("nvidia.com/gpu.deploy")]
    runtime_class = cluster.raw("GET", f"/apis/node.k8s.io/v1/runtimeclasses/{runtime}")
    assert runtime_class["handler"] == "runc", "left as it was"
    cluster.raw("DELETE", f"/api/v1/nodes/{gpu}")
    cluster.raw("DELETE", f"/apis/node.k8s.io/v1/runtimeclasses/{runtime}")
