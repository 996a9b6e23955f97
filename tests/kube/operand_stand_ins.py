"""STAND-INS for what gpustack's operands and a kubelet's admission would do on a node, each
labelled, for tests/kube/test_gpu_modes.py and test_cli.py. No GPU, no container and no operand
image runs: the API server, RBAC, the DaemonSet controller and the scheduler around them are
real, and every request a stand-in makes as an operand goes through the real API server under
that operand's ServiceAccount (a client certificate for `system:serviceaccount:NS:NAME`, so
RBAC judges it against the Role gpustack rendered).

- `OperandStandIns`: NVIDIA's device plugin registers the node's GPU resources once its pod runs
  there (under MPS only once the MPS control daemon's pod runs there too, as the real plugin
  advertises nothing before); GPU Feature Discovery in NodeFeature API mode publishes its
  NodeFeature object as GFD's ServiceAccount; nfd-master (optional) turns NodeFeature objects
  into node labels. On a node kwok does not manage it also plays the kubelet, reporting GFD's
  container crash-looping when GFD's API calls fail (real GFD exits on them).
- `AdmittingVerificationPods`: `VerificationPods` with the kubelet's resource admission
  (kwok admits every pod bound with `spec.nodeName`; a real kubelet rejects one whose extended
  resource request exceeds what is free on the node), recording each verification pod's
  requests.
"""

from __future__ import annotations

import contextlib
import threading
import time
from pathlib import Path

from kubernetes.client.exceptions import ApiException

from gpustack.k8s.cluster import gpu_resources
from gpustack.k8s.cluster.connect import connect
from tests.kube.stand_ins import SINCE, VerificationPods

JSON = "application/json"
MERGE = "application/merge-patch+json"
NFD_API = "/apis/nfd.k8s-sigs.io/v1alpha1"
NODE_NAME_LABEL = "nfd.node.kubernetes.io/node-name"  # NFD's NodeFeatureObjNodeNameLabel
FEATURE_LABELS = "nfd.node.kubernetes.io/feature-labels"  # nfd-master's record of its labels
GFD_SA = "gpu-feature-discovery"

# nodefeatures.nfd.k8s-sigs.io as node-feature-discovery v0.18.3 ships it
# (deployment/base/nfd-crds/nfd-api-crds.yaml): same group, names, scope and version;
# `spec.features` is kept as an open object here (upstream spells out its attributes, flags and
# instances, which nothing in these tests writes) and `spec.labels` is a map of strings as there.
# fmt: off
NODEFEATURE_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "nodefeatures.nfd.k8s-sigs.io"},
    "spec": {
        "group": "nfd.k8s-sigs.io",
        "names": {"kind": "NodeFeature", "listKind": "NodeFeatureList",
                  "plural": "nodefeatures", "singular": "nodefeature"},
        "scope": "Namespaced",
        "versions": [{
            "name": "v1alpha1", "served": True, "storage": True,
            "schema": {"openAPIV3Schema": {
                "type": "object", "required": ["spec"],
                "properties": {
                    "apiVersion": {"type": "string"}, "kind": {"type": "string"},
                    "metadata": {"type": "object"},
                    "spec": {"type": "object", "properties": {
                        "features": {"type": "object",
                                     "x-kubernetes-preserve-unknown-fields": True},
                        "labels": {"type": "object",
                                   "additionalProperties": {"type": "string"}}}}}}}}],
    },
}
# fmt: on


def gfd_labels(product: str, count: int, strategy: str = "none", replicas: int = 1) -> dict:
    """Some of the labels real GFD v0.20.0 wrote on a real H100 host (tests/fixtures/real-gpu/
    2026-11-26-h100-80gb-hbm3/k8s-device-plugin/gfd-labels-mig-none.txt), with this host's
    values: what the GFD stand-in publishes."""
    return {
        "nvidia.com/gpu.product": product.replace(" ", "-"),
        "nvidia.com/gpu.count": str(count),
        "nvidia.com/gpu.replicas": str(replicas),
        "nvidia.com/gpu.sharing-strategy": strategy,
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/mig.capable": "true",
    }


def _env(pod: dict, name: str) -> str | None:
    for container in pod["spec"]["containers"]:
        for env in container.get("env") or []:
            if env["name"] == name:
                return env.get("value")
    return None


