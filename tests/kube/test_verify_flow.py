"""Waiting and verification outcomes of install's Kubernetes phase against a real control plane.

Real: the API server (admission, status subresources, events, `pods/NAME/log` proxied to the
node's kubelet endpoint, CRDs), the DaemonSet controller and its status, the scheduler, the
node lifecycle controller's taints, namespaces and garbage collection. Timeouts are real too: each "times out" test
waits gpustack's minimum (10 s).

The dcgm-exporter scrape goes through the real API server's service proxy, to the address the
real endpoints controller lists for the dcgm-exporter pod: there a stand-in answers (below).

STAND-INS, each labelled where it is used:
- kwok plays the kubelets of the nodes annotated for it (operand pods go Running and Ready
  without running anything); a node's `nvidia.com/gpu` is what the test writes, as a device
  plugin would register it;
- `VerificationPods` plays the verification containers on kwok nodes (their `nvidia-smi -L`
  output and exit code), served through the API server's `pods/NAME/log` by kwok;
- `StandInKubelet` plays the kubelet of a node kwok does not manage, for what kwok cannot
  produce: a container whose image cannot be pulled, a pod sandbox that cannot be created, a
  kubelet that never reports a pod. It writes pod statuses and events in the kubelet's words
  (pkg/kubelet of the Kubernetes version under test);
- the ServiceMonitor CRD is a schema-less stand-in for the Prometheus Operator's;
- `DcgmExporter` plays dcgm-exporter's container: an HTTP server on this machine's non-loopback
  address (the proxy refuses loopback) at the pod's declared port, serving a /metrics body the
  test writes, and the pod's IP rewritten to that address as a kubelet would report it (kwok's
  pod IPs lead nowhere).
No GPU, driver or container is involved: the host facts are SIMULATED (tests/builders.py).
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import uuid
from datetime import UTC, datetime

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from gpustack.k8s.cluster import flow
from gpustack.k8s.cluster.pods import RUN_LABEL
from gpustack.k8s.manifests import METRICS_PORT
from gpustack.lab import components
from tests.builders import (
    gpu_facts,
    inventory,
    no_gpu_facts,
    run_result,
    smi_output,
    uuids_for,
)
from tests.conftest import wait_until
from tests.kube.conftest import KWOK_NODE_ANNOTATION, gpustack_calls, gpustack_requests
from tests.kube.stand_ins import DcgmExporter, Outcome, VerificationPods, non_loopback_ip

pytestmark = pytest.mark.kube

JSON = "application/json"
MERGE = "application/merge-patch+json"
VERIFY_IMAGE = "nvcr.io/nvidia/cuda:12.9.1-base-ubuntu22.04"
PLUGIN = "app.kubernetes.io/name=nvidia-device-plugin"
MINIMUM = 10  # gpustack's smallest daemonset/capacity/verify timeout (manifests_config.py)


@pytest.fixture(autouse=True)
def _leave_nothing_behind(kube, unique):
    """The control plane is shared by the worker's tests: the nodes a test adds go when it
    ends (a node left labelled for gpustack's operands would get every later test's DaemonSet
    pods, and count in its DaemonSets' status), and so does its namespace (gs-UNIQUE), with
    what gpustack put in it (not waited for)."""
    cluster = kube.stand_in()
    before = {n["metadata"]["name"] for n in cluster.raw("GET", "/api/v1/nodes")["items"]}
    yield
    for node in cluster.raw("GET", "/api/v1/nodes")["items"]:
        if node["metadata"]["name"] not in before:
            with contextlib.suppress(ApiException):
                cluster.raw("DELETE", f"/api/v1/nodes/{node['metadata']['name']}")
    with contextlib.suppress(ApiException):
        cluster.raw("DELETE", f"/api/v1/namespaces/gs-{unique}")


def kwok_gpu_node(cluster, name: str, gpus: int = 0) -> None:
    """A kwok node (kwok plays its kubelet) with `gpus` nvidia.com/gpu in capacity and
    allocatable: a STAND-IN for what NVIDIA's device plugin would register on a GPU node."""
    amounts = {"cpu": "32", "memory": "256Gi", "pods": "110"}
    if gpus:
        amounts["nvidia.com/gpu"] = str(gpus)
    cluster.raw("POST", "/api/v1/nodes", ctype=JSON, body={
        "metadata": {"name": name, "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                     "labels": {"kubernetes.io/hostname": name}},
        "status": {"capacity": amounts, "allocatable": amounts}})  # fmt: skip


class RealClock:
    """Real time, polled more often: gpustack's waits sleep at most POLL s between looks (it
    asks for 1 s), so a wait ends soon after what it waits for; a timeout still takes its
    real seconds. `on_sleep()` lets a test act while gpustack waits (before each sleep)."""

    POLL = 0.25

    def __init__(self):
        self.on_sleep = None

    def now(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if self.on_sleep:
            self.on_sleep()
        time.sleep(min(seconds, self.POLL))


def install(kubeconfig, ns, facts, hostvars=None, extravars=None, failed=(), clock=None):
    session = flow.prepare(
        str(kubeconfig),
        inventory(kubeconfig.parent, list(facts), hostvars),
        {"gpustack_k8s_namespace": ns, **(extravars or {})},
    )
    return flow.install(session, run_result(facts, failed), clock=clock or RealClock())


def checks(report, host):
    node = next(n for n in report.nodes if n.host == host)
    return {c.name: (c.status, c.message) for c in node.checks}


def verify_pods(cluster, ns) -> list[dict]:
    """Verification pods still there (a pod being deleted does not count)."""
    pods = cluster.raw("GET", f"/api/v1/namespaces/{ns}/pods", [("labelSelector", RUN_LABEL)])
    return [p for p in pods["items"] if not p["metadata"].get("deletionTimestamp")]


def labels_of(cluster, node) -> dict:
    return cluster.raw("GET", f"/api/v1/nodes/{node}")["metadata"].get("labels") or {}


def one_gpu_seen(host, count) -> Outcome:
    """What `nvidia-smi -L` prints in a pod given one of the host's GPUs by the device plugin."""
    return Outcome(smi_output(uuids_for(host, count)[-1:]))


class PodRecorder:
    """Keeps each verification pod of namespace `ns` as the API server first served it
    (`pods`, by name): gpustack deletes them before it returns."""

    def __init__(self, cluster, ns: str):
        self.cluster, self.ns = cluster, ns
        self.pods: dict[str, dict] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PodRecorder:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            with contextlib.suppress(ApiException):
                for pod in verify_pods(self.cluster, self.ns):
                    self.pods.setdefault(pod["metadata"]["name"], pod)

    def in_order(self) -> list[dict]:
        """The pods in the order they were first seen."""
        return list(self.pods.values())


# ----------------------------------------------------------------------------- stand-in kubelet


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _conditions(ready: bool, sandbox: bool = True) -> list[dict]:
    """The pod conditions a kubelet writes (pkg/kubelet/status/generate.go)."""
    now = _now()
    flag = "True" if ready else "False"
    unready = {} if ready else {"reason": "ContainersNotReady"}
    return [
        {"type": "PodReadyToStartContainers", "status": "True" if sandbox else "False",
         "lastTransitionTime": now},
        {"type": "Initialized", "status": "True", "lastTransitionTime": now},
        {"type": "Ready", "status": flag, "lastTransitionTime": now, **unready},
        {"type": "ContainersReady", "status": flag, "lastTransitionTime": now, **unready},
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
    ]  # fmt: skip


def _containers(pod: dict, state: dict, ready: bool) -> list[dict]:
    return [
        {"name": c["name"], "image": c["image"], "imageID": "", "ready": ready,
         "restartCount": 0, "started": ready, "state": state}
        for c in pod["spec"]["containers"]
    ]  # fmt: skip


def running(pod: dict):
    """A kubelet's report of a pod whose containers started and are ready."""
    return {"phase": "Running", "startTime": _now(), "hostIP": "127.0.0.1",
            "conditions": _conditions(True),
            "containerStatuses": _containers(pod, {"running": {"startedAt": _now()}}, True),
            }, None  # fmt: skip


def image_not_found(pod: dict):
    """A kubelet's report of a container whose image the registry does not have
    (pkg/kubelet/images/image_manager.go: "Failed to pull image %q: %v", reason ErrImagePull;
    the same words in a Warning event, reason Failed)."""
    image = pod["spec"]["containers"][0]["image"]
    text = (f'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to pull '
            f'and unpack image "{image}": failed to resolve reference "{image}": '
            f'{image}: not found')  # fmt: skip
    state = {"waiting": {"reason": "ErrImagePull", "message": text}}
    return {"phase": "Pending", "startTime": _now(), "hostIP": "127.0.0.1",
            "conditions": _conditions(False),
            "containerStatuses": _containers(pod, state, False)}, ("Failed", text)  # fmt: skip


def sandbox_fails(pod: dict):
    """A kubelet's report of a pod whose sandbox the container runtime cannot create (no
    runtime for the RuntimeClass's handler): waiting ContainerCreating with no message; the
    reason is only in a Warning event (pkg/kubelet/kuberuntime/kuberuntime_manager.go)."""
    handler = pod["spec"].get("runtimeClassName") or "runc"
    text = ("Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get "
            f'sandbox runtime: no runtime for "{handler}" is configured')  # fmt: skip
    state = {"waiting": {"reason": "ContainerCreating"}}
    return {"phase": "Pending", "startTime": _now(), "hostIP": "127.0.0.1",
            "conditions": _conditions(False, sandbox=False),
            "containerStatuses": _containers(pod, state, False),
            }, ("FailedCreatePodSandBox", text)  # fmt: skip


def never_reported(pod: dict):
    """A kubelet that never syncs the pod: no status beyond what the API server set."""
    return None


class StandInKubelet:
    """STAND-IN for the kubelet of node `name`, which kwok does not manage: the test creates
    the Node (Ready, `gpus` nvidia.com/gpu as a device plugin would register them) and a thread
    reports each pod bound to it once, as `policy(pod)` says: (status, (event reason, message)
    or None), or None to leave the pod without a status. Its kubelet endpoint is kwok's
    server, so that `pods/NAME/log` of a `VerificationPods` stand-in answers there too. Use as a
    context manager: it starts reporting on entry (or at `start()`, with `late=True`: a kubelet
    slow to start) and the node is deleted on exit."""

    def __init__(self, cluster, name: str, gpus: int, policy, late: bool = False):
        self.cluster, self.name, self.policy = cluster, name, policy
        self.reported: dict[str, str] = {}  # pod name -> phase written
        self.errors: list[str] = []
        self.late = late
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        amounts = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
        now = _now()
        cluster.raw("POST", "/api/v1/nodes", ctype=JSON, body={
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
            "status": {"capacity": amounts, "allocatable": amounts,
                       "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                                     {"type": "Hostname", "address": name}],
                       "daemonEndpoints": {"kubeletEndpoint": {"Port": kwok_port(cluster)}},
                       "conditions": [{"type": "Ready", "status": "True",
                                       "reason": "KubeletReady", "message": "stand-in",
                                       "lastHeartbeatTime": now, "lastTransitionTime": now}]}})  # fmt: skip

    def __enter__(self) -> StandInKubelet:
        if not self.late:
            self.start()
        return self

    def start(self) -> None:
        self._thread.start()

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        # what a kubelet does for pods being deleted, done at once for those left on the node
        pods = self.cluster.raw("GET", "/api/v1/pods",
                                [("fieldSelector", f"spec.nodeName={self.name}")])["items"]  # fmt: skip
        for pod in pods:
            ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            with contextlib.suppress(ApiException):
                self.cluster.raw("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}",
                                 [("gracePeriodSeconds", 0)])  # fmt: skip
        with contextlib.suppress(ApiException):
            self.cluster.raw("DELETE", f"/api/v1/nodes/{self.name}")
        assert not self.errors, self.errors

    def _run(self) -> None:
        seen: set[str] = set()
        while not self._stop.wait(0.1):
            try:
                pods = self.cluster.raw("GET", "/api/v1/pods",
                                        [("fieldSelector", f"spec.nodeName={self.name}")])  # fmt: skip
                for pod in pods["items"]:
                    uid = pod["metadata"]["uid"]
                    if uid not in seen and not pod["metadata"].get("deletionTimestamp"):
                        seen.add(uid)
                        self._report(pod)
            except Exception as exc:  # reported by __exit__: a thread cannot fail the test
                self.errors.append(f"{type(exc).__name__}: {exc}")
                return

    def _report(self, pod: dict) -> None:
        answer = self.policy(pod)
        if answer is None:
            return
        status, event = answer
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        self.cluster.raw("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", ctype=MERGE,
                         body={"status": status})  # fmt: skip
        self.reported[name] = status["phase"]
        if event:
            reason, message = event
            now = _now()
            self.cluster.raw("POST", f"/api/v1/namespaces/{ns}/events", ctype=JSON, body={
                "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": ns},
                "involvedObject": {"kind": "Pod", "namespace": ns, "name": name,
                                   "uid": pod["metadata"]["uid"], "apiVersion": "v1"},
                "reason": reason, "message": message, "type": "Warning",
                "source": {"component": "kubelet", "host": self.name},
                "firstTimestamp": now, "lastTimestamp": now, "count": 1})  # fmt: skip


def kwok_port(cluster) -> int:
    """The port of kwok's kubelet server (where the API server asks kwok's nodes for logs),
    read from a kwok node's status; a node is made to read it from when none exists yet."""

    def port():
        for node in cluster.raw("GET", "/api/v1/nodes")["items"]:
            if KWOK_NODE_ANNOTATION in (node["metadata"].get("annotations") or {}):
                found = (node["status"].get("daemonEndpoints") or {}).get("kubeletEndpoint")
                if (found or {}).get("Port"):
                    return found["Port"]
        return 0

    if not port():
        kwok_gpu_node(cluster, f"kwok-port-{uuid.uuid4().hex[:6]}")
    return wait_until(port, what="a kwok node's kubelet endpoint", timeout=30, interval=0.1)


def operands_run(special):
    """A policy: pods of gpustack's DaemonSets run; gpustack's verification pods get
    `special(pod)`."""
    return lambda pod: special(pod) if RUN_LABEL in pod["metadata"]["labels"] else running(pod)


# ----------------------------------------------------------------------------- tests


def test_waits_for_daemonsets_to_become_ready(kube, kubeconfig, unique, tmp_path):
    ns, node = f"gs-{unique}", f"gpu1-{unique}"
    cluster = kube.stand_in()
    clock = RealClock()
    start, started = time.monotonic(), {}
    # the node's kubelet is slow: it starts reporting pods once the real DaemonSet controller
    # has placed all three operands there and gpustack has waited at least 3 s
    kubelet = StandInKubelet(cluster, node, 1, running, late=True)

    def kubelet_starts_late():
        if started or time.monotonic() - start < 3:
            return
        daemonsets = _daemonsets(cluster, ns)
        if len(daemonsets) == 3 and all(
            d["status"].get("desiredNumberScheduled") == d["status"].get("currentNumberScheduled")
            == 1 for d in daemonsets
        ):  # fmt: skip
            started.update(at=time.monotonic(), daemonsets=daemonsets)
            kubelet.start()

    clock.on_sleep = kubelet_starts_late
    with kubelet, VerificationPods(cluster, tmp_path, {node: one_gpu_seen(node, 1)}):
        report = install(kubeconfig, ns, {node: gpu_facts(node, 1)}, clock=clock,
                         extravars={"gpustack_k8s_daemonset_timeout": 60})  # fmt: skip
    done = time.monotonic()

    assert report.passed, report.to_dict()
    assert all(d.ready for d in report.daemonsets)
    # when the kubelet started, gpustack was still waiting: no operand was ready
    assert started, "the DaemonSet controller never placed the operands"
    assert all(d["status"].get("numberReady", 0) == 0 for d in started["daemonsets"]), started
    assert done - started["at"] < 30  # it polled until the pods ran, not to the 60 s timeout


def _daemonsets(cluster, ns) -> list[dict]:
    return cluster.raw("GET", f"/apis/apps/v1/namespaces/{ns}/daemonsets")["items"]


def test_daemonsets_never_ready_fail_the_node(kube, kubeconfig, unique):
    ns, node = f"gs-{unique}", f"gpu1-{unique}"
    cluster = kube.stand_in()

    def plugin_image_missing(pod):  # not mirrored into this (air-gapped) registry
        name = pod["metadata"]["labels"].get("app.kubernetes.io/name")
        return image_not_found(pod) if name == "nvidia-device-plugin" else running(pod)

    mark = kube.audit_mark()
    with StandInKubelet(cluster, node, 1, plugin_image_missing) as kubelet:
        report = install(kubeconfig, ns, {node: gpu_facts(node, 1)},
                         extravars={"gpustack_k8s_daemonset_timeout": MINIMUM})  # fmt: skip
        pods = cluster.raw("GET", f"/api/v1/namespaces/{ns}/pods", [("labelSelector", PLUGIN)])
        daemonsets = {d["metadata"]["name"]: d["status"] for d in _daemonsets(cluster, ns)}
    calls = gpustack_calls(kube.audit_events(mark))

    assert not report.passed
    status, message = checks(report, node)["operands"]
    assert status == "failed"
    # the other operands got ready meanwhile (progress): the wait ended MINIMUM s after that
    assert re.match(rf"DaemonSet nvidia-device-plugin not ready after \d+ s, the last {MINIMUM} s "
                    rf"without progress: on {node}: pod nvidia-device-plugin-", message), message  # fmt: skip
    assert "not Ready: container nvidia-device-plugin ErrImagePull: Failed to pull" in message
    assert "gpu-feature-discovery" not in message and "dcgm-exporter" not in message
    assert "capacity" not in checks(report, node)
    assert ("create", f"/api/v1/namespaces/{ns}/pods") not in calls
    # the real controller placed the plugin's pod, and counts it unavailable
    plugin = daemonsets["nvidia-device-plugin"]
    assert (plugin["desiredNumberScheduled"], plugin["numberReady"]) == (1, 0), plugin
    assert plugin["numberUnavailable"] == 1, plugin
    assert daemonsets["dcgm-exporter"]["numberReady"] == 1, daemonsets
    [pod] = pods["items"]
    assert kubelet.reported[pod["metadata"]["name"]] == "Pending"
    assert pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ErrImagePull"


def test_capacity_timeout_says_what_was_expected(kube, kubeconfig, unique, tmp_path):
    ns, node = f"gs-{unique}", f"gpu1-{unique}"
    cluster = kube.stand_in()
    # STAND-IN for a device plugin that reports one of the two GPUs unhealthy (fell off the
    # bus): it stays in capacity, not in allocatable. Written when the node is created: a later
    # write would race kwok's first status update of the node, which writes allocatable back.
    amounts = {"cpu": "32", "memory": "256Gi", "pods": "110"}
    cluster.raw("POST", "/api/v1/nodes", ctype=JSON, body={
        "metadata": {"name": node, "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                     "labels": {"kubernetes.io/hostname": node}},
        "status": {"capacity": {**amounts, "nvidia.com/gpu": "2"},
                   "allocatable": {**amounts, "nvidia.com/gpu": "1"}}})  # fmt: skip
    mark = kube.audit_mark()
    started = time.monotonic()
    with VerificationPods(cluster, tmp_path, {node: one_gpu_seen(node, 2)}):
        report = install(kubeconfig, ns, {node: gpu_facts(node, 2)},
                         extravars={"gpustack_k8s_capacity_timeout": MINIMUM})  # fmt: skip
    took = time.monotonic() - started
    calls = gpustack_calls(kube.audit_events(mark))

    status, message = checks(report, node)["capacity"]
    assert status == "failed"
    assert f"allocatable nvidia.com/gpu is 1 after {MINIMUM} s, expected 2 (2 GPU(s))" in message
    assert "device plugin" in message
    assert next(c for c in report.nodes[0].checks if c.name == "capacity").seconds >= MINIMUM
    assert took < MINIMUM + 30
    assert ("create", f"/api/v1/namespaces/{ns}/pods") not in calls
    got = cluster.raw("GET", f"/api/v1/nodes/{node}")["status"]
    assert (got["capacity"]["nvidia.com/gpu"], got["allocatable"]["nvidia.com/gpu"]) == ("2", "1")


def test_time_slicing_capacity_and_a_one_unit_verification_pod(kube, kubeconfig, unique, tmp_path):
    ns, node = f"gs-{unique}", f"gpu1-{unique}"
    cluster = kube.stand_in()
    kwok_gpu_node(cluster, node, gpus=8)  # STAND-IN: 2 GPUs × 4 time-slicing replicas
    # a time-sliced replica is a whole GPU to the container: nvidia-smi lists one of the host's
    with (
        PodRecorder(cluster, ns) as pods,
        VerificationPods(cluster, tmp_path, {node: one_gpu_seen(node, 2)}),
    ):
        report = install(kubeconfig, ns, {node: gpu_facts(node, 2)},
                         extravars={"gpustack_k8s_time_slicing_replicas": "4"})  # fmt: skip

    assert report.passed, report.to_dict()
    assert checks(report, node)["capacity"] == ("passed", "nvidia.com/gpu: 8")
    resources = [p["spec"]["containers"][0]["resources"] for p in pods.in_order()]
    # as the API server stored it: quantities are strings
    assert resources == [{"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}]


def test_pod_failed_reports_exit_code_and_log(kube, kubeconfig, unique, tmp_path):
    ns, node = f"gs-{unique}", f"gpu1-{unique}"
    cluster = kube.stand_in()
    kwok_gpu_node(cluster, node, gpus=1)
    # SIMULATED host-side failure of the verification container (a broken runtime hook)
    failed = Outcome("Failed to initialize NVML: Unknown Error\n", exit_code=255)
    with VerificationPods(cluster, tmp_path, {node: failed}) as pods:
        report = install(kubeconfig, ns, {node: gpu_facts(node, 1)})

    status, message = checks(report, node)["pod"]
    assert status == "failed"
    assert "failed: Error (exit code 255)" in message
    assert "log: Failed to initialize NVML: Unknown Error" in message  # read through the API
    assert len(pods.handled) == 1
    assert verify_pods(cluster, ns) == []


SANDBOX = 'no runtime for "nvidia" is configured'


@pytest.fixture(scope="module")
def stuck(kube, tmp_path_factory):
    """One install, three nodes whose verification pods never leave Pending, so that the two
    tests below share one verification timeout: on `pull` the kubelet cannot pull the CUDA
    image (not mirrored); on `hung` it never reports the pod and another component's Warning
    event says why; on `sandbox` it reports a bare ContainerCreating, as a kubelet does when
    the pod's sandbox cannot be created, and the why is only in its event.
    Returns (report, {role: node}, verification pods left afterwards)."""
    unique = uuid.uuid4().hex[:6]
    ns = f"gs-{unique}"
    nodes = {role: f"{role}-{unique}" for role in ("pull", "hung", "sandbox")}
    cluster = kube.stand_in()
    kubeconfig = tmp_path_factory.mktemp("stuck") / "kubeconfig"
    kubeconfig.write_bytes(kube.kubeconfig.read_bytes())

    def another_component_reports(pod):
        name, pns = pod["metadata"]["name"], pod["metadata"]["namespace"]
        cluster.raw("POST", f"/api/v1/namespaces/{pns}/events", ctype=JSON, body={
            "metadata": {"name": f"{name}.e1", "namespace": pns},
            "involvedObject": {"kind": "Pod", "namespace": pns, "name": name},
            "reason": "FailedCreatePodSandBox", "type": "Warning", "message": SANDBOX,
            "source": {"component": "stand-in"}})  # fmt: skip
        return never_reported(pod)

    policies = {"pull": image_not_found, "hung": another_component_reports,
                "sandbox": sandbox_fails}  # fmt: skip
    facts = {node: gpu_facts(node, 1) for node in nodes.values()}
    try:
        with contextlib.ExitStack() as kubelets:
            for role, node in nodes.items():
                kubelets.enter_context(
                    StandInKubelet(cluster, node, 1, operands_run(policies[role]))
                )
            report = install(kubeconfig, ns, facts,
                             extravars={"gpustack_k8s_verify_timeout": MINIMUM})  # fmt: skip
            left = verify_pods(cluster, ns)
        yield report, nodes, left
    finally:
        with contextlib.suppress(ApiException):
            cluster.raw("DELETE", f"/api/v1/namespaces/{ns}")


def test_pod_stuck_pending_surfaces_the_kubelets_words(stuck):
    report, nodes, left = stuck
    status, message = checks(report, nodes["pull"])["pod"]
    assert status == "failed"
    assert f"still Pending after {MINIMUM} s" in message
    assert f'ErrImagePull: Failed to pull image "{VERIFY_IMAGE}"' in message
    assert left == []


def test_pending_without_condition_uses_events(stuck):
    report, nodes, _ = stuck
    status, message = checks(report, nodes["hung"])["pod"]
    assert status == "failed" and f"still Pending after {MINIMUM} s" in message
    assert f"FailedCreatePodSandBox: {SANDBOX}" in message
    status, message = checks(report, nodes["sandbox"])["pod"]
    assert status == "failed" and f"still Pending after {MINIMUM} s" in message
    assert ("FailedCreatePodSandBox: Failed to create pod sandbox: rpc error: code = Unknown "
            f"desc = failed to get sandbox runtime: {SANDBOX}") in message  # fmt: skip


def test_uuid_mismatch_is_reported(kube, kubeconfig, unique, tmp_path):
    ns, node = f"gs-{unique}", f"gpu1-{unique}"
    cluster = kube.stand_in()
    kwok_gpu_node(cluster, node, gpus=2)
    other = uuids_for("elsewhere", 2)
    # SIMULATED: the container sees a GPU that is not the host's (a wrong node mapping)
    with VerificationPods(cluster, tmp_path, {node: Outcome(smi_output([other[1]]))}):
        report = install(kubeconfig, ns, {node: gpu_facts(node, 2)})

    status, message = checks(report, node)["pod"]
    assert status == "failed"
    assert message.startswith("GPU UUID mismatch")
    assert uuids_for(node, 2)[1] in message and other[1] in message


def test_a_pod_that_sees_more_gpus_than_it_was_given_fails(kube, kubeconfig, unique, tmp_path):
    ns, node = f"gs-{unique}", f"gpu1-{unique}"
    cluster = kube.stand_in()
    kwok_gpu_node(cluster, node, gpus=2)
    leak = Outcome(smi_output(uuids_for(node, 2)))  # SIMULATED: every GPU visible
    with VerificationPods(cluster, tmp_path, {node: leak}):
        report = install(kubeconfig, ns, {node: gpu_facts(node, 2)})

    status, message = checks(report, node)["pod"]
    assert status == "failed" and "listed 2 GPUs" in message and "isolation" in message


def test_pods_are_deleted_when_interrupted(kube, kubeconfig, unique):
    ns, one, two = f"gs-{unique}", f"gpu1-{unique}", f"gpu2-{unique}"
    cluster = kube.stand_in()
    kwok_gpu_node(cluster, one, gpus=1)
    kwok_gpu_node(cluster, two, gpus=1)
    clock = RealClock()
    seen = []

    def interrupt():  # Ctrl-C while the verification pods run (kwok keeps them Running)
        pods = verify_pods(cluster, ns) if _namespace_exists(cluster, ns) else []
        if len(pods) == 2:
            seen.extend(p["metadata"]["name"] for p in pods)
            raise KeyboardInterrupt

    clock.on_sleep = interrupt
    mark = kube.audit_mark()
    with pytest.raises(KeyboardInterrupt):
        install(kubeconfig, ns, {one: gpu_facts(one, 1), two: gpu_facts(two, 1)}, clock=clock)
    requests = gpustack_requests(kube.audit_events(mark))
    calls = [(verb, uri.split("?")[0]) for verb, uri in requests]

    assert calls.count(("create", f"/api/v1/namespaces/{ns}/pods")) == 2
    # deleted gracefully, never forced (gracePeriodSeconds=0 would drop a running pod from the
    # API while its kubelet still holds its GPU): kwok, as the kubelet, then finishes them
    assert sorted(r for r in requests if r[0] == "delete") == sorted(
        ("delete", f"/api/v1/namespaces/{ns}/pods/{name}") for name in seen
    )
    wait_until(lambda: verify_pods(cluster, ns) == [], what="the pods gone", timeout=30)


def _namespace_exists(cluster, ns) -> bool:
    try:
        cluster.raw("GET", f"/api/v1/namespaces/{ns}")
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def test_node_missing_or_named_differently(kube, kubeconfig, unique, tmp_path):
    ns = f"gs-{unique}"
    one, two, three = (f"gpu{i}-{unique}" for i in (1, 2, 3))
    fqdn = f"{two}.cluster.example"
    cluster = kube.stand_in()
    kwok_gpu_node(cluster, one, gpus=1)
    kwok_gpu_node(cluster, fqdn)
    facts = {h: gpu_facts(h, 1) for h in (one, two, three)}
    with VerificationPods(cluster, tmp_path, {one: one_gpu_seen(one, 1)}):
        report = install(kubeconfig, ns, facts)

    assert checks(report, one)["pod"][0] == "passed"
    status, message = checks(report, two)["node"]
    assert status == "failed"
    assert f"no Node named '{two}' for host {two}" in message
    assert f"set k8s_node_name={fqdn} for {two}" in message
    status, message = checks(report, three)["node"]
    assert status == "failed"
    assert f"no Node named '{three}' for host {three}" in message
    assert f"join {three} to the cluster" in message
    assert "nvidia.com/gpu.present" not in labels_of(cluster, fqdn)


def test_k8s_node_name_maps_a_host(kube, kubeconfig, unique, tmp_path):
    ns, host, node = f"gs-{unique}", f"gpu7-{unique}", f"worker-7-{unique}"
    cluster = kube.stand_in()
    kwok_gpu_node(cluster, node, gpus=1)
    with VerificationPods(cluster, tmp_path, {node: one_gpu_seen(node, 1)}):
        report = install(kubeconfig, ns, {host: gpu_facts(node, 1)},
                         hostvars={host: {"k8s_node_name": node}})  # fmt: skip

    assert report.passed, report.to_dict()
    assert report.nodes[0].node == node
    assert labels_of(cluster, node)["nvidia.com/gpu.present"] == "true"


def test_host_without_gpu_fails_and_is_not_labelled(kube, kubeconfig, unique, tmp_path):
    ns, gpu, cpu = f"gs-{unique}", f"gpu1-{unique}", f"cpu1-{unique}"
    cluster = kube.stand_in()
    kwok_gpu_node(cluster, gpu, gpus=1)
    kwok_gpu_node(cluster, cpu)
    with VerificationPods(cluster, tmp_path, {gpu: one_gpu_seen(gpu, 1)}):
        report = install(kubeconfig, ns, {gpu: gpu_facts(gpu, 1), cpu: no_gpu_facts()})

    assert checks(report, gpu)["pod"][0] == "passed"
    assert checks(report, cpu)["gpus"] == (
        "failed",
        "driver installed 535.261.03-1, not loaded: no NVIDIA device",
    )
    assert not report.passed
    assert "nvidia.com/gpu.present" not in labels_of(cluster, cpu)
    # no operand was placed on it: the real DaemonSet controller follows the labels
    pods = cluster.raw("GET", f"/api/v1/namespaces/{ns}/pods",
                       [("fieldSelector", f"spec.nodeName={cpu}")])["items"]  # fmt: skip
    assert pods == []


def test_failed_host_stack_is_not_labelled(kube, kubeconfig, unique, tmp_path):
    ns, one, two = f"gs-{unique}", f"gpu1-{unique}", f"gpu2-{unique}"
    cluster = kube.stand_in()
    kwok_gpu_node(cluster, one, gpus=1)
    kwok_gpu_node(cluster, two, gpus=1)
    facts = {one: gpu_facts(one, 1), two: gpu_facts(two, 1)}
    with VerificationPods(cluster, tmp_path, {one: one_gpu_seen(one, 1)}):
        report = install(kubeconfig, ns, facts, failed=(two,))

    status, message = checks(report, two)["host"]
    assert status == "failed" and "Install the driver: apt failed" in message
    assert "nvidia.com/gpu.present" not in labels_of(cluster, two)
    assert labels_of(cluster, one)["nvidia.com/gpu.present"] == "true"


# STAND-IN for the Prometheus Operator's CRD: the group, version, kind and scope are the real
# ones (monitoring.coreos.com_servicemonitors.yaml); its schema is not carried here, so the
# API server keeps any field (the real CRD validates ServiceMonitor's spec).
CRDS = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"


@pytest.fixture
def servicemonitor_crd(kube):
    """Prometheus Operator's own ServiceMonitor CRD, generated from its API types by
    controller-gen (gpustack/lab/components.py), so that the API server validates gpustack's
    ServiceMonitor against the real schema; for one test: the control plane is shared, so it
    is deleted (and waited out) afterwards."""
    crd = yaml.safe_load(
        (components.prometheus_operator_crds() / "monitoring.coreos.com_servicemonitors.yaml")
        .read_text()
    )  # fmt: skip
    cluster = kube.stand_in()
    name = crd["metadata"]["name"]

    def established():
        got = cluster.raw("GET", f"{CRDS}/{name}")
        return any(
            c["type"] == "Established" and c["status"] == "True"
            for c in (got.get("status") or {}).get("conditions") or []
        )

    cluster.raw("POST", CRDS, ctype=JSON, body=crd)
    try:
        wait_until(established, what=f"CRD {name} established", timeout=30, interval=0.1)
        yield
    finally:
        with contextlib.suppress(ApiException):
            cluster.raw("DELETE", f"{CRDS}/{name}")
        wait_until(lambda: not _exists(cluster, f"{CRDS}/{name}"), what=f"CRD {name} deleted",
                   timeout=60, interval=0.2)  # fmt: skip


def _exists(cluster, path) -> bool:
    try:
        cluster.raw("GET", path)
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


def test_servicemonitor_only_with_its_crd(kube, kubeconfig, unique, tmp_path, servicemonitor_crd):
    """kube-prometheus-stack's Prometheus selects ServiceMonitors by its release label: the
    labels, interval and honorLabels the GPU Operator's ClusterPolicy sets are accepted by the
    real CRD's schema and kept."""
    ns, node = f"gs-{unique}", f"gpu1-{unique}"
    cluster = kube.stand_in()
    kwok_gpu_node(cluster, node, gpus=1)
    monitoring = {"gpustack_k8s_servicemonitor_labels": "release=kube-prometheus-stack",
                  "gpustack_k8s_servicemonitor_interval": "1m",
                  "gpustack_k8s_servicemonitor_honor_labels": "true"}  # fmt: skip
    with VerificationPods(cluster, tmp_path, {node: one_gpu_seen(node, 1)}):
        report = install(kubeconfig, ns, {node: gpu_facts(node, 1)}, extravars=monitoring)

    assert report.passed, report.to_dict()
    assert ("ServiceMonitor", "dcgm-exporter") in {(a.kind, a.name) for a in report.applied}
    monitor = cluster.raw(
        "GET", f"/apis/monitoring.coreos.com/v1/namespaces/{ns}/servicemonitors/dcgm-exporter"
    )
    assert monitor["metadata"]["managedFields"][0]["manager"] == "gpustack"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["interval"], endpoint["honorLabels"]) == ("1m", True)
    # the schema is the real one, not a permissive stand-in: it refuses what Prometheus would
    bad = {**monitor, "metadata": {"name": "bad", "namespace": ns},
           "spec": {**monitor["spec"], "endpoints": [{**endpoint, "interval": "30 s"}]}}  # fmt: skip
    with pytest.raises(ApiException) as refused:
        cluster.raw("POST", f"/apis/monitoring.coreos.com/v1/namespaces/{ns}/servicemonitors",
                    body=bad, ctype=JSON)  # fmt: skip
    assert refused.value.status == 422 and "spec.endpoints[0].interval" in refused.value.body


def test_vectoradd_runs_after_the_smi_pod(kube, kubeconfig, unique, tmp_path):
    """vectorAdd runs on the unit the nvidia-smi pod used. (The dcgm-exporter scrape is
    `test_dcgm_scrape_through_the_service_proxy`.)"""
    ns, node = f"gs-{unique}", f"gpu1-{unique}"
    cluster = kube.stand_in()
    kwok_gpu_node(cluster, node, gpus=2)
    extravars = {
        "gpustack_k8s_vector_add_image": "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0"
    }
    mark = kube.audit_mark()
    # SIMULATED: both containers print one of the host's GPUs and exit 0
    with (
        PodRecorder(cluster, ns) as pods,
        VerificationPods(cluster, tmp_path, {node: one_gpu_seen(node, 2)}),
    ):
        report = install(kubeconfig, ns, {node: gpu_facts(node, 2)}, extravars=extravars)
    calls = gpustack_calls(kube.audit_events(mark))

    result = checks(report, node)
    assert result["pod"][0] == "passed"
    assert result["vectoradd"] == ("passed", "Succeeded")
    assert calls.count(("create", f"/api/v1/namespaces/{ns}/pods")) == 2
    kinds = [p["metadata"]["labels"]["gpustack.io/verify-kind"] for p in pods.in_order()]
    assert kinds == ["nvidia-smi", "vectoradd"]
    vectoradd = pods.in_order()[1]["spec"]["containers"][0]
    assert vectoradd["image"] == extravars["gpustack_k8s_vector_add_image"]
    assert "command" not in vectoradd  # the sample's own entrypoint
    assert vectoradd["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert verify_pods(cluster, ns) == []


def dcgm_metrics(node: str, uuids: list[str]) -> str:
    """dcgm-exporter's /metrics (Prometheus text format, its label set) with a
    DCGM_FI_DEV_GPU_TEMP sample for each of `uuids`: written by the test, no DCGM ran."""
    lines = ["# HELP DCGM_FI_DEV_GPU_TEMP GPU temperature (in C).",
             "# TYPE DCGM_FI_DEV_GPU_TEMP gauge"]  # fmt: skip
    for i, uuid_ in enumerate(uuids):
        lines.append(
            f'DCGM_FI_DEV_GPU_TEMP{{gpu="{i}",UUID="{uuid_}",pci_bus_id="00000000:{i + 1:02X}:00.0",'
            f'device="nvidia{i}",modelName="NVIDIA A100-SXM4-80GB",Hostname="{node}",'
            f'DCGM_FI_DRIVER_VERSION="580.95.05"}} 41'
        )
    return "\n".join(lines) + "\n"


def test_dcgm_scrape_through_the_service_proxy(kube, kubeconfig, unique, tmp_path):
    """gpustack reads dcgm-exporter's metrics through the API server's service proxy: the real
    endpoints controller lists the dcgm-exporter pod, the API server connects to its address
    and port. The stand-in answers for one of the node's two GPUs: the check names the other."""
    ip = non_loopback_ip()
    if ip is None:
        pytest.skip("no non-loopback address: the API server's proxy refuses loopback")
    ns, node = f"gs-{unique}", f"gpu1-{unique}"
    cluster = kube.stand_in()
    kwok_gpu_node(cluster, node, gpus=2)
    uuids = uuids_for(node, 2)
    mark = kube.audit_mark()
    with (
        DcgmExporter(cluster, ns, node, ip, METRICS_PORT, dcgm_metrics(node, uuids[:1])) as dcgm,
        VerificationPods(cluster, tmp_path, {node: one_gpu_seen(node, 2)}),
    ):
        report = install(kubeconfig, ns, {node: gpu_facts(node, 2)},
                         extravars={"gpustack_k8s_dcgm_scrape": "true"})  # fmt: skip
    calls = gpustack_calls(kube.audit_events(mark))

    result = checks(report, node)
    assert result["pod"][0] == "passed", result
    assert result["dcgm"] == ("failed", f"no DCGM_FI_DEV_GPU_TEMP sample for {uuids[1]}")
    proxy = f"/api/v1/namespaces/{ns}/services/dcgm-exporter:{METRICS_PORT}/proxy/metrics"
    assert calls.count(("get", proxy)) == 3, calls
    assert dcgm.requests == ["/metrics"] * 3
    assert len(dcgm.pods) == 1, dcgm.pods  # kwok did not write its own address back
    assert verify_pods(cluster, ns) == []
