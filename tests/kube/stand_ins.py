"""STAND-INS for what a real cluster's kubelets, device plugins and GPU containers would do,
each labelled. No GPU and no container is involved; the API server, controllers and scheduler
around them are real.

For reads of many nodes at once (`status` pagination, the 10,000-node benchmark): a Node object
with GPUs allocatable and no kubelet behind it, and a device plugin pod bound to it that the API
server is told is Running and Ready. Nothing runs; only the objects a read lists are real.

For flows on kwok nodes: a node's GPU allocatable written by the test (a device plugin's report),
a pod's container "exiting" (its status written as a kubelet reports it), and the output of
gpustack's verification pods, which kwok serves through the API server as their log."""

from __future__ import annotations

import contextlib
import http.server
import ipaddress
import socket
import threading
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from kubernetes.client.exceptions import ApiException

from gpustack.k8s.cluster import status as cluster_status
from gpustack.k8s.cluster.pods import RUN_LABEL
from tests.kube.conftest import KWOK_NODE_ANNOTATION

GPU = "nvidia.com/gpu"
JSON = "application/json"
MERGE = "application/merge-patch+json"
VERIFY_SELECTOR = "gpustack.io/verify=true"
SINCE = "2026-01-01T00:00:00Z"
READY = [{"type": "Ready", "status": "True", "lastTransitionTime": SINCE}]
CLUSTER_LOGS = "/apis/kwok.x-k8s.io/v1alpha1/clusterlogs"
LOG_WAIT_S = 30


def gpu_node_with_plugin_pod(cluster, name: str, namespace: str, node_labels: dict,
                             gpus: int = 8, node_ready: bool = False) -> None:  # fmt: skip
    """Node `name` (`gpus` nvidia.com/gpu allocatable; a Ready condition with `node_ready`) and
    the pod nvidia-device-plugin-NAME in `namespace`, with the device plugin's labels, Ready."""
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110",
                 cluster_status.GPU_RESOURCE: str(gpus)}  # fmt: skip
    status = {"capacity": resources, "allocatable": resources}
    if node_ready:
        status["conditions"] = READY
    cluster.raw("POST", "/api/v1/nodes", ctype=JSON,
                body={"metadata": {"name": name, "labels": node_labels}, "status": status})  # fmt: skip
    labels = dict(item.split("=") for item in cluster_status.DEVICE_PLUGIN_SELECTOR.split(","))
    pod = f"nvidia-device-plugin-{name}"
    cluster.raw("POST", f"/api/v1/namespaces/{namespace}/pods", ctype=JSON, body={
        "metadata": {"name": pod, "labels": labels},
        "spec": {"nodeName": name, "automountServiceAccountToken": False,
                 "containers": [{"name": "plugin", "image": "stand-in"}]}})  # fmt: skip
    cluster.raw("PATCH", f"/api/v1/namespaces/{namespace}/pods/{pod}/status",
                ctype="application/merge-patch+json",
                body={"status": {"phase": "Running", "conditions": READY}})  # fmt: skip


@dataclass
class Outcome:
    """What a stand-in container prints and how it exits."""

    output: str
    exit_code: int = 0


class VerificationPods:
    """STAND-IN for the containers of gpustack's verification pods on kwok nodes (no GPU, no
    container runs): a thread watches the pods gpustack labels `gpustack.io/verify-run` on the
    nodes of `outcomes`; once kwok has made one Running, it writes the node's output as a CRI
    log file, names it in a kwok ClusterLogs object so that `pods/NAME/log` answers it through
    the API server as a kubelet would, waits until the API server serves it, then ends the pod
    (Succeeded, or Failed with the exit code) as a kubelet reports a container that exited.
    Nodes not in `outcomes` keep their pods Running, as a hung container would.

    Use as a context manager; `handled` lists the pods it ended."""

    def __init__(self, cluster, directory: Path, outcomes: dict[str, Outcome]):
        self.cluster, self.directory, self.outcomes = cluster, directory, outcomes
        self.handled: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> VerificationPods:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
        for name in self.handled:
            with contextlib.suppress(ApiException):
                self.cluster.raw("DELETE", f"{CLUSTER_LOGS}/{name}")
        assert not self.errors, self.errors

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                pods = self.cluster.raw("GET", "/api/v1/pods", [("labelSelector", RUN_LABEL)])
                for pod in pods["items"]:
                    node, name = pod["spec"].get("nodeName"), pod["metadata"]["name"]
                    phase = (pod.get("status") or {}).get("phase")
                    if node in self.outcomes and phase == "Running" and name not in self.handled:
                        self._end(pod, self.outcomes[node])
                        self.handled.append(name)
            except Exception as exc:  # reported by __exit__: a thread cannot fail the test
                self.errors.append(f"{type(exc).__name__}: {exc}")
                return

    def _end(self, pod: dict, outcome: Outcome) -> None:
        end_verification_pod(self.cluster, self.directory, pod, outcome)