def _daemonset(pod: dict) -> str | None:
    """The DaemonSet that made the pod (the real controller's ownerReference)."""
    owners = pod["metadata"].get("ownerReferences") or []
    return next((o["name"] for o in owners if o["kind"] == "DaemonSet"), None)


class OperandStandIns:
    """STAND-INS for gpustack's operands on `node` (see the module doc). A thread watches the
    pods the real DaemonSet controller put on the node in `namespace`:

    - `resources` (e.g. `{"nvidia.com/gpu": "16"}`) are added to the node's capacity and
      allocatable once the `nvidia-device-plugin` pod runs there and, with `mps`, the
      `nvidia-device-plugin-mps-control-daemon` pod too: the device plugin's registration;
    - a running `gpu-feature-discovery` pod whose USE_NODE_FEATURE_API is not "false" makes
      GFD's API calls as GFD's ServiceAccount (GET its pod, GET the NodeFeature
      nvidia-features-for-NODE, CREATE it with `labels`); the API server's refusals are
      recorded in `gfd_errors`;
    - with `nfd_master`, NodeFeature objects naming the node become its labels;
    - with `kubelet` (a node kwok does not manage) every pod there is reported Running and Ready,
      except a GFD whose API calls failed: its container is reported crash-looping.

    Use as a context manager; a failure of the thread itself fails the test at exit."""

    def __init__(self, kube, cluster, namespace: str, node: str, *, resources: dict,
                 mps: bool = False, labels: dict | None = None, nfd_master: bool = False,
                 kubelet: bool = False, tmp_path: Path | None = None):  # fmt: skip
        self.kube, self.cluster, self.namespace, self.node = kube, cluster, namespace, node
        self.resources, self.mps, self.labels = resources, mps, labels or {}
        self.nfd_master, self.kubelet, self.tmp_path = nfd_master, kubelet, tmp_path
        self.registered = False
        self.gfd_done: set[str] = set()
        self.gfd_errors: list[str] = []
        self.errors: list[str] = []
        self._gfd_client = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> OperandStandIns:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)
        if self._gfd_client is not None:
            self._gfd_client.close()
        assert not self.errors, self.errors

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self._sync()
            except Exception as exc:  # reported by __exit__: a thread cannot fail the test
                self.errors.append(f"{type(exc).__name__}: {exc}")
                return

    def _pods(self) -> list[dict]:
        return self.cluster.raw("GET", f"/api/v1/namespaces/{self.namespace}/pods",
                                [("fieldSelector", f"spec.nodeName={self.node}")])["items"]  # fmt: skip

    def _sync(self) -> None:
        pods = [p for p in self._pods() if not p["metadata"].get("deletionTimestamp")]
        if self.kubelet:
            for pod in pods:
                if (pod.get("status") or {}).get("phase") in (None, "Pending"):
                    self._report_running(pod)
            pods = [p for p in self._pods() if not p["metadata"].get("deletionTimestamp")]
        running = {
            _daemonset(p): p for p in pods if (p.get("status") or {}).get("phase") == "Running"
        }
        wanted = ["nvidia-device-plugin"] + (["nvidia-device-plugin-mps-control-daemon"]
                                             if self.mps else [])  # fmt: skip
        if not self.registered and all(w in running for w in wanted):
            self._register()
        gfd = running.get("gpu-feature-discovery")
        if gfd is not None and gfd["metadata"]["name"] not in self.gfd_done:
            self.gfd_done.add(gfd["metadata"]["name"])
            if _env(gfd, "USE_NODE_FEATURE_API") != "false":
                error = self._publish(gfd)
                if error:
                    self.gfd_errors.append(error)
                if self.kubelet and error:
                    self._report_crash_loop(gfd)
                elif self.kubelet:
                    self._status(gfd, True, {"running": {"startedAt": SINCE}})
        if self.nfd_master:
            self._label_node()

    def _register(self) -> None:
        node = self.cluster.raw("GET", f"/api/v1/nodes/{self.node}")
        status = node["status"]
        self.cluster.raw("PATCH", f"/api/v1/nodes/{self.node}/status", ctype=MERGE, body={
            "status": {"capacity": {**status["capacity"], **self.resources},
                       "allocatable": {**status["allocatable"], **self.resources}}})  # fmt: skip
        self.registered = True

    def _gfd(self):
        """A client authenticated as GFD's ServiceAccount (what its mounted token would be)."""
        if self._gfd_client is None:
            user = f"system:serviceaccount:{self.namespace}:{GFD_SA}"
            path = self.tmp_path / f"gfd-{self.namespace}.kubeconfig"
            groups = ("system:serviceaccounts", f"system:serviceaccounts:{self.namespace}",
                      "system:authenticated")  # fmt: skip
            self.kube.cp.user_kubeconfig(path, user, groups)
            self._gfd_client = connect(str(path))
        return self._gfd_client

    def _publish(self, pod: dict) -> str:
        """GFD's NodeFeature output (k8s-device-plugin internal/lm/output.go, v0.20.0): its
        calls and the errors it exits with; '' when the object was written."""
        client, ns, name = self._gfd(), self.namespace, f"nvidia-features-for-{self.node}"
        try:
            me = client.raw("GET", f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}")
        except ApiException as exc:
            return f"failed to get pod: {exc.status} {exc.reason}"
        owners = [{**{k: r[k] for k in ("apiVersion", "kind", "name", "uid")}}
                  for r in me["metadata"].get("ownerReferences") or []]  # fmt: skip
        owners.append({"apiVersion": "v1", "kind": "Pod", "name": me["metadata"]["name"],
                       "uid": me["metadata"]["uid"]})  # fmt: skip
        path = f"{NFD_API}/namespaces/{ns}/nodefeatures"
        try:
            existing = client.raw("GET", f"{path}/{name}")
        except ApiException as exc:
            if exc.status != 404:
                return f"failed to get NodeFeature object: {exc.status} {exc.body}"
            existing = None
        body = {"apiVersion": "nfd.k8s-sigs.io/v1alpha1", "kind": "NodeFeature",
                "metadata": {"name": name, "labels": {NODE_NAME_LABEL: self.node},
                             "ownerReferences": owners},
                "spec": {"features": {}, "labels": self.labels}}  # fmt: skip
        try:
            if existing is None:
                client.raw("POST", path, body=body, ctype=JSON)
            else:
                body["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
                client.raw("PUT", f"{path}/{name}", body=body, ctype=JSON)
        except ApiException as exc:
            verb = "update" if existing else "create"
            return f'failed to {verb} NodeFeature object "{name}": {exc.status} {exc.body}'
        return ""

    def _label_node(self) -> None:
        """nfd-master: the labels of NodeFeature objects naming this node, on the node."""
        with contextlib.suppress(ApiException):  # 404 while the API is not served
            features = self.cluster.raw(
                "GET",
                f"{NFD_API}/nodefeatures",
                [("labelSelector", f"{NODE_NAME_LABEL}={self.node}")],
            )
            labels = {}
            for feature in features["items"]:
                labels.update(feature["spec"].get("labels") or {})
            node = self.cluster.raw("GET", f"/api/v1/nodes/{self.node}")["metadata"]
            if labels and any(node["labels"].get(k) != v for k, v in labels.items()):
                self.cluster.raw("PATCH", f"/api/v1/nodes/{self.node}", ctype=MERGE, body={
                    "metadata": {"labels": labels,
                                 "annotations": {FEATURE_LABELS: ",".join(sorted(labels))}}})  # fmt: skip

    def _status(self, pod: dict, ready: bool, state: dict, restarts: int = 0) -> None:
        statuses = [{"name": c["name"], "image": c["image"], "imageID": "", "ready": ready,
                     "restartCount": restarts, "state": state}
                    for c in pod["spec"]["containers"]]  # fmt: skip
        flag = "True" if ready else "False"
        conditions = [{"type": t, "status": flag, "lastTransitionTime": SINCE}
                      for t in ("Ready", "ContainersReady")]  # fmt: skip
        conditions.append({"type": "Initialized", "status": "True", "lastTransitionTime": SINCE})
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        self.cluster.raw("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status", ctype=MERGE,
                         body={"status": {"phase": "Running", "conditions": conditions,
                                          "containerStatuses": statuses}})  # fmt: skip

    def _report_running(self, pod: dict) -> None:
        """The kubelet (on a node kwok does not manage): the containers started; GFD's is not
        reported Ready until the stand-in has made its calls (real GFD fails within them)."""
        is_gfd = _daemonset(pod) == "gpu-feature-discovery"
        self._status(pod, not is_gfd, {"running": {"startedAt": SINCE}})
        if is_gfd and _env(pod, "USE_NODE_FEATURE_API") == "false":
            self._status(pod, True, {"running": {"startedAt": SINCE}})

    def _report_crash_loop(self, pod: dict) -> None:
        """What a kubelet reports for a container that keeps exiting (restartPolicy Always)."""
        terminated = {"exitCode": 1, "reason": "Error", "startedAt": SINCE, "finishedAt": SINCE}
        self._status(pod, False, {"waiting": {"reason": "CrashLoopBackOff",
                                              "message": "back-off 10s restarting failed container"}},
                     restarts=2)  # fmt: skip
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        path = f"/api/v1/namespaces/{ns}/pods/{name}/status"
        pod = self.cluster.raw("GET", path)
        for status in pod["status"]["containerStatuses"]:
            status["lastState"] = {"terminated": terminated}
        self.cluster.raw("PUT", path, body=pod, ctype=JSON)


class AdmittingVerificationPods(VerificationPods):
    """`VerificationPods` plus the kubelet's admission of a pod bound with `spec.nodeName`
    (kubelet lifecycle.PredicateAdmitHandler, noderesources fit: kwok admits everything): a
    verification pod that asks for more of a GPU resource than the node has free (allocatable
    minus what its other pods that are not Succeeded/Failed request) ends Failed with the
    kubelet's `OutOf<resource>` reason instead of its outcome. `requests` records what each
    verification pod asked for (its first container's limits), in the order they ran, and
    `node_requests` the same per node."""

    def __init__(self, cluster, directory: Path, outcomes):
        super().__init__(cluster, directory, outcomes)
        self.requests: list[dict] = []
        self.node_requests: dict[str, list[dict]] = {}
        self.rejected: list[str] = []

    def _end(self, pod: dict, outcome) -> None:
        limits = pod["spec"]["containers"][0]["resources"].get("limits") or {}
        self.requests.append(limits)
        self.node_requests.setdefault(pod["spec"]["nodeName"], []).append(limits)
        refusal = self._admit(pod)
        if refusal:
            self.rejected.append(pod["metadata"]["name"])
            ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            resource = refusal[0]
            self.cluster.raw("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}/status",
                             ctype=MERGE, body={"status": {
                                 "phase": "Failed", "reason": f"OutOf{resource}",
                                 "message": f"Pod was rejected: {refusal[1]}"}})  # fmt: skip
            return
        super()._end(pod, outcome)

    def _admit(self, pod: dict) -> tuple[str, str] | None:
        node_name = pod["spec"]["nodeName"]
        node = self.cluster.raw("GET", f"/api/v1/nodes/{node_name}")
        others = self.cluster.raw("GET", "/api/v1/pods",
                                  [("fieldSelector", f"spec.nodeName={node_name}")])["items"]  # fmt: skip
        found = gpu_resources.units(
            node, [p for p in others if p["metadata"]["uid"] != pod["metadata"]["uid"]]
        )
        for resource, amount in gpu_resources.pod_requests(pod).items():
            units = found.get(resource)
            capacity = units.allocatable if units else 0
            used = units.used if units else 0
            if amount > capacity - used:
                return resource, (
                    f"Node didn't have enough resource: {resource}, requested: {amount}, "
                    f"used: {used}, capacity: {capacity}"
                )
        return None


def wait_served(cluster, present: bool, timeout: float = 15) -> None:
    """Until API discovery serves NFD's nodefeatures (or, `present=False`, no longer does)."""
    from gpustack.k8s.cluster.gfd import nfd_api_served

    deadline = time.monotonic() + timeout
    while nfd_api_served(cluster) != present:
        if time.monotonic() > deadline:
            raise AssertionError(f"NFD's API still {'not ' if present else ''}served")
        time.sleep(0.1)
