"""Server-side apply of gpustack's objects, DaemonSet readiness, and removal by label.

Apply uses field manager `gpustack` with `force=true`: gpustack owns the objects it renders,
so a field someone changed by hand on them is taken back (as the GPU Operator's reconciler
would); fields gpustack does not set stay untouched. Re-applying unchanged objects changes
nothing (same resourceVersion).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic.exceptions import ResourceNotFoundError

from gpustack.errors import GpustackError
from gpustack.k8s.cluster.connect import (
    FIELD_MANAGER,
    Clock,
    Cluster,
    api_hint,
    call,
    status_message,
)
from gpustack.k8s.manifests import COMMON_LABELS, MANAGED_LABEL

SERVICEMONITOR_CRD = "servicemonitors.monitoring.coreos.com"
MANAGED_SELECTOR = f"{MANAGED_LABEL}={COMMON_LABELS[MANAGED_LABEL]}"
POLL_SECONDS = 1.0


@dataclass
class Applied:
    kind: str
    name: str
    namespace: str | None
    action: str  # created, configured, unchanged, kept (not gpustack's), would apply (check mode)

    @property
    def ref(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind} {where}{self.name}"


def crd_exists(cluster: Cluster, name: str = SERVICEMONITOR_CRD) -> bool:
    try:
        cluster.raw("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
    except ApiException as exc:
        if exc.status in (403, 404):  # absent, or not ours to know: no ServiceMonitor either way
            return False
        raise GpustackError(
            f"cannot read CRD {name}: {status_message(exc)}", api_hint(exc)
        ) from None
    return True


def apply_objects(
    cluster: Cluster, objects: list[dict[str, Any]], dry_run: bool = False
) -> list[Applied]:
    """Server-side apply each object in order; report what changed."""
    done = []
    absent_namespaces = set()  # check mode: a namespace that would be created holds nothing yet
    others = runtime_classes_of_others(cluster, objects)  # refused before anything is applied
    for obj in objects:
        meta = obj["metadata"]
        name, namespace = meta["name"], meta.get("namespace")
        ref = f"{obj['kind']} {namespace + '/' if namespace else ''}{name}"
        if obj["kind"] == "RuntimeClass" and name in others:
            done.append(Applied(obj["kind"], name, namespace, "kept (not gpustack's)"))
            continue
        if dry_run and namespace in absent_namespaces:
            done.append(Applied(obj["kind"], name, namespace, "would create"))
            continue
        resource = call(
            lambda o=obj: cluster.dynamic.resources.get(
                api_version=o["apiVersion"], kind=o["kind"]
            ),
            f"find the API for {obj['apiVersion']} {obj['kind']}",
        )
        before = _get_or_none(cluster, resource, name, namespace, ref)
        extra = {"dry_run": "All"} if dry_run else {}
        after = call(
            lambda o=obj, r=resource, n=name, ns=namespace, x=extra: r.server_side_apply(
                body=o, name=n, namespace=ns, field_manager=FIELD_MANAGER, force_conflicts=True, **x
            ),
            f"apply {ref}",
        )
        if dry_run:
            action = "would create" if before is None else "would apply"
            if before is None and obj["kind"] == "Namespace":
                absent_namespaces.add(name)
        elif before is None:
            action = "created"
        elif before.metadata.resourceVersion == after.metadata.resourceVersion:
            action = "unchanged"
        else:
            action = "configured"
        done.append(Applied(obj["kind"], name, namespace, action))
    return done


def runtime_classes_of_others(cluster: Cluster, objects: list[dict[str, Any]]) -> set[str]:
    """The RuntimeClasses gpustack renders that exist without its label: k3s installs one named
    nvidia itself (k3s-io/k3s issue 8700), and so does the GPU Operator. gpustack does not take
    them over (uninstall would delete them): one with the same handler serves gpustack's pods as
    it is and is kept; one with another handler is refused, before anything is applied."""
    kept = set()
    for obj in objects:
        if obj["kind"] != "RuntimeClass":
            continue
        name = obj["metadata"]["name"]
        found = read_or_none(
            cluster, f"/apis/node.k8s.io/v1/runtimeclasses/{name}", f"RuntimeClass {name}"
        )
        if found is None:
            continue
        labels = (found.get("metadata") or {}).get("labels") or {}
        if labels.get(MANAGED_LABEL) == COMMON_LABELS[MANAGED_LABEL]:
            continue
        if found.get("handler") != obj["handler"]:
            raise GpustackError(
                f"RuntimeClass {name} exists with handler {found.get('handler')!r}, not "
                f"{obj['handler']!r}, and gpustack did not create it; nothing was applied",
                "set gpustack_k8s_runtime_class to another name, or delete that RuntimeClass "
                "if nothing uses it",
            )
        kept.add(name)
    return kept


def _get_or_none(cluster, resource, name, namespace, ref):
    try:
        return resource.get(name=name, namespace=namespace)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise GpustackError(f"cannot read {ref}: {status_message(exc)}", api_hint(exc)) from None


# ----------------------------------------------------------------------------- DaemonSets


def daemonset_state(ds: dict[str, Any], expected_nodes: int) -> tuple[bool, str]:
    """Pure: is this DaemonSet rolled out and ready on at least `expected_nodes` nodes?

    The DaemonSet as a whole, from its status: one broken node anywhere makes it not ready.
    Install and verify judge each node by its own pod instead (`node_verdict`)."""
    meta, status = ds.get("metadata") or {}, ds.get("status") or {}
    generation = meta.get("generation", 0)
    observed = status.get("observedGeneration", 0)
    desired = status.get("desiredNumberScheduled", 0)
    ready = status.get("numberReady", 0)
    updated = status.get("updatedNumberScheduled", 0)
    text = f"{ready}/{desired} ready, {updated} updated"
    if observed < generation:
        return False, f"{text}; the controller has not seen generation {generation} yet"
    if desired < expected_nodes:
        return False, f"{text}; scheduled on {desired} of {expected_nodes} labelled node(s)"
    if ready < desired or updated < desired:
        return False, text
    return True, text


# How the DaemonSet controller marks a pod of the current template
# (k8s.io/kubernetes@v1.36.3 pkg/controller/daemon/util/daemonset_util.go, IsPodUpdated and
# CreatePodTemplate): its label pod-template-generation equals the DaemonSet's template
# generation (the API server keeps it in the annotation below), or its label
# controller-revision-hash equals the hash of the DaemonSet's current ControllerRevision (the
# one of the highest revision once the controller has observed the generation:
# pkg/controller/daemon/update.go, constructHistory). Either matching is enough: a template
# changed back to an earlier one keeps the pods of that revision, with their old generation.
TEMPLATE_GENERATION = "deprecated.daemonset.template.generation"
GENERATION_LABEL = "pod-template-generation"
HASH_LABEL = "controller-revision-hash"
# A pod must have been Ready this long (or the DaemonSet's minReadySeconds, if longer) before
# it counts: gpustack's operands have no readiness probe, so a container that starts and then
# crashes is Ready for a moment. Kubernetes calls such a pod available
# (pkg/api/v1/pod/util.go IsPodAvailable: Ready for minReadySeconds, from the Ready
# condition's lastTransitionTime).
STEADY_SECONDS = 5.0

READY, SETTLING, NOT_READY = "ready", "settling", "not ready"


@dataclass
class Verdict:
    """The DaemonSet's state on one node, from its pods there."""

    state: str  # READY, SETTLING (Ready, not yet for long enough) or NOT_READY
    text: str
    run: tuple = ()  # SETTLING: the container run that is Ready (pod uid, restart counts)
    need: float = 0.0  # SETTLING: the seconds it must stay Ready


