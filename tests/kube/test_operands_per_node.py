"""The operands check judges each node by its own DaemonSet pods, against a real control plane.

gpustack's DaemonSets select nodes by label, so a node outside the inventory (or outside
--limit) that carries the labels gets their pods too, and the real DaemonSet controller counts
it in the DaemonSet's status. A crash-looping device plugin there must not fail the nodes
gpustack checks; one on a checked node must fail that node, by name.

Real: the API server, the DaemonSet controller (its pods' template labels and its status), the
scheduler. STAND-INS, each labelled: kwok plays the kubelet of the inventory's healthy node;
`StandInKubelet` (tests/kube/test_verify_flow.py) plays the kubelet of a node kwok does not
manage, and reports the device plugin's pod there as a kubelet reports a crash-looping
container (kwok would write its own status over it); `VerificationPods` plays the verification
container. No GPU, driver or container is involved: host facts are SIMULATED.
"""

from __future__ import annotations

import contextlib
import re
from datetime import UTC, datetime

import pytest
from kubernetes.client.exceptions import ApiException

from gpustack.k8s.cluster import flow
from gpustack.k8s.manifests import ClusterConfig, node_labels
from tests.builders import gpu_facts, inventory, run_result
from tests.kube.stand_ins import VerificationPods, kwok_node
from tests.kube.test_verify_flow import (
    RealClock,
    StandInKubelet,
    checks,
    one_gpu_seen,
    running,
)

pytestmark = pytest.mark.kube

WAIT = 30  # seconds for the operands (gpustack_k8s_daemonset_timeout)

PLUGIN = "nvidia-device-plugin"