def end_verification_pod(cluster, directory: Path, pod: dict, outcome: Outcome) -> None:
    """What `VerificationPods` does for one Running pod: serve `outcome.output` as its log
    (kwok, through a ClusterLogs object), wait until the API server serves it, then end the pod
    as a kubelet reports a container that exited with `outcome.exit_code`."""
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    path = directory / f"{name}.log"
    path.write_text("".join(f"{SINCE} stdout F {line}\n" for line in outcome.output.splitlines()))
    cluster.raw("POST", CLUSTER_LOGS, ctype=JSON, body={
        "apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "ClusterLogs",
        "metadata": {"name": name},
        "spec": {"selector": {"matchNamespaces": [ns], "matchNames": [name]},
                 "logs": [{"logsFile": str(path)}]}})  # fmt: skip
    log_path = f"/api/v1/namespaces/{ns}/pods/{name}/log"
    # kwok reads ClusterLogs through its own watch, which a loaded machine (CI: 2 cores, two
    # control planes) can hold back for more than 10 s: wait as long as the flows' own waits
    deadline, answer = time.monotonic() + LOG_WAIT_S, None
    while True:
        try:
            answer = cluster.raw("GET", log_path)
        except ApiException as exc:
            answer = f"HTTP {exc.status}: {exc.body or exc.reason}"
        if answer == outcome.output:
            break
        if time.monotonic() > deadline:
            raise AssertionError(
                f"kwok never served the log of {ns}/{name} in {LOG_WAIT_S} s;"
                f" the API server's last answer: {answer!r:.300}"
            )
        time.sleep(0.05)
    finish_pod(cluster, ns, name, outcome.exit_code)


def kwok_node(cluster, name: str, *, gpus: int = 0, labels: dict | None = None,
              resources: dict | None = None, unschedulable: bool = False) -> dict:  # fmt: skip
    """A Node that kwok plays the kubelet of (it heartbeats the node and marks it Ready);
    returns it as created. `gpus`: its nvidia.com/gpu capacity and allocatable, and `resources`
    any other (MIG or shared resources), as the test writes them: a STAND-IN for a device
    plugin's report, not a GPU."""
    resources = {"cpu": "32", "memory": "256Gi", "pods": "110", **(resources or {})}
    if gpus:
        resources[GPU] = str(gpus)
    return cluster.raw("POST", "/api/v1/nodes", ctype=JSON, body={
        "metadata": {"name": name, "annotations": {KWOK_NODE_ANNOTATION: "fake"},
                     "labels": {"kubernetes.io/hostname": name, **(labels or {})}},
        "spec": {"unschedulable": unschedulable},
        "status": {"capacity": resources, "allocatable": resources}})  # fmt: skip


def set_gpu_allocatable(cluster, name: str, gpus: int) -> None:
    """STAND-IN for a device plugin going away (0) or registering again: the node's
    nvidia.com/gpu allocatable as the kubelet would write it (capacity is kept)."""
    cluster.raw("PATCH", f"/api/v1/nodes/{name}/status", ctype=MERGE,
                body={"status": {"allocatable": {GPU: str(gpus)}}})  # fmt: skip


def node_ready(node: dict) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)


