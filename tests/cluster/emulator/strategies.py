"""What kube-apiserver's registry strategies and admission plugins do to a new or deleted object.

Sources (kubernetes/kubernetes): pod defaults and validation of extended resources
(pkg/apis/core/v1/defaults.go, pkg/apis/core/validation), `PrepareForCreate` resetting
status (pkg/registry/*/strategy.go), `CheckGracefulDelete` for pods
(pkg/registry/core/pod/strategy.go: not scheduled or terminal -> 0 s, else the request's
grace period or spec.terminationGracePeriodSeconds), and the ServiceAccount and RuntimeClass
admission plugins (a pod naming a missing one is refused with 403).
"""

from __future__ import annotations

from tests.cluster.emulator.errors import ApiError
from tests.cluster.emulator.kinds import Kind
from tests.cluster.emulator.store import Store

# Kinds whose status the creator may set (the kubelet registers its Node with a status).
_KEEP_STATUS_ON_CREATE = {"Node"}


def quantity(value) -> int:
    """Integer quantities only (extended resources must be integers)."""
    return int(str(value))


def is_extended(resource: str) -> bool:
    """Extended resources: namespaced names outside kubernetes.io (nvidia.com/gpu, ...)."""
    if "/" not in resource:
        return False
    domain = resource.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def prepare_for_create(kind: Kind, obj: dict) -> None:
    if kind.has_status and kind.kind not in _KEEP_STATUS_ON_CREATE:
        obj.pop("status", None)
    if kind.kind == "Namespace":
        obj["status"] = {"phase": "Active"}
    if kind.kind == "Pod":
        _pod_defaults(obj)
    if kind.kind == "DaemonSet":
        template_generation(None, obj)


TEMPLATE_GENERATION = "deprecated.daemonset.template.generation"


def template_generation(old: dict | None, new: dict) -> None:
    """The DaemonSet's template generation, kept by the API server in an annotation of the
    apps/v1 object: 1 on create, one more at each change of spec.template, never the client's
    (k8s.io/kubernetes@v1.36.3 pkg/registry/apps/daemonset/strategy.go, PrepareForCreate and
    PrepareForUpdate; pkg/apis/apps/v1/conversion.go)."""
    value = 1
    if old is not None:
        before = (old["metadata"].get("annotations") or {}).get(TEMPLATE_GENERATION, "1")
        value = int(before)
        if (old.get("spec") or {}).get("template") != (new.get("spec") or {}).get("template"):
            value += 1
    new["metadata"].setdefault("annotations", {})[TEMPLATE_GENERATION] = str(value)


def _pod_defaults(pod: dict) -> None:
    name = pod.get("metadata", {}).get("name") or pod.get("metadata", {}).get("generateName", "")
    spec = pod.setdefault("spec", {})
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("schedulerName", "default-scheduler")
    spec.setdefault("serviceAccountName", spec.get("serviceAccount") or "default")
    for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
        resources = container.setdefault("resources", {})
        limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
        for key, value in limits.items():
            if is_extended(key):
                requests.setdefault(key, value)
        for key, value in requests.items():
            if not is_extended(key):
                continue
            where = f"spec.containers[{container.get('name')}].resources.requests[{key}]"
            try:
                amount = quantity(value)
            except ValueError:
                raise ApiError(422, "Invalid", f'Pod "{name}" is invalid: {where}: Invalid value: '
                               f'"{value}": must be an integer') from None  # fmt: skip
            if key not in limits:
                raise ApiError(422, "Invalid", f'Pod "{name}" is invalid: {where}: Forbidden: '
                               "Limit must be set for non overcommitable resources")  # fmt: skip
            if quantity(limits[key]) != amount:
                raise ApiError(422, "Invalid", f'Pod "{name}" is invalid: {where}: Invalid value: '
                               f'"{value}": must be equal to {key} limit of {limits[key]}')  # fmt: skip
        if requests:
            resources["requests"] = requests
    pod["status"] = {"phase": "Pending"}


def admit(store: Store, kind: Kind, obj: dict) -> None:
    """Admission plugins for a create: namespace exists, ServiceAccount, RuntimeClass."""
    meta = obj.get("metadata", {})
    ns = meta.get("namespace")
    if kind.namespaced and ns and store.get(store.kinds["/v1/namespaces"], None, ns) is None:
        raise ApiError(404, "NotFound", f'namespaces "{ns}" not found')
    if kind.kind != "Pod":
        return
    name = meta.get("name") or meta.get("generateName", "")
    spec = obj.get("spec", {})
    sa = spec.get("serviceAccountName") or "default"
    if store.get(store.kinds["/v1/serviceaccounts"], ns, sa) is None:
        raise ApiError(403, "Forbidden", f'pods "{name}" is forbidden: error looking up service '
                       f'account {ns}/{sa}: serviceaccount "{sa}" not found')  # fmt: skip
    runtime_class = spec.get("runtimeClassName")
    if runtime_class:
        rc = store.get(store.kinds["node.k8s.io/v1/runtimeclasses"], None, runtime_class)
        if rc is None:
            raise ApiError(403, "Forbidden", f'pods "{name}" is forbidden: pod rejected: '
                           f'RuntimeClass "{runtime_class}" not found')  # fmt: skip


def grace_period(pod: dict, requested: int | None) -> int:
    """CheckGracefulDelete for pods."""
    spec, status = pod.get("spec") or {}, pod.get("status") or {}
    period = (
        requested if requested is not None else int(spec.get("terminationGracePeriodSeconds", 30))
    )
    if not spec.get("nodeName"):
        period = 0
    if status.get("phase") in ("Failed", "Succeeded"):
        period = 0
    return 1 if period < 0 else period