def crash_looping_plugin(pod: dict, app: str = PLUGIN):
    """A kubelet's report of the device plugin's container exiting at each start, now in its
    restart back-off (pkg/kubelet/kuberuntime/kuberuntime_manager.go: waiting CrashLoopBackOff,
    "back-off %s restarting failed container=%s pod=%s"); gpustack's other operands run.
    `app`: the app.kubernetes.io/name of the pods that crash-loop."""
    if pod["metadata"]["labels"].get("app.kubernetes.io/name") != app:
        return running(pod)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    meta = pod["metadata"]
    described = f"{meta['name']}_{meta['namespace']}({meta['uid']})"
    statuses = [
        {"name": c["name"], "image": c["image"], "imageID": "", "ready": False,
         "started": False, "restartCount": 4,
         "state": {"waiting": {"reason": "CrashLoopBackOff", "message":
                               f"back-off 1m20s restarting failed container={c['name']} "
                               f"pod={described}"}},
         "lastState": {"terminated": {"exitCode": 1, "reason": "Error",
                                      "startedAt": now, "finishedAt": now}}}
        for c in pod["spec"]["containers"]
    ]  # fmt: skip
    unready = {"status": "False", "reason": "ContainersNotReady", "lastTransitionTime": now,
               "message": f"containers with unready status: [{pod['spec']['containers'][0]['name']}]"}  # fmt: skip
    status = {"phase": "Running", "startTime": now, "hostIP": "127.0.0.1",
              "conditions": [
                  {"type": "PodReadyToStartContainers", "status": "True",
                   "lastTransitionTime": now},
                  {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                  {"type": "Ready", **unready}, {"type": "ContainersReady", **unready},
                  {"type": "PodScheduled", "status": "True", "lastTransitionTime": now}],
              "containerStatuses": statuses}  # fmt: skip
    return status, None


def operand_labels(node: str) -> dict[str, str]:
    """The labels gpustack puts on a GPU node by default: on a node outside the inventory they
    are left over from an earlier install, or put there by hand."""
    labels = node_labels(gpu_facts(node, 1)["gpustack_preflight"], {}, ClusterConfig())
    return {k: v for k, v in labels.items() if v is not None}


def label(cluster, node: str) -> None:
    cluster.raw("PATCH", f"/api/v1/nodes/{node}", ctype="application/merge-patch+json",
                body={"metadata": {"labels": operand_labels(node)}})  # fmt: skip


def session(kubeconfig, ns, hosts):
    # the checked node's pods must be Ready for 5 s of the wait: 10 s was too short on a loaded
    # CI machine, and a timeout here costs only the case whose node never gets ready
    extravars = {"gpustack_k8s_namespace": ns, "gpustack_k8s_daemonset_timeout": WAIT}
    return flow.prepare(str(kubeconfig), inventory(kubeconfig.parent, hosts), extravars)


def plugin_status(cluster, ns) -> dict:
    return cluster.raw("GET", f"/apis/apps/v1/namespaces/{ns}/daemonsets/{PLUGIN}")["status"]


@pytest.fixture
def namespace(kube, unique):
    yield f"gs-{unique}"
    with contextlib.suppress(ApiException):
        kube.stand_in().raw("DELETE", f"/api/v1/namespaces/gs-{unique}")


def test_a_crash_looping_plugin_outside_the_inventory_fails_no_checked_node(
    kube, kubeconfig, unique, tmp_path, namespace
):
    ns, mine, other = namespace, f"gpu1-{unique}", f"other-{unique}"
    cluster = kube.stand_in()
    kwok_node(cluster, mine, gpus=1)
    facts = {mine: gpu_facts(mine, 1)}
    with (
        StandInKubelet(cluster, other, 1, crash_looping_plugin),
        VerificationPods(cluster, tmp_path, {mine: one_gpu_seen(mine, 1)}),
    ):
        label(cluster, other)  # not in the inventory, labelled for the operands
        installed = flow.install(session(kubeconfig, ns, [mine]), run_result(facts),
                                 clock=RealClock())  # fmt: skip
        status = plugin_status(cluster, ns)
        verified = flow.verify_cluster(session(kubeconfig, ns, [mine]), run_result(facts),
                                       clock=RealClock())  # fmt: skip

    for report in (installed, verified):
        assert report.passed, report.to_dict()
        assert checks(report, mine)["operands"] == (
            "passed", "dcgm-exporter, gpu-feature-discovery, nvidia-device-plugin")  # fmt: skip
        plugin = next(d for d in report.daemonsets if d.name == PLUGIN)
        assert plugin.ready and plugin.nodes == [mine]
        assert plugin.message == f"ready on 1 node(s); not Ready elsewhere (not checked): {other}"
    # the real controller counts the node outside: the DaemonSet as a whole is not ready
    assert (status["desiredNumberScheduled"], status["numberReady"]) == (2, 1), status


def test_the_checked_nodes_own_crash_looping_plugin_fails_it_by_name(
    kube, kubeconfig, unique, tmp_path, namespace
):
    ns, good, bad = namespace, f"gpu1-{unique}", f"gpu2-{unique}"
    cluster = kube.stand_in()
    kwok_node(cluster, good, gpus=1)
    facts = {good: gpu_facts(good, 1), bad: gpu_facts(bad, 1)}
    with (
        StandInKubelet(cluster, bad, 1, crash_looping_plugin),
        VerificationPods(cluster, tmp_path, {good: one_gpu_seen(good, 1)}),
    ):
        report = flow.install(session(kubeconfig, ns, [good, bad]), run_result(facts),
                              clock=RealClock())  # fmt: skip

    assert not report.passed
    assert checks(report, good)["operands"][0] == "passed", checks(report, good)
    status, message = checks(report, bad)["operands"]
    assert status == "failed"
    # the good node's operands got ready meanwhile (progress): the wait ended WAIT s after that
    assert re.match(rf"DaemonSet {PLUGIN} not ready after \d+ s, the last {WAIT} s without "
                    rf"progress: on {bad}: pod {PLUGIN}-", message), message  # fmt: skip
    assert (
        "Running, not Ready: container nvidia-device-plugin CrashLoopBackOff: back-off 1m20s "
        "restarting failed container=nvidia-device-plugin pod="
    ) in message
    assert "restarted 4 time(s)" in message
    assert "gpu-feature-discovery" not in message and "dcgm-exporter" not in message
    assert "capacity" not in checks(report, bad)