def selector_query(selector: dict[str, Any]) -> str:
    """A LabelSelector (matchLabels, matchExpressions) as a labelSelector query string."""
    parts = [f"{k}={v}" for k, v in sorted((selector.get("matchLabels") or {}).items())]
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], ",".join(expr.get("values") or [])
        parts.append({"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})",
                      "Exists": key, "DoesNotExist": f"!{key}"}[op])  # fmt: skip
    return ",".join(parts)


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("uid") == uid and r.get("controller") for r in refs)


def target_node(pod: dict[str, Any]) -> str:
    """The node a DaemonSet pod is for: spec.nodeName, or before it is bound the node its
    required node affinity names (k8s.io/kubernetes@v1.36.3 pkg/controller/daemon/util,
    GetTargetNodeName)."""
    spec = pod.get("spec") or {}
    if spec.get("nodeName"):
        return spec["nodeName"]
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})  # fmt: skip
    for term in required.get("nodeSelectorTerms") or []:
        for field_req in term.get("matchFields") or []:
            values = field_req.get("values") or []
            if field_req.get("key") == "metadata.name" and len(values) == 1:
                return values[0]
    return ""


def pod_updated(pod: dict[str, Any], generation: str | None, current_hash: str | None) -> bool:
    """Pure: whether the DaemonSet controller counts `pod` as of the current template."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return bool(
        (generation is not None and labels.get(GENERATION_LABEL) == generation)
        or (current_hash and labels.get(HASH_LABEL) == current_hash)
    )


def _ready_condition(pod: dict[str, Any]) -> dict[str, Any]:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == "Ready"), {})


def _parse_time(value: str | None) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _restarts(pod: dict[str, Any]) -> tuple[int, ...]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    return tuple(int(c.get("restartCount") or 0) for c in statuses)


def why_not_ready(pod: dict[str, Any]) -> str:
    """Pure: a pod's state in the scheduler's and kubelet's words, from its status only."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"{phase}, not scheduled: {cond.get('message') or cond.get('reason', '')}"
    words = []
    for container in status.get("containerStatuses") or []:
        state = container.get("state") or {}
        detail = state.get("waiting") or state.get("terminated")
        if detail:
            text = detail.get("reason") or ("Waiting" if "waiting" in state else "Terminated")
            if "exitCode" in detail:
                text += f" (exit code {detail['exitCode']})"
            if detail.get("message"):
                text += f": {detail['message'][:300]}"
            words.append(f"container {container.get('name')} {text}")
        elif not container.get("ready"):
            words.append(f"container {container.get('name')} running, not ready")
        restarts = int(container.get("restartCount") or 0)
        if restarts:
            words.append(f"restarted {restarts} time(s)")
    if not words:
        cond = _ready_condition(pod)
        words.append(cond.get("message") or cond.get("reason") or "no status from its kubelet")
    return f"{phase}, not Ready: {'; '.join(words)}"


