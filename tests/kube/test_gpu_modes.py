"""install + verify in every sharing mode (default, time-slicing, MPS, MIG single and mixed),
with and without Node Feature Discovery's API, on a real control plane; GFD's two output modes;
verification on a node whose GPUs are in use.

Real: the API server (server-side apply, admission, RBAC: every call the GFD stand-in makes is
made as GFD's ServiceAccount and judged against the Role gpustack rendered), the DaemonSet
controller placing the operands on the labelled node and computing their status, CRDs and API
discovery (NFD's API served or not), namespaces and garbage collection.

STAND-INS, each labelled (tests/kube/stand_ins.py, tests/kube/operand_stand_ins.py): kwok plays
the node's kubelet (operand pods go Running and Ready without running anything); the device
plugin's registration is the test's: the GPU resources NVIDIA's plugin registers with the
config gpustack rendered (time-slicing/MPS replicas × GPUs, MIG devices by strategy) appear on
the node only once gpustack's plugin pod runs there (under MPS also the MPS control daemon's);
GFD's NodeFeature output and nfd-master's labelling are the test's, as GFD v0.20.0 and NFD
v0.18.3 would do them; the verification container's `nvidia-smi -L` output and exit are the
test's, as a real allocation would show them (one unit: one of the host's GPUs, and under MIG
that GPU's MIG device), behind the kubelet's resource admission (kwok admits any pod bound to
its node). One node is not kwok's: where GFD must crash-loop, kwok would report its pod Ready
first (a race with gpustack's wait), so a stand-in plays that node's kubelet. The host facts and
GPUs are SIMULATED (tests/builders.py).

What only real operand images do cannot come from kwok and is not claimed here: the plugin
refusing requests above 1 under MPS (the test checks that gpustack asks for exactly 1), GFD
writing its features.d file in feature-file mode (the test checks the pod GFD would write it
from), and the labels GFD computes from NVML.
"""

from __future__ import annotations

import hashlib
import time

import pytest
from kubernetes.client.exceptions import ApiException

from gpustack.k8s.cluster import flow
from gpustack.upgrade.executors import RealClock
from tests.builders import gpu_facts, inventory, run_result, uuids_for
from tests.conftest import wait_until
from tests.kube.conftest import KWOK_NODE_ANNOTATION, gpustack_calls
from tests.kube.operand_stand_ins import (
    NFD_API,
    NODE_NAME_LABEL,
    NODEFEATURE_CRD,
    AdmittingVerificationPods,
    OperandStandIns,
    gfd_labels,
    wait_served,
)
from tests.kube.stand_ins import READY, Outcome, kwok_node

pytestmark = pytest.mark.kube

GPU = "nvidia.com/gpu"
PRODUCT = "NVIDIA A100-SXM4-80GB"  # gpu_facts' GPUs
JSON = "application/json"
MANAGED = "app.kubernetes.io/managed-by=gpustack"
GFD_SELECTOR = "app.kubernetes.io/name=gpu-feature-discovery"
FEATURES_D = "/etc/kubernetes/node-feature-discovery/features.d"
TIMEOUTS = {  # gpustack's minimum (gpustack/k8s/manifests_config.py), but for the operands'
    # wait: a node's pod must be Ready for 5 s of it, which a loaded CI machine took over 10 s for
    "gpustack_k8s_daemonset_timeout": 30,
    "gpustack_k8s_capacity_timeout": 10,
    "gpustack_k8s_verify_timeout": 10,
}
MIG_MIXED = {
    "nvidia.com/mig-1g.10gb": "8", "nvidia.com/mig-2g.20gb": "1",
    "nvidia.com/mig-3g.40gb": "3", "nvidia.com/mig-7g.80gb": "1",
}  # fmt: skip