def finish_pod(cluster, namespace: str, name: str, exit_code: int = 0) -> None:
    """STAND-IN for a container's process exiting: the pod's status as a kubelet reports a
    container that exited with `exit_code` under restartPolicy Never (kwok completes only
    Job-owned pods by itself). Nothing ran and no log was written."""
    pod = cluster.raw("GET", f"/api/v1/namespaces/{namespace}/pods/{name}")
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    reason = "Completed" if exit_code == 0 else "Error"
    statuses = [
        {"name": c["name"], "image": c["image"], "imageID": "", "ready": False, "started": False,
         "restartCount": 0, "state": {"terminated": {"exitCode": exit_code, "reason": reason,
                                                     "startedAt": now, "finishedAt": now}}}
        for c in pod["spec"]["containers"]
    ]  # fmt: skip
    done = {"status": "False", "reason": "PodCompleted", "lastTransitionTime": now}
    cluster.raw("PATCH", f"/api/v1/namespaces/{namespace}/pods/{name}/status", ctype=MERGE,
                body={"status": {
                    "phase": "Succeeded" if exit_code == 0 else "Failed",
                    "conditions": [
                        {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                        {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                        {"type": "Ready", **done}, {"type": "ContainersReady", **done}],
                    "containerStatuses": statuses}})  # fmt: skip


@contextlib.contextmanager
def verification_pods_exit(kubeconfig, namespace: str, interval: float = 0.02):
    """STAND-IN for gpustack's verification container (`nvidia-smi -L`) exiting 0: while the
    block runs, every Running pod labelled gpustack.io/verify=true in `namespace` is finished
    with `finish_pod`. No nvidia-smi runs and no log is written: only the pod's phase is real
    to the reader, so no check of gpustack's passes on it (verify and the upgrade's validation
    read the pod's log). Yields the set of the pods it finished."""
    from gpustack.k8s.cluster.connect import connect

    cluster = connect(str(kubeconfig))
    finished: set[str] = set()
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        path = f"/api/v1/namespaces/{namespace}/pods"
        while not stop.wait(interval):
            try:
                for pod in cluster.raw("GET", path, [("labelSelector", VERIFY_SELECTOR)])["items"]:
                    meta = pod["metadata"]
                    if pod["status"].get("phase") != "Running" or meta.get("deletionTimestamp"):
                        continue
                    try:
                        finish_pod(cluster, namespace, meta["name"])
                    except ApiException as exc:
                        if exc.status != 404:  # gpustack deleted it meanwhile: fine
                            raise
                    finished.add(meta["name"])
            except BaseException as exc:  # reported when the block ends
                errors.append(exc)
                return

    thread = threading.Thread(target=loop, name=f"verify-exit-{namespace}", daemon=True)
    thread.start()
    try:
        yield finished
    finally:
        stop.set()
        thread.join(10)
        cluster.close()
    if errors:
        raise errors[0]


def non_loopback_ip() -> str | None:
    """This machine's address on its default route (a UDP socket's source address: nothing is
    sent), or None when it has only loopback. The API server's proxy refuses loopback and
    link-local addresses ("address not allowed")."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("198.51.100.1", 9))  # TEST-NET-2: off any local link
        except OSError:
            return None
        ip = sock.getsockname()[0]
    return None if ipaddress.ip_address(ip).is_loopback else ip


class DcgmExporter:
    """STAND-IN for the dcgm-exporter container of gpustack's DaemonSet on kwok node `node`: an
    HTTP server on this machine's non-loopback address `ip`, at `port` (the containerPort
    gpustack's pod declares), answering GET /metrics with `body`; and, as a kubelet and its CNI
    would report the pod's address, the dcgm-exporter pod's `status.podIP`/`podIPs` rewritten to
    `ip` once kwok made it Running (kwok's own pod IPs lead nowhere). The real endpoints
    controller then lists that address in the Service's Endpoints, and the API server's service
    proxy connects to it. No DCGM and no GPU: the body is what the test writes.

    Use as a context manager; `requests` lists the paths asked, `pods` the pods rewritten."""

    def __init__(self, cluster, namespace: str, node: str, ip: str, port: int, body: str):
        self.cluster, self.namespace, self.node, self.ip = cluster, namespace, node, ip
        self.requests: list[str] = []
        self.pods: list[str] = []
        self.errors: list[str] = []
        stand_in = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                stand_in.requests.append(self.path)
                found = self.path.split("?")[0] == "/metrics"
                data = body.encode() if found else b"404 page not found\n"
                self.send_response(200 if found else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer((ip, port), Handler)
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self.server.serve_forever, daemon=True),
                         threading.Thread(target=self._run, daemon=True)]  # fmt: skip

    def __enter__(self) -> DcgmExporter:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self.server.shutdown()
        self.server.server_close()
        for thread in self._threads:
            thread.join(10)
        assert not self.errors, self.errors

    def _run(self) -> None:
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        query = [("labelSelector", "app.kubernetes.io/name=dcgm-exporter"),
                 ("fieldSelector", f"spec.nodeName={self.node}")]  # fmt: skip
        while not self._stop.wait(0.05):
            try:
                for pod in self.cluster.raw("GET", path, query)["items"]:
                    status = pod.get("status") or {}
                    if status.get("phase") != "Running" or status.get("podIP") == self.ip:
                        continue
                    name = pod["metadata"]["name"]
                    self.cluster.raw("PATCH", f"{path}/{name}/status", ctype=MERGE, body={
                        "status": {"podIP": self.ip, "podIPs": [{"ip": self.ip}]}})  # fmt: skip
                    self.pods.append(name)
            except Exception as exc:  # reported by __exit__: a thread cannot fail the test
                self.errors.append(f"{type(exc).__name__}: {exc}")
                return