def node_verdict(
    ds: dict[str, Any],
    pods: list[dict[str, Any]],
    node: str,
    current_hash: str | None,
    wall_now: float,
) -> Verdict:
    """Pure: the DaemonSet on `node`, from its pods whose target node it is. Ready when a pod
    of the current template there is Ready and has been for STEADY_SECONDS (or the DaemonSet's
    minReadySeconds) by the kubelet's clock; SETTLING when it is Ready for less."""
    meta = ds.get("metadata") or {}
    generation = (meta.get("annotations") or {}).get(TEMPLATE_GENERATION)
    live = [p for p in pods if not (p.get("metadata") or {}).get("deletionTimestamp")]
    if not live:
        going = " (its previous pod is being deleted)" if pods else ""
        return Verdict(NOT_READY, f"on {node}: no pod scheduled yet{going}")
    current = [p for p in live if pod_updated(p, generation, current_hash)]
    if not current:
        pod = live[0]
        name = pod["metadata"]["name"]
        had = ((pod.get("metadata") or {}).get("labels") or {}).get(GENERATION_LABEL, "?")
        return Verdict(NOT_READY, f"on {node}: pod {name} is of an old template (generation "
                                  f"{had}, the DaemonSet's is {generation or '?'}); "
                                  "the controller has not replaced it yet")  # fmt: skip
    ready = [p for p in current if _ready_condition(p).get("status") == "True"]
    if not ready:
        pod = current[0]
        return Verdict(NOT_READY, f"on {node}: pod {pod['metadata']['name']} "
                                  f"{why_not_ready(pod)}")  # fmt: skip
    pod = ready[0]
    name = pod["metadata"]["name"]
    need = max(float((ds.get("spec") or {}).get("minReadySeconds") or 0), STEADY_SECONDS)
    since = _parse_time(_ready_condition(pod).get("lastTransitionTime"))
    held = wall_now - since if since is not None else 0.0
    if held >= need:
        return Verdict(READY, f"on {node}: pod {name} Ready")
    restarts = sum(_restarts(pod))
    again = f" after {restarts} restart(s)" if restarts else ""
    run = (pod["metadata"].get("uid"), _restarts(pod))
    text = f"on {node}: pod {name} Ready{again} for {max(held, 0):.0f} s of the {need:.0f} s"
    return Verdict(SETTLING, text, run, need)