# mode -> (extravars, what NVIDIA's device plugin registers on a 4-GPU host with the config
# gpustack renders, the capacity check's message, the resource a verification pod asks for,
# the MIG profile of the device it is given, GFD's sharing-strategy label and replicas)
MODES = {
    "default": ({}, {GPU: "4"}, "nvidia.com/gpu: 4", GPU, None, "none", 1),
    "time-slicing": ({"gpustack_k8s_time_slicing_replicas": "4"}, {GPU: "16"},
                     "nvidia.com/gpu: 16", GPU, None, "time-slicing", 4),
    "mps": ({"gpustack_k8s_mps_replicas": "4"}, {GPU: "16"}, "nvidia.com/gpu: 16", GPU, None,
            "mps", 4),
    # all four GPUs in MIG mode, 7 × 1g.10gb each
    "mig-single": ({"gpustack_k8s_mig_strategy": "single"}, {GPU: "28"}, "nvidia.com/gpu: 28",
                   GPU, "1g.10gb", "none", 1),
    # GPU 0: 7 × 1g.10gb, GPU 1: 2 × 3g.40gb, GPU 2: 3g.40gb + 2g.20gb + 1g.10gb, GPU 3: 7g.80gb
    "mig-mixed": ({"gpustack_k8s_mig_strategy": "mixed"}, MIG_MIXED,
                  "nvidia.com/mig-1g.10gb: 8, nvidia.com/mig-2g.20gb: 1, "
                  "nvidia.com/mig-3g.40gb: 3, nvidia.com/mig-7g.80gb: 1",
                  "nvidia.com/mig-1g.10gb", "1g.10gb", "none", 1),
}  # fmt: skip


class Scratch:
    """What a test made on the shared control plane, removed after it: its namespaces (pods
    first, at once, so that pods on a node no kubelet serves do not hold the namespace), its
    nodes, and gpustack's cluster-scoped RuntimeClass (the next test starts without it, as on a
    fresh cluster)."""

    def __init__(self, cluster):
        self.cluster = cluster
        self.namespaces: list[str] = []
        self.nodes: list[str] = []

    def namespace(self, name: str) -> str:
        self.namespaces.append(name)
        return name

    def node(self, name: str) -> str:
        self.nodes.append(name)
        return name

    def clean(self) -> None:
        raw = self.cluster.raw
        for ns in self.namespaces:
            try:
                pods = raw("GET", f"/api/v1/namespaces/{ns}/pods")["items"]
            except ApiException:
                continue
            for pod in pods:
                _gone(raw, f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}",
                      [("gracePeriodSeconds", 0)])  # fmt: skip
            _gone(raw, f"/api/v1/namespaces/{ns}")
        for node in self.nodes:
            _gone(raw, f"/api/v1/nodes/{node}")
        for rc in raw("GET", "/apis/node.k8s.io/v1/runtimeclasses",
                      [("labelSelector", MANAGED)])["items"]:  # fmt: skip
            _gone(raw, f"/apis/node.k8s.io/v1/runtimeclasses/{rc['metadata']['name']}")


def _gone(raw, path: str, query=None) -> None:
    try:
        raw("DELETE", path, query)
    except ApiException as exc:
        if exc.status != 404:
            raise


@pytest.fixture
def cluster(kube):
    return kube.stand_in()


@pytest.fixture
def scratch(cluster):
    made = Scratch(cluster)
    yield made
    made.clean()


@pytest.fixture
def nfd_api(cluster):
    """NFD's NodeFeature API served (its CRD), removed after the test: whether nfd-master runs
    is the test's choice (`OperandStandIns(nfd_master=...)`)."""
    path = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
    cluster.raw("POST", path, body=NODEFEATURE_CRD, ctype=JSON)
    try:
        wait_served(cluster, True)
        yield
    finally:
        _gone(cluster.raw, f"{path}/{NODEFEATURE_CRD['metadata']['name']}")
        wait_served(cluster, False)


def session_for(kubeconfig, hosts, namespace, extravars=None):
    variables = {**TIMEOUTS, "gpustack_k8s_namespace": namespace, **(extravars or {})}
    directory = kubeconfig.parent / namespace  # one inventory file per install
    directory.mkdir(exist_ok=True)
    return flow.prepare(str(kubeconfig), inventory(directory, hosts), variables)


def checks(report, node):
    found = next(n for n in report.nodes if n.host == node)
    return {c.name: (c.status, c.message) for c in found.checks}


def mig_uuid(gpu: str) -> str:
    h = hashlib.sha1(gpu.encode()).hexdigest()
    return f"MIG-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def smi(gpu: str, mig_profile: str | None = None) -> str:
    """`nvidia-smi -L` in a container given one unit: its GPU and, under MIG, that GPU's MIG
    device (the line format of a real A100/H100 in MIG mode)."""
    text = f"GPU 0: {PRODUCT} (UUID: {gpu})\n"
    if mig_profile:
        text += f"  MIG {mig_profile}     Device  0: (UUID: {mig_uuid(gpu)})\n"
    return text


