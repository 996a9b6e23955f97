"""The Kubernetes node backend of `gpustack upgrade`: cordon, evict, drain, validate, labels.

The durable per-node state is the GPU Operator's label `nvidia.com/gpu-driver-upgrade-state`;
annotations carry the failure reason and whether an admin had cordoned the node before the
upgrade (such a node stays cordoned). GPU pods leave through the Eviction API, so
PodDisruptionBudgets are respected; a blocked eviction is retried until its timeout.

Which pods leave follows `kubectl drain --ignore-daemonsets` (the filters of
k8s.io/kubectl@v0.36.3/pkg/drain/filters.go, in their order): DaemonSet pods stay (but one
whose DaemonSet is gone is an orphan: refused without --force); mirror (static) pods are
skipped; pods with emptyDir volumes are refused without --delete-emptydir-data; pods that
declare no controller are refused without --force. A refusal fails the node step before
anything is evicted and names the pods. Unlike kubectl, finished pods are left alone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpustack.ansible.input_specs import is_true
from gpustack.errors import BadInput
from gpustack.k8s.cluster import dra, gpu_resources
from gpustack.k8s.cluster.connect import (
    Cluster,
    backpressure,
    call,
    check_reachable,
    connect,
    retry_after,
    status_body,
    status_message,
)
from gpustack.k8s.cluster.gpu_resources import GPU_PREFIXES
from gpustack.k8s.cluster.nodes import MERGE_PATCH, find_nodes, node_name_for
from gpustack.k8s.cluster.pause import ClientPause
from gpustack.k8s.manifests import DRA_DRIVER
from gpustack.upgrade.backend import NodeCondition, StepFailed, StepOptions
from gpustack.upgrade.executors import Clock
from gpustack.upgrade.state import SKIP_LABEL, STATE_LABEL, UpgradeState

ADMIN_ANNOTATION = "gpustack.io/driver-upgrade-initially-unschedulable"
REASON_ANNOTATION = "gpustack.io/driver-upgrade-failure"
GPU_RESOURCE_PREFIXES = GPU_PREFIXES  # GPU pods: nvidia.com/gpu* or nvidia.com/mig-*
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
PAUSED = "paused-for-driver-upgrade"  # the GPU clients' deploy labels while the driver reloads
PAUSED_ANNOTATION = "gpustack.io/driver-upgrade-paused-clients"  # {label: value found}


def claim_names(pod: dict[str, Any]) -> list[str]:
    """Pure: the ResourceClaims the pod's claims stand for: named in its spec, or (generated
    from a template) in its status; a claim not generated yet has none."""
    statuses = {
        s.get("name"): s.get("resourceClaimName")
        for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []
    }
    names = []
    for claim in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = claim.get("resourceClaimName") or statuses.get(claim.get("name"))
        if name:
            names.append(name)
    return names


def holds_nvidia_device(claim: dict[str, Any] | None) -> bool:
    """Pure: the claim is allocated a device of NVIDIA's GPU DRA driver (admin-access results
    aside); None (the claim could not be read) counts as holding one, as upstream does."""
    if claim is None:
        return True
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return any(
        r.get("driver") == DRA_DRIVER and not r.get("adminAccess")
        for r in (allocation.get("devices") or {}).get("results") or []
    )


def is_gpu_pod(
    pod: dict[str, Any], claims: Mapping[str, dict[str, Any] | None] | None = None
) -> bool:
    """Pure: the pod requests (or limits) an NVIDIA GPU or MIG resource, or one of its
    ResourceClaims (`claims`: name -> the claim in the pod's namespace, None when unreadable)
    holds a device of NVIDIA's DRA driver: the GPU Operator's gpuPodSpecFilter
    (NVIDIA/gpu-operator@a22dbf67 cmd/gpu-operator/main.go, with PodHasNVIDIAGPUClaim in
    controllers/nodelabeling_controller.go)."""
    spec = pod.get("spec") or {}
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        resources = container.get("resources") or {}
        for section in ("requests", "limits"):
            if any(k.startswith(GPU_RESOURCE_PREFIXES) for k in resources.get(section) or {}):
                return True
    return any(holds_nvidia_device((claims or {}).get(name)) for name in claim_names(pod))


def _controller_ref(pod: dict[str, Any]) -> dict[str, Any] | None:
    for ref in (pod.get("metadata") or {}).get("ownerReferences") or []:
        if ref.get("controller"):
            return ref
    return None


def _daemonset_owned(pod: dict[str, Any]) -> bool:
    """kubectl's isControllerRefDaemonSet: the controller is an apps/v1 DaemonSet."""
    ref = _controller_ref(pod) or {}
    return ref.get("kind") == "DaemonSet" and ref.get("apiVersion") == "apps/v1"


def _mirror(pod: dict[str, Any]) -> bool:
    return MIRROR_ANNOTATION in ((pod.get("metadata") or {}).get("annotations") or {})


def _has_local_storage(pod: dict[str, Any]) -> bool:
    """kubectl's hasLocalStorage: the pod has an emptyDir volume."""
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return any(v.get("emptyDir") is not None for v in volumes)


EVICT, SKIP = "evict", "skip"
ORPHANED = "orphaned"  # DaemonSet-owned, its DaemonSet is gone
LOCAL_STORAGE = "local-storage"
UNMANAGED = "unmanaged"


def drain_verdict(
    pod: dict[str, Any], daemonset_gone: bool, *, force: bool, delete_emptydir_data: bool
) -> str:
    """Pure: what a drain does with one pod that is not finished, as kubectl drain
    --ignore-daemonsets decides it (k8s.io/kubectl@v0.36.3/pkg/drain/filters.go, filters
    daemonSetFilter, mirrorPodFilter, localStorageFilter, unreplicatedFilter in that order; the
    first that does not delete the pod decides). EVICT, SKIP, or the reason it is refused
    (ORPHANED, LOCAL_STORAGE, UNMANAGED). `daemonset_gone`: the API server answered 404 for
    the pod's controlling DaemonSet (only asked for DaemonSet-owned pods)."""
    if _daemonset_owned(pod):
        if not daemonset_gone:
            return SKIP  # --ignore-daemonsets: the DaemonSet controller would put it back
        if not force:
            return ORPHANED
    if _mirror(pod):
        return SKIP  # the kubelet owns a static pod; deleting its mirror changes nothing
    if _has_local_storage(pod) and not delete_emptydir_data:
        return LOCAL_STORAGE
    if _controller_ref(pod) is None and not force:
        return UNMANAGED
    return EVICT


def _terminal(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def _ref(pod: dict[str, Any]) -> tuple[str, str]:
    meta = pod["metadata"]
    return meta.get("namespace", "default"), meta["name"]


def _ready(node: dict[str, Any]) -> bool:
    for cond in (node.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return False


def gpu_allocatable(node: dict[str, Any]) -> int:
    total = 0
    for key, value in ((node.get("status") or {}).get("allocatable") or {}).items():
        if key.startswith(GPU_RESOURCE_PREFIXES):
            try:
                total += int(str(value))
            except ValueError:
                continue
    return total


class KubernetesBackend:
    mode = "kubernetes"

    def __init__(self, cluster: Cluster, node_names: dict[str, str], config=None, dra=False):
        self.cluster = cluster
        self.node_names = node_names  # inventory host -> Node name
        self.config = config  # ClusterConfig for the verification pod; None: no pod
        self.dra = dra  # GPUs come from NVIDIA's DRA driver (ResourceSlices), not allocatable
        self.clients = ClientPause(self, PAUSED, PAUSED_ANNOTATION)

    @classmethod
    def from_kubeconfig(cls, kubeconfig: str, inventory, extravars=None) -> KubernetesBackend:
        cluster = connect(kubeconfig)
        check_reachable(cluster)
        wanted = {h: node_name_for(h, inventory.hostvars.get(h) or {}) for h in inventory.hosts}
        matches = find_nodes(cluster, wanted, inventory.hostvars)
        for match in matches.values():
            if match.node is None:
                raise BadInput(match.error, match.hint)
        from gpustack.k8s.manifests import config_from_inventory

        configured = config_from_inventory(inventory, extravars or {})
        config = None
        if is_true((extravars or {}).get("gpustack_upgrade_verify_pod", True)):
            config = configured
            try:  # the pod runs in gpustack's namespace: only where gpustack installed it
                cluster.raw("GET", f"/api/v1/namespaces/{config.namespace}")
            except ApiException as exc:
                if exc.status != 404:
                    raise BadInput(
                        f"cannot read namespace {config.namespace}: {status_message(exc)}",
                        "check the kubeconfig's permissions (RBAC)",
                    ) from None
                config = None
        return cls(cluster, wanted, config, dra=configured.dra)

    # -- reading ----------------------------------------------------------------------------

    def read_node(self, host: str) -> dict[str, Any]:
        name = self.node_names[host]
        return self.cluster.get(f"/api/v1/nodes/{name}", f"read node {name}")

    def _nodes(self) -> dict[str, dict[str, Any]]:
        nodes = self.cluster.list_all("/api/v1/nodes", "list nodes")
        return {n["metadata"]["name"]: n for n in nodes}

    def conditions(self, names: Sequence[str]) -> dict[str, NodeCondition]:
        nodes = self._nodes()
        out = {}
        for host in names:
            node = nodes.get(self.node_names[host])
            if node is None:
                out[host] = NodeCondition(ready=False)
                continue
            meta = node.get("metadata") or {}
            labels = meta.get("labels") or {}
            admin = (meta.get("annotations") or {}).get(ADMIN_ANNOTATION)
            out[host] = NodeCondition(
                cordoned=bool((node.get("spec") or {}).get("unschedulable")),
                ready=_ready(node),
                skip=labels.get(SKIP_LABEL, "").lower() == "true",
                state=labels.get(STATE_LABEL),
                admin_cordoned=None if admin is None else admin == "true",
            )
        return out

    def recorded_states(self, names: Sequence[str]) -> dict[str, str | None]:
        return {host: cond.state for host, cond in self.conditions(names).items()}

    def pods_on(self, host: str, **query: Any) -> list[dict[str, Any]]:
        name = self.node_names[host]
        return self.cluster.list_all(
            "/api/v1/pods", f"list pods on {name}", fieldSelector=f"spec.nodeName={name}", **query
        )

    # -- writing ----------------------------------------------------------------------------

    def patch_node(self, host: str, patch: dict[str, Any], what: str) -> None:
        name = self.node_names[host]
        call(
            lambda: self.cluster.raw(
                "PATCH", f"/api/v1/nodes/{name}", [("fieldManager", "gpustack")],
                body=json.loads(json.dumps(patch)), ctype=MERGE_PATCH,
            ),
            f"{what} node {name}",
        )  # fmt: skip

    def record_state(
        self, name: str, state: str, reason: str = "", admin_cordoned: bool = False
    ) -> None:
        annotations: dict[str, str | None] = {REASON_ANNOTATION: reason or None}
        if state == UpgradeState.DONE:
            annotations[ADMIN_ANNOTATION] = None
        elif state != UpgradeState.REQUIRED:
            annotations[ADMIN_ANNOTATION] = "true" if admin_cordoned else "false"
        patch = {"metadata": {"labels": {STATE_LABEL: state}, "annotations": annotations}}
        self.patch_node(name, patch, "label")

    def cordon(self, name: str, clock: Clock, opts: StepOptions) -> str:
        self.patch_node(name, {"spec": {"unschedulable": True}}, "cordon")
        return f"cordoned {self.node_names[name]}"

    def uncordon(self, name: str, clock: Clock, opts: StepOptions) -> str:
        self.patch_node(name, {"spec": {"unschedulable": None}}, "uncordon")
        return f"uncordoned {self.node_names[name]}"

    # -- steps ------------------------------------------------------------------------------

    def wait_for_jobs(self, name: str, clock: Clock, opts: StepOptions) -> str:
        start = clock.now()
        while True:
            running = [
                p for p in self.pods_on(name, labelSelector=opts.pod_selector) if not _terminal(p)
            ]
            if not running:
                return f"no running pod matches {opts.pod_selector}"
            waited = clock.now() - start
            if opts.wait_for_jobs_timeout and waited >= opts.wait_for_jobs_timeout:
                return (
                    f"{len(running)} pod(s) matching {opts.pod_selector} still running after "
                    f"{opts.wait_for_jobs_timeout:g} s; going on"
                )
            clock.sleep(opts.poll)

    def evict_gpu_pods(self, name: str, clock: Clock, opts: StepOptions) -> str:
        pods = [p for p in self.pods_on(name) if not _terminal(p)]
        pods = [p for p in pods if is_gpu_pod(p, self._claims(p))]
        pods = self._to_evict(pods, opts, "GPU pod")
        return self._evict(name, pods, clock, opts, opts.pod_deletion_timeout, "GPU pod")

    def drain(self, name: str, clock: Clock, opts: StepOptions) -> str:
        selector = opts.drain_pod_selector or None  # kubectl drain --pod-selector
        pods = [p for p in self.pods_on(name, labelSelector=selector) if not _terminal(p)]
        pods = self._to_evict(pods, opts, "pod")
        return self._evict(name, pods, clock, opts, opts.drain_timeout, "pod")

    def _claims(self, pod: dict[str, Any]) -> dict[str, dict[str, Any] | None]:
        """The pod's ResourceClaims by name (None: unreadable, counted as holding a GPU)."""
        ns, found = _ref(pod)[0], {}
        for name in claim_names(pod):
            try:
                found[name] = self.cluster.raw(
                    "GET", f"{dra.API}/namespaces/{ns}/resourceclaims/{name}"
                )
            except ApiException:
                found[name] = None
        return found

    def check_selectors(self, selectors: dict[str, str]) -> None:
        """BadInput for a label selector (option -> selector) the API server does not parse,
        before anything changes: one list call of at most one pod each."""
        for option, selector in selectors.items():
            if not selector:
                continue
            try:
                self.cluster.raw("GET", "/api/v1/pods", [("labelSelector", selector), ("limit", 1)])
            except ApiException as exc:
                if exc.status != 400:
                    raise BadInput(
                        f"cannot list pods: {status_message(exc)}",
                        "check the kubeconfig's permissions (RBAC)",
                    ) from None
                raise BadInput(
                    f"{option} {selector!r}: {status_message(exc)}",
                    "a label selector as kubectl takes it, e.g. app=train or 'tier in (batch)'",
                ) from None

    def pause_gpu_clients(self, name: str, clock: Clock, opts: StepOptions) -> str:
        return self.clients.pause(name, clock, opts)

    def resume_gpu_clients(self, name: str) -> str:
        return self.clients.resume(name)

    def _daemonset_gone(self, pod: dict[str, Any]) -> bool:
        """kubectl's daemonSetFilter lookup: 404 for the controlling DaemonSet is an orphan."""
        ns, ref = _ref(pod)[0], _controller_ref(pod) or {}
        try:
            self.cluster.raw("GET", f"/apis/apps/v1/namespaces/{ns}/daemonsets/{ref.get('name')}")
        except ApiException as exc:
            if exc.status == 404:
                return True
            raise StepFailed(
                f"read DaemonSet {ns}/{ref.get('name')}: {status_message(exc)}"
            ) from None
        return False

    def _to_evict(self, pods, opts: StepOptions, what: str) -> list[dict[str, Any]]:
        """The pods to evict, or StepFailed naming every refused pod before any is evicted."""
        refused: dict[str, list[str]] = {}
        out = []
        for pod in pods:
            gone = _daemonset_owned(pod) and self._daemonset_gone(pod)
            verdict = drain_verdict(
                pod, gone, force=opts.force, delete_emptydir_data=opts.delete_emptydir_data
            )
            if verdict == EVICT:
                out.append(pod)
            elif verdict != SKIP:
                refused.setdefault(verdict, []).append("/".join(_ref(pod)))
        if refused:
            raise StepFailed(refusal_message(refused, what))
        return out

    def _evict(self, host, pods, clock, opts, timeout: float, what: str) -> str:
        pending = {_ref(p): p["metadata"].get("uid") for p in pods}
        blocked: dict[tuple[str, str], str] = {}
        accepted: set[tuple[str, str]] = set()  # evicted: wait for them to go, ask no more
        not_before: dict[tuple[str, str], float] = {}  # throttled: the server's Retry-After
        start = clock.now()
        while True:
            for ns, pod in [ref for ref in pending if ref not in accepted]:
                if clock.now() < not_before.get((ns, pod), 0):
                    continue
                message, wait = self._evict_one(ns, pod)
                if message:
                    blocked[(ns, pod)] = message
                    not_before[(ns, pod)] = clock.now() + wait
                else:
                    blocked.pop((ns, pod), None)
                    accepted.add((ns, pod))
            still = {
                _ref(p): p["metadata"].get("uid")
                for p in self.pods_on(host)
                if _ref(p) in pending and p["metadata"].get("uid") == pending[_ref(p)]
            }
            pending = {k: v for k, v in pending.items() if k in still}
            if not pending:
                return f"evicted {len(pods)} {what}(s)" if pods else f"no {what} to evict"
            if clock.now() - start >= timeout:
                (ns, pod), why = next(iter(blocked.items()), (next(iter(pending)), ""))
                raise StepFailed(
                    f"{what} eviction timed out after {timeout:g} s: {len(pending)} left; "
                    f"{ns}/{pod}: {why or 'still terminating'}"
                )
            clock.sleep(opts.poll)

    def _evict_one(self, ns: str, pod: str) -> tuple[str, float]:
        """Ask for one eviction once; returns why it was refused ("" when accepted or gone)
        and how long to wait before asking again (the server's Retry-After; 0: next poll).
        A PodDisruptionBudget's refusal names its budget (a cause of type DisruptionBudget);
        any other 429 or 5xx with Retry-After is the API server's back-pressure."""
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": pod, "namespace": ns},
        }
        try:
            self.cluster.raw(
                "POST", f"/api/v1/namespaces/{ns}/pods/{pod}/eviction", body=body,
                ctype="application/json", retries=0,
            )  # fmt: skip
        except ApiException as exc:
            if exc.status == 404:
                return "", 0
            wait = retry_after((exc.headers or {}).get("Retry-After"))
            if exc.status == 429 and _budget_refusal(exc):
                return _budget_message(exc), wait or 0
            if backpressure(exc.status) and wait is not None:
                return (
                    f"throttled by the API server ({exc.status} {exc.reason}; "
                    f"asked to retry after {wait} s)",
                    wait,
                )
            if exc.status == 429:  # no cause, no Retry-After: treated as back-pressure too
                return f"throttled by the API server (429 {exc.reason})", 0
            raise StepFailed(f"eviction of {ns}/{pod}: {status_message(exc)}") from None
        return "", 0

    def _gpus(self, host: str) -> tuple[dict[str, Any], int, list[dict[str, Any]]]:
        """The node, its GPUs, and (DRA) the devices NVIDIA's DRA driver publishes for it: under
        DRA the kubelet advertises no nvidia.com/gpu, the ResourceSlices stand for it."""
        node = self.read_node(host)
        if not self.dra:
            return node, gpu_allocatable(node), []
        devices = dra.node_devices(self.cluster).get(self.node_names[host], [])
        return node, len(dra.covered_gpus(devices)), devices

    def validate(
        self, name: str, clock: Clock, opts: StepOptions, driver: Mapping[str, Any] | None = None
    ) -> str:
        """The node Ready with its GPUs back, then verify's `pod` check on it: the pod must
        succeed and nvidia-smi in it list exactly one GPU, one of the host's as the driver
        role read them (`driver`: its gpustack_driver fact; without its GPUs, any one GPU)."""
        start = clock.now()
        node_name = self.node_names[name]
        what = f"GPU(s) in ResourceSlices of {DRA_DRIVER}" if self.dra else "allocatable GPU(s)"
        while True:
            node, gpus, devices = self._gpus(name)
            if _ready(node) and gpus > 0:
                break
            if clock.now() - start >= opts.validation_timeout:
                state = "Ready" if _ready(node) else "not Ready"
                plugin = "DRA kubelet plugin" if self.dra else "device plugin"
                raise StepFailed(
                    f"validation: node {node_name} is {state} with {gpus} {what} after "
                    f"{opts.validation_timeout:g} s (is the {plugin} running there?)"
                )
            clock.sleep(opts.poll)
        note = f"node Ready, {gpus} " + (what if self.dra else "GPU(s) allocatable")
        if self.config is None:
            return note + "; no verification pod (gpustack's namespace is not installed)"
        from gpustack.k8s.cluster.verify import host_gpus

        expected = host_gpus({"gpustack_driver": dict(driver or {})}).uuids
        if self.dra:
            return note + "; " + self._verify_dra_pod(name, devices, expected, clock)
        return note + "; " + self._verify_pod(name, expected, clock, opts, start)

    def _verify_dra_pod(self, host: str, devices: list[dict[str, Any]], expected, clock) -> str:
        """verify's DRA `pod` check on one node: a claim for a free device of the node."""
        from gpustack.k8s.cluster.checks import NodeReport
        from gpustack.k8s.cluster.verify import dra_pod_verdict

        node = self.node_names[host]
        report = NodeReport(host, node)
        outcomes, _ = dra.run_verify_pods(self.cluster, self.config, {host: report},
                                          {host: devices}, clock, cordoned=True)  # fmt: skip
        if host not in outcomes:  # every device is allocated: not disturbed
            return "no verification pod: " + (report.checks[0].message if report.checks else "")
        outcome = outcomes[host]
        if outcome.phase != "Succeeded":
            raise StepFailed(f"validation: verification pod on {node}: {outcome.message}")
        return _judged(node, *dra_pod_verdict(expected, outcome.log, devices))

    def _verify_pod(self, host, expected, clock, opts, start) -> str:
        from gpustack.k8s.cluster.pods import pod_name, run_pods
        from gpustack.k8s.cluster.verify import pod_verdict
        from gpustack.k8s.manifests import render_verify_pod

        node = self.node_names[host]
        node_obj = self.read_node(host)
        pods = self.pods_on(host)
        found = gpu_resources.units(node_obj, pods)
        unit = gpu_resources.choose(found, self.config.resource_name)
        if unit is None:  # the node's GPUs are busy again: verify without disturbing them
            return "no verification pod: " + gpu_resources.busy_message(found)
        pod = render_verify_pod(self.config, node_name=node, gpus=1, name=pod_name("smi", node),
                                resource=unit.resource)  # fmt: skip
        left = max(1.0, opts.validation_timeout - (clock.now() - start))
        outcome = run_pods(self.cluster, {host: pod}, left, clock)[host]
        if outcome.phase != "Succeeded":
            raise StepFailed(f"validation: verification pod on {node}: {outcome.message}")
        return _judged(node, *pod_verdict(self.config, expected, outcome.log))


def _judged(node: str, ok: bool, message: str) -> str:
    """The validation's note for a verification pod that succeeded, judged by verify's own
    check of its output; StepFailed when the output does not show the node's GPU."""
    if not ok:
        raise StepFailed(f"validation: verification pod on {node}: {message}")
    return f"verification pod succeeded: {message}"


def refusal_message(refused: dict[str, list[str]], what: str) -> str:
    """Pure: one message for the refused pods, grouped by reason, each with its flag."""

    def names(key: str) -> str:
        pods = refused[key]
        more = f" and {len(pods) - 5} more" if len(pods) > 5 else ""
        return ", ".join(pods[:5]) + more

    parts = []
    if UNMANAGED in refused:
        parts.append(
            f"{what}(s) not managed by a controller would be lost: {names(UNMANAGED)}"
            " (pass --force to evict them anyway)"
        )
    if ORPHANED in refused:
        parts.append(
            f"{what}(s) whose DaemonSet is gone would be lost: {names(ORPHANED)}"
            " (pass --force to evict them anyway)"
        )
    if LOCAL_STORAGE in refused:
        parts.append(
            f"{what}(s) with local storage (emptyDir) would lose its data: {names(LOCAL_STORAGE)}"
            " (pass --delete-emptydir-data to evict them anyway)"
        )
    return "; ".join(parts)


def _budget_refusal(exc: ApiException) -> bool:
    """The eviction API's refusal for a PodDisruptionBudget: a cause of type DisruptionBudget
    (k8s.io/kubernetes@v1.36.3 pkg/registry/core/pod/storage/eviction.go; a StatusCause's
    type is `reason` in JSON)."""
    causes = (status_body(exc).get("details") or {}).get("causes") or []
    return any(c.get("reason") == "DisruptionBudget" for c in causes)


def _budget_message(exc: ApiException) -> str:
    body = status_body(exc)
    causes = (body.get("details") or {}).get("causes") or []
    detail = "; ".join(c.get("message", "") for c in causes if c.get("message"))
    base = body.get("message") or "eviction refused (429)"
    return f"blocked by a PodDisruptionBudget: {detail or base}"