@dataclass
class RolloutResult:
    name: str
    ready: bool  # ready on every node of `nodes`
    message: str
    nodes: list[str] = field(default_factory=list)  # labelled nodes it must run on
    problems: dict[str, str] = field(default_factory=dict)  # node of `nodes` -> why not ready
    kind: str = "DaemonSet"  # or Deployment: not per node (`nodes` empty), every node needs it

    @property
    def ready_count(self) -> int:
        """How many of what it waits for are ready: (DaemonSet, node) pairs, or 1 for a ready
        Deployment (the wait's progress)."""
        if self.kind == "Deployment":
            return int(self.ready)
        return len(self.nodes) - len(self.problems)


def _selects(ds: dict[str, Any], labels: dict[str, str]) -> bool:
    spec = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
    return all(labels.get(k) == v for k, v in (spec.get("nodeSelector") or {}).items())


def read_or_none(cluster: Cluster, path: str, ref: str) -> dict[str, Any] | None:
    """An object as the API server has it (GET path); None when it does not exist."""
    try:
        return cluster.raw("GET", path)
    except ApiException as exc:
        if exc.status != 404:
            message = f"cannot read {ref}: {status_message(exc)}"
            raise GpustackError(message, api_hint(exc)) from None
        return None


def get_daemonset(cluster: Cluster, namespace: str, name: str) -> dict[str, Any] | None:
    """The DaemonSet as the API server has it; None when it does not exist."""
    path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"
    return read_or_none(cluster, path, f"DaemonSet {namespace}/{name}")


def _deployment_rollout(cluster: Cluster, namespace: str, name: str) -> RolloutResult:
    """One look at a Deployment as `kubectl rollout status` judges it: the controller has seen
    its generation, every replica is of the current template and available, and no old one is
    left (DeploymentStatusViewer, k8s.io/kubectl@v0.36.3/pkg/polymorphichelpers/rollout_status.go)
    """
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{name}"
    dep = read_or_none(cluster, path, f"Deployment {namespace}/{name}")
    if dep is None:
        message = "not found: run `gpustack install INVENTORY --kubeconfig K` first"
        return RolloutResult(name, False, message, kind="Deployment")
    status = dep.get("status") or {}
    want = (dep.get("spec") or {}).get("replicas", 1)
    updated, total = status.get("updatedReplicas", 0), status.get("replicas", 0)
    available = status.get("availableReplicas", 0)
    stuck = [c for c in status.get("conditions") or []
             if c.get("reason") == "ProgressDeadlineExceeded"]  # Progressing False  # fmt: skip
    if status.get("observedGeneration", 0) < (dep.get("metadata") or {}).get("generation", 0):
        text = "the controller has not observed its newest generation yet"
    elif stuck:
        text = f"its rollout exceeded its progress deadline: {stuck[0].get('message', '')}"
    elif updated < want:
        text = f"{updated} of {want} replica(s) updated"
    elif total > updated:
        text = f"{total - updated} old replica(s) pending termination"
    elif available < updated:
        text = f"{available} of {updated} updated replica(s) available"
    else:
        return RolloutResult(name, True, f"{available} replica(s) available", kind="Deployment")
    return RolloutResult(name, False, text, kind="Deployment")


def daemonset_pods(cluster: Cluster, ds: dict[str, Any]) -> list[dict[str, Any]]:
    """The pods the DaemonSet controls: one list, by its selector."""
    meta = ds["metadata"]
    selector = selector_query((ds.get("spec") or {}).get("selector") or {})
    pods = cluster.list_all(f"/api/v1/namespaces/{meta['namespace']}/pods",
                            f"list the pods of DaemonSet {meta['name']}",
                            labelSelector=selector)  # fmt: skip
    return [p for p in pods if owned_by(p, meta.get("uid"))]


