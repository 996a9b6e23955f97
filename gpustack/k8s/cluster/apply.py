"""Server-side apply of gpustack's objects, DaemonSet readiness, and removal by label.

Apply uses field manager `gpustack` with `force=true`: gpustack owns the objects it renders,
so a field someone changed by hand on them is taken back (as the GPU Operator's reconciler
would); fields gpustack does not set stay untouched. Re-applying unchanged objects changes
nothing (same resourceVersion).
"""

from __future__ import annotations

from dataclasses import dataclass, field
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
    """Pure: is this DaemonSet rolled out and ready on at least `expected_nodes` nodes?"""
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


@dataclass
class RolloutResult:
    name: str
    ready: bool
    message: str
    nodes: list[str] = field(default_factory=list)  # labelled nodes it must run on


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


def wait_daemonsets(
    cluster: Cluster,
    namespace: str,
    names: list[str],
    node_labels: dict[str, dict[str, str]],
    timeout: float,
    clock: Clock | None = None,
) -> list[RolloutResult]:
    """Poll until every DaemonSet is ready on the labelled nodes it selects, or `timeout`.

    A DaemonSet that does not exist ends the wait at once (nothing will create it).
    """
    clock = clock or Clock()
    start = clock.now()
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
            ready, message = daemonset_state(ds, len(nodes))
            results.append(RolloutResult(name, ready, message, nodes))
        if all(r.ready for r in results) or missing or clock.now() - start >= timeout:
            for r in results:
                if not r.ready and not r.message.startswith("not found"):
                    r.message = f"not ready after {timeout:.0f} s: {r.message}"
            return results
        clock.sleep(POLL_SECONDS)


# ----------------------------------------------------------------------------- removal

# The GPU allocators gpustack can deploy (gpustack_k8s_gpu_allocation); one runs at a time.
ALLOCATOR_DAEMONSETS = ("nvidia-device-plugin", "nvidia-dra-driver-gpu-kubelet-plugin")


def remove_other_allocator(
    cluster: Cluster, namespace: str, objects: list[dict[str, Any]]
) -> list[str]:
    """Delete gpustack's DaemonSet of the GPU allocator that is not rendered any more.

    Switching gpustack_k8s_gpu_allocation must not leave the device plugin and the DRA
    kubelet plugin both handing out the same GPUs. Only a DaemonSet labelled managed-by
    gpustack is deleted; returns what was deleted.
    """
    rendered = {o["metadata"]["name"] for o in objects if o["kind"] == "DaemonSet"}
    removed = []
    for name in ALLOCATOR_DAEMONSETS:
        if name in rendered:
            continue
        ds = get_daemonset(cluster, namespace, name)
        if ds is None:
            continue
        if ((ds.get("metadata") or {}).get("labels") or {}).get(MANAGED_LABEL) != "gpustack":
            continue
        path = f"/apis/apps/v1/namespaces/{namespace}/daemonsets/{name}"
        call(lambda p=path: cluster.raw("DELETE", p), f"delete DaemonSet {namespace}/{name}")
        removed.append(f"DaemonSet {namespace}/{name}")
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