def live_verification_pods(cluster, ns: str) -> list[dict]:
    pods = cluster.raw("GET", f"/api/v1/namespaces/{ns}/pods",
                       [("labelSelector", "gpustack.io/verify=true")])["items"]  # fmt: skip
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")]


def workload(cluster, node: str, ns: str, name: str, count: int = 1, resource: str = GPU) -> dict:
    """A user's GPU pod bound to the node (kwok runs it: SIMULATED workload)."""
    try:
        cluster.raw("POST", "/api/v1/namespaces", ctype=JSON,
                    body={"metadata": {"name": ns}})  # fmt: skip
    except ApiException as exc:
        if exc.status != 409:
            raise
    # the ServiceAccount admission plugin refuses pods until the namespace's `default` exists
    wait_until(lambda: _exists(cluster, f"/api/v1/namespaces/{ns}/serviceaccounts/default"),
               what=f"ServiceAccount {ns}/default")  # fmt: skip
    cluster.raw("POST", f"/api/v1/namespaces/{ns}/pods", ctype=JSON, body={
        "metadata": {"name": name},
        "spec": {"nodeName": node, "automountServiceAccountToken": False,
                 "containers": [{"name": "train", "image": "ml/train:1",
                                 "resources": {"limits": {resource: count}}}]}})  # fmt: skip
    path = f"/api/v1/namespaces/{ns}/pods/{name}"
    wait_until(lambda: cluster.raw("GET", path)["status"].get("phase") == "Running",
               what=f"pod {ns}/{name} Running")  # fmt: skip
    return cluster.raw("GET", path)


def _exists(cluster, path: str) -> bool:
    try:
        cluster.raw("GET", path)
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


def gfd_pod(cluster, ns: str, node: str) -> dict:
    pods = cluster.raw("GET", f"/api/v1/namespaces/{ns}/pods",
                       [("labelSelector", GFD_SELECTOR),
                        ("fieldSelector", f"spec.nodeName={node}")])["items"]  # fmt: skip
    assert len(pods) == 1, pods
    return pods[0]


def env(pod: dict, name: str) -> str | None:
    values = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0].get("env") or []}
    return values.get(name)


# ----------------------------------------------------------------------------- every mode


# Every mode without NFD's API; with it, three modes (the GFD and nfd-master stand-ins act
# the same in every mode, and a case costs seconds of wall time): the default, MPS (one more
# DaemonSet) and MIG mixed (no nvidia.com/gpu at all).
CASES = [(m, False) for m in MODES] + [(m, True) for m in ("default", "mps", "mig-mixed")]