def current_revision_hash(cluster: Cluster, ds: dict[str, Any]) -> str | None:
    """The controller-revision-hash of the DaemonSet's current ControllerRevision (the highest
    revision it owns); None when it has none."""
    meta = ds["metadata"]
    path = f"/apis/apps/v1/namespaces/{meta['namespace']}/controllerrevisions"
    selector = selector_query((ds.get("spec") or {}).get("selector") or {})
    try:
        answer = cluster.raw("GET", path, [("labelSelector", selector)])
    except ApiException as exc:
        if exc.status == 404:
            return None
        message = f"cannot list the revisions of DaemonSet {meta['name']}: {status_message(exc)}"
        raise GpustackError(message, api_hint(exc)) from None
    owned = [r for r in answer.get("items") or [] if owned_by(r, meta.get("uid"))]
    if not owned:
        return None
    latest = max(owned, key=lambda r: r.get("revision", 0))
    return ((latest.get("metadata") or {}).get("labels") or {}).get(HASH_LABEL) or latest[
        "metadata"
    ]["name"]


def _rollout(cluster, ds, nodes, steady, mono_now, wall_now) -> RolloutResult:
    """One look at a DaemonSet on the nodes it must run on. `steady`: (DaemonSet, node) ->
    (container run, when it was first seen Ready) over the wait's looks."""
    name = ds["metadata"]["name"]
    generation = (ds.get("metadata") or {}).get("generation", 0)
    if (ds.get("status") or {}).get("observedGeneration", 0) < generation:
        text = f"the controller has not observed generation {generation} yet"
        return RolloutResult(name, False, text, nodes, {n: text for n in nodes})
    pods = daemonset_pods(cluster, ds)
    by_node: dict[str, list[dict[str, Any]]] = {}
    for pod in sorted(pods, key=lambda p: p["metadata"].get("creationTimestamp") or ""):
        by_node.setdefault(target_node(pod), []).append(pod)
    template = (ds["metadata"].get("annotations") or {}).get(TEMPLATE_GENERATION)
    mine = [p for n in nodes for p in by_node.get(n, [])]
    current_hash = None
    if any(((p["metadata"].get("labels") or {}).get(GENERATION_LABEL) != template) for p in mine):
        current_hash = current_revision_hash(cluster, ds)
    problems = {}
    for node in nodes:
        verdict = node_verdict(ds, by_node.get(node, []), node, current_hash, wall_now)
        key = (name, node)
        if verdict.state == SETTLING:
            run, first = steady.get(key, (None, mono_now))
            if run != verdict.run:
                first = mono_now
            steady[key] = (verdict.run, first)
            if mono_now - first >= verdict.need:  # seen Ready that long by this wait's clock
                continue
        else:
            steady.pop(key, None)
        if verdict.state != READY:
            problems[node] = verdict.text
    elsewhere = sorted(
        target_node(p) or "no node"
        for p in pods
        if target_node(p) not in nodes
        and not p["metadata"].get("deletionTimestamp")
        and _ready_condition(p).get("status") != "True"
    )
    note = f"; not Ready elsewhere (not checked): {', '.join(elsewhere)}" if elsewhere else ""
    if problems:
        return RolloutResult(name, False, "; ".join(problems.values()) + note, nodes, problems)
    return RolloutResult(name, True, f"ready on {len(nodes)} node(s){note}", nodes)


def wait_daemonsets(
    cluster: Cluster,
    namespace: str,
    names: list[str],
    node_labels: dict[str, dict[str, str]],
    timeout: float,
    clock: Clock | None = None,
    deployments: list[str] | tuple[str, ...] = (),
) -> list[RolloutResult]:
    """Poll until every DaemonSet is ready on each labelled node it selects and every one of
    `deployments` is rolled out (HAMi's scheduler, which each GPU pod goes through), or until
    `timeout` seconds pass without progress: a rollout across many nodes may take longer
    than `timeout` in all, as long as one more (DaemonSet, node) gets ready within each
    `timeout` seconds (a fixed total failed large fleets that were still progressing).

    Each node is judged by its own pod (the GPU Operator's validator works per node too): a
    pod of the current template, Ready for STEADY_SECONDS. A pod not ready on a node outside
    `node_labels` is mentioned, and fails nothing. One pod list per DaemonSet per look (and a
    ControllerRevision list only when a pod's template generation is not the DaemonSet's).
    A DaemonSet that does not exist ends the wait at once (nothing will create it).
    """
    clock = clock or Clock()
    start = progressed = clock.now()
    steady: dict[tuple[str, str], tuple[tuple, float]] = {}
    most_ready = 0  # the most (DaemonSet, node) pairs seen ready at once
    while True:
        results, missing = [], False
        for name in names:
            ds = get_daemonset(cluster, namespace, name)
            if ds is None:
                missing = True
                message = "not found: run `gpustack install INVENTORY --kubeconfig K` first"
                results.append(RolloutResult(name, False, message, []))
                continue
            nodes = [n for n, labels in node_labels.items() if _selects(ds, labels)]
            results.append(_rollout(cluster, ds, nodes, steady, clock.now(), time.time()))
        for name in deployments:
            results.append(_deployment_rollout(cluster, namespace, name))
            missing = missing or results[-1].message.startswith("not found")
        now = clock.now()
        ready = sum(r.ready_count for r in results)
        if ready > most_ready:
            most_ready, progressed = ready, now
        if all(r.ready for r in results) or missing or now - progressed >= timeout:
            waited = now - start
            after = f"not ready after {timeout:.0f} s"
            if waited > timeout + POLL_SECONDS:  # it progressed, then stalled
                after = f"not ready after {waited:.0f} s, the last {timeout:.0f} s without progress"
            for r in results:
                if not r.ready and not r.message.startswith("not found"):
                    r.message = f"{after}: {r.message}"
                    r.problems = {n: f"{after}: {p}" for n, p in r.problems.items()}
            return results
        clock.sleep(POLL_SECONDS)


# ----------------------------------------------------------------------------- removal


def prune(
    cluster: Cluster,
    namespace: str,
    objects: list[dict[str, Any]],
    kinds: list[tuple[str, str]],
    dry_run: bool = False,
) -> list[str]:
    """Delete gpustack's objects in its namespace that the current settings no longer render.

    Turning an operand off (GFD, dcgm-exporter, MPS, time-slicing) or switching
    gpustack_k8s_gpu_allocation leaves its DaemonSet and the rest behind otherwise (with the
    two GPU allocators both handing out the same GPUs). Only objects of `kinds` (the namespaced
    kinds gpustack renders under any setting) labelled managed-by gpustack, in `namespace`, are
    considered: cluster-scoped objects may be another gpustack install's and stay until
    `uninstall`. A kind the cluster does not serve is passed over. Returns the references
    deleted (with `dry_run`, those that would be)."""
    rendered = {
        (o["kind"], o["metadata"]["name"]) for o in objects if o["metadata"].get("namespace")
    }
    removed = []
    for api_version, kind in kinds:
        resource = call(
            lambda a=api_version, k=kind: _served(cluster, a, k),
            f"find the API for {api_version} {kind}",
        )
        if resource is None or not resource.namespaced:
            continue
        found = call(
            lambda r=resource: r.get(label_selector=MANAGED_SELECTOR, namespace=namespace),
            f"list {kind} objects managed by gpustack",
        )
        for item in found.items:
            name = item.metadata.name
            if (kind, name) in rendered:
                continue
            ref = f"{kind} {namespace}/{name}"
            if not dry_run:
                _delete(cluster, resource, name, namespace, ref)
            removed.append(ref)
    return removed


def delete_elsewhere(
    cluster: Cluster, objects: list[dict[str, Any]], namespace: str, dry_run: bool = False
) -> list[str]:
    """Delete, by name, the namespaced `objects` that live outside gpustack's `namespace` (where
    another component reads them under a fixed name: Volcano's vGPU device configuration in
    kube-system), when they are there and labelled managed-by gpustack. Only the objects named
    are looked at, never a whole foreign namespace. Returns the references deleted (with
    `dry_run`, those that would be)."""
    removed = []
    seen = set()
    for obj in objects:
        meta = obj["metadata"]
        where = meta.get("namespace")
        key = (obj["apiVersion"], obj["kind"], where, meta["name"])
        if not where or where == namespace or key in seen:
            continue
        seen.add(key)
        resource = call(
            lambda a=obj["apiVersion"], k=obj["kind"]: _served(cluster, a, k),
            f"find the API for {obj['apiVersion']} {obj['kind']}",
        )
        if resource is None:
            continue
        ref = f"{obj['kind']} {where}/{meta['name']}"
        found = _get_or_none(cluster, resource, meta["name"], where, ref)
        if found is None or (found.metadata.labels or {}).get(MANAGED_LABEL) != "gpustack":
            continue  # absent, or not gpustack's
        if not dry_run:
            _delete(cluster, resource, meta["name"], where, ref)
        removed.append(ref)
    return removed