@pytest.mark.parametrize(
    ("mode", "nfd"), CASES, ids=[f"{m}-{'nfd' if n else 'no-nfd'}" for m, n in CASES]
)
def test_install_and_verify_pass_in_every_mode(
    kube, kubeconfig, cluster, scratch, unique, tmp_path, request, mode, nfd
):
    """Each case: install and a second run pass; with NFD's API GFD's labels reach the node
    (the `gfd` check passes), without it GFD runs in feature-file mode and the check is skipped;
    every verification pod asks for exactly one unit (one replica under MPS)."""
    extravars, resources, capacity, resource, mig, sharing, replicas = MODES[mode]
    if nfd:
        request.getfixturevalue("nfd_api")
    ns, node = scratch.namespace(f"gs-{unique}"), scratch.node(f"gpu1-{unique}")
    kwok_node(cluster, node)  # GPU resources come from the device plugin stand-in
    facts = run_result({node: gpu_facts(node, 4)})
    gpu = uuids_for(node, 4)[-1]

    mark = kube.audit_mark()
    with OperandStandIns(kube, cluster, ns, node, resources=resources, mps=mode == "mps",
                         labels=gfd_labels(PRODUCT, 4, sharing, replicas), nfd_master=nfd,
                         tmp_path=tmp_path) as operands, \
            AdmittingVerificationPods(cluster, tmp_path, {node: Outcome(smi(gpu, mig))}) as pods:  # fmt: skip
        report = flow.install(session_for(kubeconfig, [node], ns, extravars), facts,
                              clock=RealClock())  # fmt: skip
        again = flow.verify_cluster(session_for(kubeconfig, [node], ns, extravars), facts,
                                    clock=RealClock())  # fmt: skip
    calls = gpustack_calls(kube.audit_events(mark))

    assert report.passed, report.to_dict()
    assert again.passed, again.to_dict()
    for result in (checks(report, node), checks(again, node)):
        assert result["operands"][0] == "passed"
        assert result["capacity"] == ("passed", capacity)
        assert result["pod"][0] == "passed"
        assert "UUID matches one of the host's" in result["pod"][1]
        if mig:
            assert f"(MIG device {mig_uuid(gpu)})" in result["pod"][1]
        if nfd:
            assert result["gfd"] == (
                "passed",
                "GFD labels present (nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB)",
            )
        else:
            assert result["gfd"][0] == "skipped"
            assert "GFD labels need Node Feature Discovery running" in result["gfd"][1]
    # one unit each time, of the resource the plugin registers for this mode (under MPS the
    # real plugin refuses more than one)
    assert pods.requests == [{resource: "1"}, {resource: "1"}] and pods.rejected == []
    assert calls.count(("create", f"/api/v1/namespaces/{ns}/pods")) == 2
    assert live_verification_pods(cluster, ns) == []
    daemonsets = cluster.raw("GET", f"/apis/apps/v1/namespaces/{ns}/daemonsets")["items"]
    names = {ds["metadata"]["name"] for ds in daemonsets}
    for ds in daemonsets:
        status = ds["status"]  # the real DaemonSet controller's, from kwok's Ready pods
        assert status["numberReady"] == status["desiredNumberScheduled"] >= 1, status
    on_node = cluster.raw("GET", f"/api/v1/namespaces/{ns}/pods",
                          [("fieldSelector", f"spec.nodeName={node}")])["items"]  # fmt: skip
    owners = {p["metadata"]["ownerReferences"][0]["name"] for p in on_node
              if p["metadata"].get("ownerReferences")}  # fmt: skip
    assert owners == names  # every operand runs on the node
    assert ("nvidia-device-plugin-mps-control-daemon" in names) == (mode == "mps")

    # GFD, in the mode NFD's API decides
    assert report.gfd_mode == ("node-feature-api" if nfd else "feature-file")
    assert report.nfd_api is nfd
    pod = gfd_pod(cluster, ns, node)
    assert pod["spec"]["serviceAccountName"] == "gpu-feature-discovery"
    assert env(pod, "USE_NODE_FEATURE_API") == str(nfd).lower()
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    assert operands.gfd_done and operands.gfd_errors == []
    labels = cluster.raw("GET", f"/api/v1/nodes/{node}")["metadata"]["labels"]
    if not nfd:
        # GFD writes features.d/gfd through a hostPath (the file is GFD's own, not kwok's);
        # without NFD nothing turns it into labels
        mounts = {m["mountPath"]: m["name"] for m in pod["spec"]["containers"][0]["volumeMounts"]}
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert volumes[mounts[FEATURES_D]]["hostPath"]["path"] == FEATURES_D
        assert "nvidia.com/gpu.product" not in labels
        return
    # GFD's ServiceAccount read its pod and created its NodeFeature in gpustack's namespace:
    # the real RBAC allowed it under the Role gpustack rendered
    feature = cluster.raw("GET", f"{NFD_API}/namespaces/{ns}/nodefeatures/"
                                 f"nvidia-features-for-{node}")  # fmt: skip
    assert feature["metadata"]["labels"] == {NODE_NAME_LABEL: node}
    # its owners: GFD's DaemonSet (from the pod the real DaemonSet controller made) and pod
    assert [r["kind"] for r in feature["metadata"]["ownerReferences"]] == ["DaemonSet", "Pod"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"  # the nfd-master stand-in


def test_operands_turned_off_are_removed_on_the_next_install(
    kube, kubeconfig, cluster, scratch, unique, tmp_path
):
    """MPS, GFD and dcgm-exporter on, then off: the next install deletes what gpustack applied
    for them in its namespace (DaemonSets, GFD's ServiceAccount and RBAC, dcgm-exporter's
    ConfigMap and Service) and takes their node labels off; check mode only says so."""
    ns, node = scratch.namespace(f"gs-{unique}"), scratch.node(f"gpu1-{unique}")
    kwok_node(cluster, node)
    facts = run_result({node: gpu_facts(node, 4)})
    gpu = uuids_for(node, 4)[-1]
    on, off = MODES["mps"][0], {"gpustack_k8s_gfd_enabled": "false",
                                "gpustack_k8s_dcgm_exporter_enabled": "false"}  # fmt: skip
    with OperandStandIns(kube, cluster, ns, node, resources={GPU: "16"}, mps=True,
                         tmp_path=tmp_path), \
            AdmittingVerificationPods(cluster, tmp_path, {node: Outcome(smi(gpu))}):  # fmt: skip
        first = flow.install(session_for(kubeconfig, [node], ns, on), facts, clock=RealClock())
    assert first.passed, first.to_dict()

    def present() -> set[str]:
        found = set()
        for kind, path in (("DaemonSet", f"/apis/apps/v1/namespaces/{ns}/daemonsets"),
                           ("ServiceAccount", f"/api/v1/namespaces/{ns}/serviceaccounts"),
                           ("Role", f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles"),
                           ("ConfigMap", f"/api/v1/namespaces/{ns}/configmaps"),
                           ("Service", f"/api/v1/namespaces/{ns}/services")):  # fmt: skip
            found |= {f"{kind} {ns}/{o['metadata']['name']}" for o in cluster.raw("GET", path)["items"]
                      if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by")
                      == "gpustack"}  # fmt: skip
        return found

    gone = {f"DaemonSet {ns}/nvidia-device-plugin-mps-control-daemon",
            f"DaemonSet {ns}/gpu-feature-discovery", f"DaemonSet {ns}/dcgm-exporter",
            f"ServiceAccount {ns}/gpu-feature-discovery", f"Role {ns}/gpu-feature-discovery",
            f"ConfigMap {ns}/dcgm-exporter-metrics", f"Service {ns}/dcgm-exporter"}  # fmt: skip
    before = present()
    assert gone <= before
    planned = flow.install(session_for(kubeconfig, [node], ns, off), facts, check=True)
    assert gone <= set(planned.removed) and present() == before, planned.removed
    with OperandStandIns(kube, cluster, ns, node, resources={GPU: "4"}, tmp_path=tmp_path), \
            AdmittingVerificationPods(cluster, tmp_path, {node: Outcome(smi(gpu))}):  # fmt: skip
        second = flow.install(session_for(kubeconfig, [node], ns, off), facts, clock=RealClock())

    assert second.passed, second.to_dict()
    assert gone <= set(second.removed), second.removed
    assert f"RoleBinding {ns}/gpu-feature-discovery" in second.removed
    assert not gone & present()
    assert [d.name for d in second.daemonsets] == ["nvidia-device-plugin"]
    labels = cluster.raw("GET", f"/api/v1/nodes/{node}")["metadata"]["labels"]
    assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
    for key in ("nvidia.com/mps.capable", "nvidia.com/gpu.deploy.gpu-feature-discovery",
                "nvidia.com/gpu.deploy.dcgm-exporter"):  # fmt: skip
        assert key not in labels, labels
    wait_until(lambda: {p["metadata"]["ownerReferences"][0]["name"] for p in cluster.raw(
        "GET", f"/api/v1/namespaces/{ns}/pods")["items"] if p["metadata"].get("ownerReferences")}
        == {"nvidia-device-plugin"}, what="only the device plugin's pod left", timeout=30)  # fmt: skip


# ----------------------------------------------------------------------------- GFD and NFD


def test_nfd_api_without_a_running_master_fails_the_gfd_check_plainly(
    kube, kubeconfig, cluster, scratch, unique, tmp_path, nfd_api
):
    """NFD's CRD left behind, NFD itself not running: GFD publishes, nobody labels the node."""
    ns, node = scratch.namespace(f"gs-{unique}"), scratch.node(f"gpu1-{unique}")
    kwok_node(cluster, node)
    facts = {node: gpu_facts(node, 1)}
    with OperandStandIns(kube, cluster, ns, node, resources={GPU: "1"},
                         labels=gfd_labels(PRODUCT, 1), tmp_path=tmp_path) as operands, \
            AdmittingVerificationPods(cluster, tmp_path,
                                      {node: Outcome(smi(uuids_for(node, 1)[0]))}):  # fmt: skip
        report = flow.install(session_for(kubeconfig, [node], ns), run_result(facts),
                              clock=RealClock())  # fmt: skip

    assert operands.gfd_errors == []
    status, message = checks(report, node)["gfd"]
    assert status == "failed"
    assert message.startswith("after 10 s: ")
    assert "GFD labels need Node Feature Discovery running" in message and "nfd-master" in message


def test_forcing_the_node_feature_api_without_nfd_crash_loops_gfd(
    kube, kubeconfig, cluster, scratch, unique, tmp_path
):
    """What upstream's default does without NFD: GFD's GET of its NodeFeature gets the real API
    server's 404 (nothing serves the group) and GFD exits.

    kwok would report the GFD pod Ready before any stand-in could fail it (a race with
    gpustack's wait), so this node is not kwok's: the stand-in plays its kubelet, reporting the
    operands' containers running and GFD's, once its call failed, crash-looping."""
    ns, node = scratch.namespace(f"gs-{unique}"), scratch.node(f"gpu1-{unique}")
    amounts = {"cpu": "32", "memory": "256Gi", "pods": "110"}
    cluster.raw("POST", "/api/v1/nodes", ctype=JSON, body={
        "metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}},
        "status": {"capacity": amounts, "allocatable": amounts,
                   "conditions": [{**READY[0], "reason": "KubeletReady",
                                   "lastHeartbeatTime": _now()}]}})  # fmt: skip
    assert KWOK_NODE_ANNOTATION not in (cluster.raw("GET", f"/api/v1/nodes/{node}")["metadata"]
                                        .get("annotations") or {})  # fmt: skip
    extravars = {"gpustack_k8s_gfd_mode": "node-feature-api"}
    with OperandStandIns(kube, cluster, ns, node, resources={GPU: "1"}, kubelet=True,
                         labels=gfd_labels(PRODUCT, 1), tmp_path=tmp_path) as operands:  # fmt: skip
        report = flow.install(session_for(kubeconfig, [node], ns, extravars),
                              run_result({node: gpu_facts(node, 1)}), clock=RealClock())  # fmt: skip

    status, message = checks(report, node)["operands"]
    assert status == "failed" and "DaemonSet gpu-feature-discovery not ready" in message, message
    assert "DaemonSet nvidia-device-plugin" not in message  # the others were ready
    assert report.gfd_mode == "node-feature-api" and report.nfd_api is False
    [error] = operands.gfd_errors
    # GFD's GET of its NodeFeature 404s (taken as "not there yet"), then its create 404s: the
    # real API server's answer for a group nobody serves
    assert error.startswith('failed to create NodeFeature object "nvidia-features-for-'), error
    assert "404 page not found" in error
    pod = gfd_pod(cluster, ns, node)
    container = pod["status"]["containerStatuses"][0]
    assert container["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert container["restartCount"] > 1
    ds = cluster.raw("GET", f"/apis/apps/v1/namespaces/{ns}/daemonsets/gpu-feature-discovery")
    assert ds["status"]["numberReady"] == 0  # the real controller, from the unready pod


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# ----------------------------------------------------------------------------- one unit


def test_verify_on_a_node_whose_gpus_are_in_use(kube, kubeconfig, cluster, scratch, unique,
                                                tmp_path):  # fmt: skip
    ns, node = scratch.namespace(f"gs-{unique}"), scratch.node(f"gpu1-{unique}")
    user_ns = scratch.namespace(f"ml-{unique}")
    kwok_node(cluster, node)
    uuids = uuids_for(node, 4)
    facts = {node: gpu_facts(node, 4)}
    with OperandStandIns(kube, cluster, ns, node, resources={GPU: "4"}, tmp_path=tmp_path), \
            AdmittingVerificationPods(cluster, tmp_path, {node: Outcome(smi(uuids[-1]))}) as pods:  # fmt: skip
        assert flow.install(session_for(kubeconfig, [node], ns), run_result(facts),
                            clock=RealClock()).passed  # fmt: skip
        # three of the four GPUs taken: the fourth is the one a verification pod gets
        busy = [workload(cluster, node, user_ns, f"train-{i}") for i in range(3)]
        report = flow.verify_cluster(session_for(kubeconfig, [node], ns), run_result(facts),
                                     clock=RealClock())  # fmt: skip

    assert report.passed, report.to_dict()
    assert "1 nvidia.com/gpu of 1 free" in checks(report, node)["pod"][1]
    assert pods.rejected == [] and pods.requests == [{GPU: "1"}, {GPU: "1"}]
    for before in busy:
        name = before["metadata"]["name"]
        after = cluster.raw("GET", f"/api/v1/namespaces/{user_ns}/pods/{name}")
        assert after["metadata"]["uid"] == before["metadata"]["uid"]  # never disturbed
        assert after["status"]["phase"] == "Running"
        assert "deletionTimestamp" not in after["metadata"]
        assert after["status"]["containerStatuses"][0]["restartCount"] == 0


def test_verify_on_a_node_whose_gpus_are_all_in_use_starts_no_pod(
    kube, kubeconfig, cluster, scratch, unique, tmp_path
):
    ns, node = scratch.namespace(f"gs-{unique}"), scratch.node(f"gpu1-{unique}")
    user_ns = scratch.namespace(f"ml-{unique}")
    kwok_node(cluster, node)
    facts = {node: gpu_facts(node, 2)}
    with OperandStandIns(kube, cluster, ns, node, resources={GPU: "2"}, tmp_path=tmp_path), \
            AdmittingVerificationPods(cluster, tmp_path,
                                      {node: Outcome(smi(uuids_for(node, 2)[-1]))}):  # fmt: skip
        assert flow.install(session_for(kubeconfig, [node], ns), run_result(facts),
                            clock=RealClock()).passed  # fmt: skip
        workload(cluster, node, user_ns, "big", count=2)
        mark = kube.audit_mark()
        report = flow.verify_cluster(session_for(kubeconfig, [node], ns), run_result(facts),
                                     clock=RealClock())  # fmt: skip
    calls = gpustack_calls(kube.audit_events(mark))

    status, message = checks(report, node)["pod"]
    assert status == "skipped" and report.passed
    assert f"every GPU unit is in use (2/2 nvidia.com/gpu) by {user_ns}/big" in message
    assert [c for c in calls if c[0] == "create"] == []  # no pod, nothing else written
    pod = cluster.raw("GET", f"/api/v1/namespaces/{user_ns}/pods/big")
    assert pod["status"]["phase"] == "Running" and "deletionTimestamp" not in pod["metadata"]


def test_mig_mixed_all_mig_node_counts_mig_resources(kube, kubeconfig, cluster, scratch, unique,
                                                     tmp_path):  # fmt: skip
    """Both GPUs in MIG mode (2 × 3g.40gb each) under the mixed strategy: the plugin registers
    nvidia.com/mig-3g.40gb only, no nvidia.com/gpu."""
    ns, node = scratch.namespace(f"gs-{unique}"), scratch.node(f"gpu1-{unique}")
    kwok_node(cluster, node)
    gpu = uuids_for(node, 2)[1]
    extravars = {"gpustack_k8s_mig_strategy": "mixed"}
    with OperandStandIns(kube, cluster, ns, node, resources={"nvidia.com/mig-3g.40gb": "4"},
                         tmp_path=tmp_path), \
            AdmittingVerificationPods(cluster, tmp_path,
                                      {node: Outcome(smi(gpu, "3g.40gb"))}) as pods:  # fmt: skip
        report = flow.install(session_for(kubeconfig, [node], ns, extravars),
                              run_result({node: gpu_facts(node, 2)}), clock=RealClock())  # fmt: skip

    assert report.passed, report.to_dict()
    allocatable = cluster.raw("GET", f"/api/v1/nodes/{node}")["status"]["allocatable"]
    assert GPU not in allocatable and allocatable["nvidia.com/mig-3g.40gb"] == "4"
    assert checks(report, node)["capacity"] == ("passed", "nvidia.com/mig-3g.40gb: 4")
    assert pods.requests == [{"nvidia.com/mig-3g.40gb": "1"}]
    assert f"MIG device {mig_uuid(gpu)}" in checks(report, node)["pod"][1]