def _served(cluster: Cluster, api_version: str, kind: str):
    """The dynamic client's resource for a kind, or None when the cluster does not serve it."""
    try:
        return cluster.dynamic.resources.get(api_version=api_version, kind=kind)
    except ResourceNotFoundError:
        return None


def delete_managed(
    cluster: Cluster, objects: list[dict[str, Any]], namespace: str
) -> tuple[list[str], list[str]]:
    """Delete every object labelled managed-by=gpustack of the kinds gpustack renders.

    Namespaced kinds are looked up in gpustack's namespace only; cluster-scoped ones
    (RuntimeClass, DeviceClass, ClusterRole) cluster-wide, by label. A kind the cluster does
    not serve (DeviceClass before Kubernetes 1.34) is passed over. The namespace itself goes
    last, and only when gpustack created it (its label) and nothing of a user's lives in it.
    Returns (deleted, kept) references.
    """
    kept: list[str] = []
    kinds: list[tuple[str, str]] = []
    for obj in [*objects, {"apiVersion": "v1", "kind": "Pod"}]:
        key = (obj["apiVersion"], obj["kind"])
        if key not in kinds and obj["kind"] != "Namespace":
            kinds.append(key)
    deleted = []
    for api_version, kind in reversed(kinds):
        resource = call(
            lambda a=api_version, k=kind: _served(cluster, a, k),
            f"find the API for {api_version} {kind}",
        )
        if resource is None:
            continue  # a kind the cluster does not serve holds nothing of gpustack's
        where = {"namespace": namespace} if resource.namespaced else {}
        found = call(
            lambda r=resource, w=where: r.get(label_selector=MANAGED_SELECTOR, **w),
            f"list {kind} objects managed by gpustack",
        )
        for item in found.items:
            name = item.metadata.name
            _delete(cluster, resource, name, item.metadata.namespace, f"{kind} {name}")
            deleted.append(
                f"{kind} {(item.metadata.namespace + '/') if item.metadata.namespace else ''}{name}"
            )
    ns_api = cluster.dynamic.resources.get(api_version="v1", kind="Namespace")
    ns = _get_or_none(cluster, ns_api, namespace, None, f"namespace {namespace}")
    if ns is not None and (ns.metadata.labels or {}).get(MANAGED_LABEL) == "gpustack":
        foreign = _foreign_objects(cluster, namespace)
        if foreign:
            kept.append(
                f"Namespace {namespace} (it holds objects gpustack did not create: "
                f"{', '.join(foreign[:3])}{' …' if len(foreign) > 3 else ''})"
            )
        else:
            _delete(cluster, ns_api, namespace, None, f"Namespace {namespace}")
            deleted.append(f"Namespace {namespace}")
    return deleted, kept


# Objects Kubernetes itself puts in every namespace.
_BUILTIN = {("ConfigMap", "kube-root-ca.crt"), ("ServiceAccount", "default")}


def _foreign_objects(cluster: Cluster, namespace: str) -> list[str]:
    """Objects in the namespace without gpustack's label (a user's), common kinds only."""
    found = []
    for api_version, kind in (
        ("v1", "Pod"),
        ("v1", "ConfigMap"),
        ("v1", "Secret"),
        ("v1", "Service"),
        ("v1", "ServiceAccount"),
        ("apps/v1", "Deployment"),
        ("apps/v1", "DaemonSet"),
        ("apps/v1", "StatefulSet"),
    ):
        try:
            resource = cluster.dynamic.resources.get(api_version=api_version, kind=kind)
            items = resource.get(namespace=namespace).items
        except Exception:  # a kind the cluster does not serve cannot hold a user's object
            continue
        for item in items:
            labels = item.metadata.labels or {}
            if labels.get(MANAGED_LABEL) == "gpustack" or (kind, item.metadata.name) in _BUILTIN:
                continue
            if kind == "Secret" and item.type == "kubernetes.io/service-account-token":
                continue
            found.append(f"{kind} {item.metadata.name}")
    return found


def _delete(cluster: Cluster, resource, name: str, namespace: str | None, ref: str) -> None:
    try:
        resource.delete(name=name, namespace=namespace)
    except ApiException as exc:
        if exc.status != 404:  # already gone is fine
            raise GpustackError(
                f"cannot delete {ref}: {status_message(exc)}", api_hint(exc)
            ) from None
