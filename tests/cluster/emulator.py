"""A Kubernetes API emulator for cluster-flow tests: kmock's scaffold plus a stateful store.

The real `kubernetes` client talks HTTP to this server; nothing in the client is patched.

What kmock 0.8 gives (`kmock.KubernetesScaffold`): an aiohttp server (`kmock.Server`), API
discovery (`/api`, `/apis`, `/apis/GROUP/VERSION`) built from declared resources, Kubernetes
`Status` errors, a request log (`emu.requests`) and its reaction DSL, so a test can inject a
fault: `emu["get", re.compile("/api/v1/nodes")] << 500` (reactions beat the store below).

What this module adds (kmock's own `KubernetesEmulator` merges JSON blindly, scans every object
per request and cannot parse `/api/v1/namespaces`):

* a store per resource with `resourceVersion`, `uid`, `generation` (bumped on spec changes only);
* server-side apply (`application/apply-patch+yaml`, `fieldManager`, `force`) with per-manager
  field ownership, `managedFields`, conflicts (409) and removal of fields a manager dropped;
  JSON merge / strategic merge (treated as merge) / JSON patch; PUT; `dryRun=All`;
* `status` subresources (writes to the main resource never change `status`);
* label selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!key`) and field selectors;
* pagination with `limit` / `continue` (`metadata.continue`, `remainingItemCount`);
* `pods/NAME/log`, `pods/NAME/eviction` (PodDisruptionBudget checks, 429 when blocked),
  `services/NAME:PORT/proxy/PATH`, deletecollection, namespace deletion;
* a small controller API for tests to play kubelet, scheduler and controllers:
  `add_node(s)`, `set_allocatable`, `mark_daemonsets_ready` (or `auto_daemonsets`),
  `pod_policy` (Succeeded with a log / Failed / Pending with a scheduling message),
  `set_service_proxy`, `install_crd`, `count`, `objects`.

Watches are not emulated. Start it with `EmulatorThread` (a background thread with its own
event loop) and point the client at `write_kubeconfig()`.
"""

from __future__ import annotations

import asyncio
import base64
import copy
import datetime
import json
import re
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp.web
import jsonpatch
import kmock
import yaml
from kmock._internal import parsing, rendering

from tests.cluster.kube_semantics import (
    ApiError,
    _delete,
    _fields_v1,
    _get,
    deep_merge,
    field_matcher,
    label_matcher,
    leaf_paths,
    selector_matches,
)

JSON = "application/json"


# ----------------------------------------------------------------------------- resources


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        return f"{self.group}/{self.version}/{self.plural}"

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources


BUILTIN_KINDS = [
    Kind("", "v1", "namespaces", "Namespace", False, ("status",)),
    Kind("", "v1", "nodes", "Node", False, ("status",)),
    Kind("", "v1", "pods", "Pod", True, ("status", "log", "eviction")),
    Kind("", "v1", "services", "Service", True, ("status", "proxy")),
    Kind("", "v1", "configmaps", "ConfigMap", True),
    Kind("", "v1", "secrets", "Secret", True),
    Kind("", "v1", "serviceaccounts", "ServiceAccount", True),
    Kind("", "v1", "events", "Event", True),
    Kind("apps", "v1", "daemonsets", "DaemonSet", True, ("status",)),
    Kind("apps", "v1", "deployments", "Deployment", True, ("status",)),
    Kind("rbac.authorization.k8s.io", "v1", "roles", "Role", True),
    Kind("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding", True),
    Kind("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole", False),
    Kind("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    Kind("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False),
    Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("status",)),
    Kind(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        ("status",),
    ),
]
SERVICEMONITOR_CRD = Kind("monitoring.coreos.com", "v1", "servicemonitors", "ServiceMonitor", True)
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update"]


def _not_found(kind: Kind, name: str) -> ApiError:
    return ApiError(
        404,
        "NotFound",
        f'{kind.plural}{"." + kind.group if kind.group else ""} "{name}" not found',
        {"name": name, "group": kind.group, "kind": kind.plural},
    )


# ----------------------------------------------------------------------------- pods


@dataclass
class PodFate:
    """What the emulated kubelet/scheduler does with a new pod (see `ClusterEmulator.pod_policy`)."""

    phase: str  # Pending, Running, Succeeded, Failed
    log: str = ""
    exit_code: int = 0
    reason: str = ""
    message: str = ""  # Pending: the scheduler's message (PodScheduled=False, FailedScheduling)

    @classmethod
    def succeeded(cls, log: str = "") -> PodFate:
        return cls("Succeeded", log=log)

    @classmethod
    def failed(cls, log: str = "", exit_code: int = 1, reason: str = "Error") -> PodFate:
        return cls("Failed", log=log, exit_code=exit_code, reason=reason)

    @classmethod
    def unschedulable(cls, message: str) -> PodFate:
        return cls("Pending", reason="Unschedulable", message=message)

    @classmethod
    def running(cls, log: str = "") -> PodFate:
        return cls("Running", log=log)


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _int_or_percent(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        share = int(value[:-1]) * total / 100
        return int(-(-share // 1)) if round_up else int(share)
    return int(value)


# ----------------------------------------------------------------------------- the emulator


class ClusterEmulator(kmock.KubernetesScaffold):
    """kmock's Kubernetes scaffold with a stateful, selector-aware store (see the module doc)."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.lock = threading.RLock()
        self.kinds: dict[str, Kind] = {}
        self.store: dict[str, dict[tuple, dict]] = {}
        self.owners: dict[tuple, dict[str, dict]] = {}  # (kind key, ns, name) -> manager -> info
        self.pod_logs: dict[tuple, str] = {}
        self.proxies: dict[tuple, Callable[[str], tuple[int, str]]] = {}
        self.server_errors: list[BaseException] = []
        self.pod_policy: Callable[[dict], PodFate | None] | None = None
        self.auto_daemonsets = False
        self.version = {
            "major": "1",
            "minor": "33",
            "gitVersion": "v1.33.0+emulator",
            "gitCommit": "0" * 40,
            "gitTreeState": "clean",
            "buildDate": "2026-01-01T00:00:00Z",
            "goVersion": "go1.24.0",
            "compiler": "gc",
            "platform": "linux/amd64",
        }
        self._rv = 1000
        for kind in BUILTIN_KINDS:
            self.register_kind(kind)
        for ns in ("default", "kube-system"):
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        self.fallback[re.compile(r"/apis?/.*|/version/")] << self._serve

    # ------------------------------------------------------------------ controller API (tests)

    def register_kind(self, kind: Kind) -> None:
        with self.lock:
            self.kinds[kind.key] = kind
            self.store.setdefault(kind.key, {})
            info = self.resources[f"{kind.group}/{kind.version}/{kind.plural}"]
            info.kind = kind.kind
            info.namespaced = kind.namespaced
            info.verbs = set(VERBS)
            info.subresources = set(kind.subresources)

    def unregister_kind(self, kind: Kind) -> None:
        with self.lock:
            self.kinds.pop(kind.key, None)
            self.store.pop(kind.key, None)
            del self.resources[f"{kind.group}/{kind.version}/{kind.plural}"]

    def install_crd(self, kind: Kind = SERVICEMONITOR_CRD) -> None:
        """Create the CustomResourceDefinition object and serve its resource."""
        self.create(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{kind.plural}.{kind.group}"},
                "spec": {
                    "group": kind.group,
                    "names": {"plural": kind.plural, "kind": kind.kind},
                    "scope": "Namespaced" if kind.namespaced else "Cluster",
                    "versions": [{"name": kind.version, "served": True, "storage": True}],
                },
            }
        )

    def kind_of(self, api_version: str, kind_name: str) -> Kind:
        with self.lock:
            for kind in self.kinds.values():
                if kind.api_version == api_version and kind.kind == kind_name:
                    return kind
        raise KeyError(f"{api_version} {kind_name} is not served")

    def create(self, obj: dict) -> dict:
        """Store an object as if POSTed (no HTTP); returns the stored copy."""
        kind = self.kind_of(obj["apiVersion"], obj["kind"])
        with self.lock:
            return copy.deepcopy(self._create(kind, obj.get("metadata", {}).get("namespace"), obj))

    def get(self, api_version: str, kind_name: str, name: str, namespace: str | None = None):
        kind = self.kind_of(api_version, kind_name)
        with self.lock:
            obj = self.store[kind.key].get((namespace if kind.namespaced else None, name))
            return copy.deepcopy(obj) if obj else None

    def objects(
        self, api_version: str, kind_name: str, namespace: str | None = None, selector: str = ""
    ) -> list[dict]:
        kind = self.kind_of(api_version, kind_name)
        match = label_matcher(selector)
        with self.lock:
            return [
                copy.deepcopy(o)
                for (ns, _), o in sorted(
                    self.store[kind.key].items(), key=lambda i: _sort_key(i[0])
                )
                if (namespace is None or ns == namespace) and match(o["metadata"].get("labels"))
            ]

    def add_node(
        self,
        name: str,
        *,
        labels: dict | None = None,
        internal_ip: str | None = None,
        hostname: str | None = None,
        allocatable: dict | None = None,
        taints: list | None = None,
        ready: bool = True,
    ) -> dict:
        resources = {"cpu": "8", "memory": "32Gi", "pods": "110", **(allocatable or {})}
        addresses = [{"type": "Hostname", "address": hostname or name}]
        if internal_ip:
            addresses.insert(0, {"type": "InternalIP", "address": internal_ip})
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {
                    "kubernetes.io/hostname": hostname or name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    **(labels or {}),
                },
            },
            "spec": {"taints": taints} if taints else {},
            "status": {
                "capacity": dict(resources),
                "allocatable": dict(resources),
                "addresses": addresses,
                "conditions": [
                    {"type": "Ready", "status": "True" if ready else "False", "reason": "Emulated"}
                ],
                "nodeInfo": {
                    "architecture": "amd64",
                    "bootID": name,
                    "containerRuntimeVersion": "containerd://1.7.24",
                    "kernelVersion": "6.1.0-emulated",
                    "kubeProxyVersion": "v1.33.0",
                    "kubeletVersion": "v1.33.0",
                    "machineID": name,
                    "operatingSystem": "linux",
                    "osImage": "Debian GNU/Linux 12 (bookworm)",
                    "systemUUID": name,
                },
            },
        }
        return self.create(node)

    def add_nodes(self, count: int, prefix: str = "node", **kwargs: Any) -> list[str]:
        names = [f"{prefix}{i:04d}" for i in range(count)]
        for name in names:
            self.add_node(name, **kwargs)
        return names

    def set_allocatable(self, node: str, resources: dict[str, str]) -> None:
        """What the device plugin does through the kubelet: advertise extended resources."""
        with self.lock:
            obj = self._must(self.kinds["/v1/nodes"], None, node)
            status = obj.setdefault("status", {})
            status.setdefault("capacity", {}).update(resources)
            status.setdefault("allocatable", {}).update(resources)
            self._touch(obj)

    def mark_daemonsets_ready(
        self, namespace: str | None = None, name: str | None = None, ready: bool = True
    ) -> None:
        """Play the DaemonSet controller: schedule on matching nodes; ready or not."""
        with self.lock:
            for (ns, ds_name), ds in self.store["apps/v1/daemonsets"].items():
                if (namespace and ns != namespace) or (name and ds_name != name):
                    continue
                self._daemonset_status(ds, ready)

    def later(self, delay: float, fn: Callable, *args: Any) -> threading.Timer:
        """Call fn(*args) from another thread after `delay` seconds (a controller acting later)."""
        timer = threading.Timer(delay, fn, args)
        timer.daemon = True
        timer.start()
        return timer

    def set_service_proxy(
        self, namespace: str, service: str, port: int | str, handler: Callable[[str], Any]
    ) -> None:
        """handler(path) -> text (200) or (status, text): what the service answers via the proxy."""
        self.proxies[(namespace, service, str(port))] = handler

    def count(self, method: str | None = None, path: str | re.Pattern | None = None) -> int:
        """How many requests were served, optionally by HTTP method and path (regex: fullmatch)."""
        total = 0
        for request in list(self._requests):
            if method and request.method.value.upper() != method.upper():
                continue
            if path is not None:
                text = request.url.path
                if isinstance(path, re.Pattern) and not path.fullmatch(text):
                    continue
                if isinstance(path, str) and text != path:
                    continue
            total += 1
        return total

    # ------------------------------------------------------------------ HTTP entry

    async def __call__(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """kmock's entry point with a path parser that also understands Namespace URLs."""
        body = await raw_request.read()
        text = body.decode("utf-8", "replace")
        try:
            data = yaml.safe_load(text) if text.strip() else None  # JSON is YAML
        except yaml.YAMLError:
            data = None
        path = _parse_path(raw_request.path)
        resource = None
        if path.group is not None:
            resource = kmock.resource(group=path.group, version=path.version, plural=path.plural)
        request = rendering.Request(
            id=len(self._requests),
            raw_request=raw_request,
            url=raw_request.url,
            method=raw_request.method,
            params=dict(raw_request.query),
            headers=dict(raw_request.headers),
            data=data,
            body=body,
            text=text,
            action=parsing.guess_k8s(path, kmock.method(raw_request.method), raw_request.query),
            resource=resource,
            namespace=path.namespace,
            name=path.name,
            subresource=path.subresource,
        )
        self._requests.append(request)
        try:
            return await self._handle(request)
        except kmock.KubernetesError as exc:
            return await self._render_error(exc)
        except ApiError as exc:
            return aiohttp.web.json_response(exc.status(), status=exc.code)
        except Exception as exc:  # an emulator bug: the test fixture fails on these
            self.server_errors.append(exc)
            return await self._render_error(exc)

    def _serve(self, request: rendering.Request) -> kmock.Response:
        try:
            status, payload, content_type = self._dispatch(request)
        except ApiError as exc:
            status, payload, content_type = exc.code, exc.status(), JSON
        if content_type == JSON:
            payload = json.dumps(payload).encode()
        elif isinstance(payload, str):
            payload = payload.encode()
        # Always set status and type: kmock keeps a reaction's metadata between requests.
        return kmock.Response(
            status=status, payload=payload, headers={"Content-Type": content_type}
        )

    def _dispatch(self, request: rendering.Request) -> tuple[int, Any, str]:
        res = request.resource
        if request.url.path in ("/version", "/version/"):  # VersionApi asks for /version/
            return 200, self.version, JSON
        if res is None or res.plural is None:
            raise ApiError(404, "NotFound", f"the server could not find {request.url.path}")
        kind = self.kinds.get(f"{res.group}/{res.version}/{res.plural}")
        if kind is None:
            raise ApiError(
                404, "NotFound", f"the server could not find the requested resource ({res.plural})"
            )
        method = request.method.value.upper()
        params = request.params
        ns = request.namespace if kind.namespaced else None
        sub = request.subresource
        with self.lock:
            creating = method in ("POST", "PATCH", "PUT")
            if (
                kind.namespaced
                and ns
                and creating
                and (None, ns) not in self.store["/v1/namespaces"]
            ):
                raise ApiError(404, "NotFound", f'namespaces "{ns}" not found')
            if request.name is None:
                if method == "GET":
                    if params.get("watch") in ("true", "1"):
                        raise ApiError(405, "MethodNotAllowed", "watch is not emulated")
                    return 200, self._list(kind, ns, params), JSON
                if method == "POST":
                    obj = self._create(kind, ns, request.data or {}, dry=_dry(params))
                    return 201, obj, JSON
                if method == "DELETE":
                    return 200, self._delete_collection(kind, ns, params), JSON
            else:
                name = request.name
                if sub == "log" and method == "GET":
                    return 200, self._log(kind, ns, name), "text/plain"
                if sub == "eviction" and method == "POST":
                    return 201, self._evict(ns, name), JSON
                if sub and sub.startswith("proxy") and kind.plural == "services":
                    return self._proxy(ns, name, sub.removeprefix("proxy"))
                if sub not in (None, "status"):
                    raise ApiError(404, "NotFound", f"subresource {sub} is not emulated")
                if method == "GET":
                    return 200, self._must(kind, ns, name), JSON
                if method == "DELETE":
                    return 200, self._delete(kind, ns, name), JSON
                if method == "PUT":
                    return 200, self._replace(kind, ns, name, request.data or {}, sub, params), JSON
                if method == "PATCH":
                    ctype = request.headers.get("Content-Type", "").split(";")[0].strip()
                    return self._patch(kind, ns, name, ctype, request.data, sub, params)
        raise ApiError(405, "MethodNotAllowed", f"{method} {request.url.path} is not emulated")

    # ------------------------------------------------------------------ verbs

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    def _must(self, kind: Kind, ns: str | None, name: str) -> dict:
        obj = self.store[kind.key].get((ns, name))
        if obj is None:
            raise _not_found(kind, name)
        return obj

    def _list(self, kind: Kind, ns: str | None, params: dict) -> dict:
        labels = label_matcher(params.get("labelSelector"))
        fields = field_matcher(params.get("fieldSelector"))
        keys = sorted(self.store[kind.key], key=_sort_key)
        if ns is not None:
            keys = [k for k in keys if k[0] == ns]
        token = params.get("continue")
        if token:
            try:
                after = tuple(json.loads(base64.urlsafe_b64decode(token)))
            except ValueError:
                raise ApiError(410, "Expired", "invalid continue token") from None
            keys = [k for k in keys if _sort_key(k) > _sort_key(after)]
        objs = self.store[kind.key]
        items = [objs[k] for k in keys]
        items = [o for o in items if labels(o["metadata"].get("labels")) and fields(o)]
        meta: dict[str, Any] = {"resourceVersion": str(self._rv)}
        limit = int(params.get("limit") or 0)
        if limit and len(items) > limit:
            last = items[limit - 1]["metadata"]
            key = [last.get("namespace"), last["name"]]
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(key).encode()).decode()
            meta["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        return {
            "apiVersion": kind.api_version,
            "kind": f"{kind.kind}List",
            "metadata": meta,
            "items": items,
        }

    def _new_meta(self, obj: dict, ns: str | None) -> None:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        if ns is not None:
            meta["namespace"] = ns
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _now()
        meta["generation"] = 1
        meta["resourceVersion"] = self._next_rv()

    def _create(self, kind: Kind, ns: str | None, obj: dict, dry: bool = False) -> dict:
        obj = copy.deepcopy(obj)
        if kind.namespaced:
            ns = ns or obj.get("metadata", {}).get("namespace") or "default"
        else:
            ns = None
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        self._new_meta(obj, ns)
        key = (ns, obj["metadata"]["name"])
        if key in self.store[kind.key]:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{kind.plural} "{key[1]}" already exists',
                {"name": key[1], "kind": kind.plural},
            )
        if dry:
            return obj
        self.store[kind.key][key] = obj
        self.owners[(kind.key, *key)] = {}
        self._after_write(kind, obj, created=True)
        return obj

    def _commit(self, kind: Kind, old: dict, new: dict) -> dict:
        """Store `new` if it differs from `old`; bump generation on spec-ish changes."""

        def body(o: dict) -> dict:
            return {k: v for k, v in o.items() if k not in ("metadata", "status")}

        def meta(o: dict) -> dict:
            m = o.get("metadata", {})
            return {k: m.get(k) for k in ("labels", "annotations", "finalizers", "ownerReferences")}

        if new == old:
            return old
        if body(new) != body(old):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        if (
            body(new) != body(old)
            or meta(new) != meta(old)
            or new.get("status") != old.get("status")
        ):
            new["metadata"]["resourceVersion"] = self._next_rv()
            key = (new["metadata"].get("namespace"), new["metadata"]["name"])
            self.store[kind.key][key] = new
            self._after_write(kind, new)
            return new
        return old

    def _touch(self, obj: dict) -> None:
        """Bump the resourceVersion of an object changed in place by the controller API."""
        obj["metadata"]["resourceVersion"] = self._next_rv()
        kind = self.kind_of(obj["apiVersion"], obj["kind"])
        self._after_write(kind, obj)

    def _owned(self, kind: Kind, ns: str | None, name: str) -> dict[str, dict]:
        return self.owners.setdefault((kind.key, ns, name), {})

    def _render_managed(self, obj: dict, owners: dict[str, dict]) -> None:
        obj["metadata"]["managedFields"] = [
            {
                "manager": manager,
                "operation": info["operation"],
                "apiVersion": obj["apiVersion"],
                "fieldsType": "FieldsV1",
                "fieldsV1": _fields_v1(info["paths"]),
            }
            for manager, info in owners.items()
            if info["paths"]
        ]

    def _take(self, owners: dict[str, dict], manager: str, paths: set, operation: str) -> None:
        for other, info in owners.items():
            if other != manager:
                info["paths"] -= paths
        entry = owners.setdefault(manager, {"operation": operation, "paths": set()})
        entry["operation"] = operation
        entry["paths"] = set(paths) if operation == "Apply" else entry["paths"] | paths

    def _apply(self, kind, ns, name, applied: dict, params: dict) -> tuple[int, dict, str]:
        manager = params.get("fieldManager")
        if not manager:
            raise ApiError(422, "Invalid", "fieldManager: Required value: is required for apply")
        if not isinstance(applied, dict):
            raise ApiError(400, "BadRequest", "apply body must be an object")
        applied = copy.deepcopy(applied)
        if kind.has_status:
            applied.pop("status", None)
        force = params.get("force") in ("true", "1")
        existing = self.store[kind.key].get((ns, name))
        paths = leaf_paths(applied)
        if existing is None:
            applied.setdefault("metadata", {})["name"] = name
            obj = self._create(kind, ns, applied, dry=_dry(params))
            if not _dry(params):
                owners = self._owned(kind, ns, name)
                self._take(owners, manager, paths, "Apply")
                self._render_managed(obj, owners)
            return 201, obj, JSON
        owners = self._owned(kind, ns, name)
        conflicts = []
        for path in sorted(paths):
            for other, info in owners.items():
                if (
                    other != manager
                    and path in info["paths"]
                    and _get(existing, path) != _get(applied, path)
                ):
                    conflicts.append((other, path))
        if conflicts and not force:
            lines = "; ".join(
                f'conflict with "{m}": .{".".join(map(str, p))}' for m, p in conflicts
            )
            raise ApiError(
                409,
                "Conflict",
                f"Apply failed with {len(conflicts)} conflict(s): {lines}",
                {
                    "causes": [
                        {"reason": "FieldManagerConflict", "field": ".".join(map(str, p))}
                        for _, p in conflicts
                    ]
                },
            )
        new = copy.deepcopy(existing)
        previous = (
            owners.get(manager, {}).get("paths", set())
            if owners.get(manager, {}).get("operation") == "Apply"
            else set()
        )
        for path in previous - paths:
            if not any(path in info["paths"] for m, info in owners.items() if m != manager):
                _delete(new, path)
        new = deep_merge(new, {k: v for k, v in applied.items() if k not in ("metadata",)})
        meta = applied.get("metadata") or {}
        for part in ("labels", "annotations"):
            if meta.get(part):
                new["metadata"][part] = {**(new["metadata"].get(part) or {}), **meta[part]}
        if _dry(params):
            return 200, new, JSON
        trial = copy.deepcopy(owners)
        self._take(trial, manager, paths, "Apply")
        self._render_managed(new, trial)
        stored = self._commit(kind, existing, new)
        owners.clear()
        owners.update(trial)
        if stored is existing:  # nothing changed; ownership may still have moved
            self._render_managed(existing, owners)
        return 200, stored, JSON

    def _update_owners(self, kind, ns, name, old: dict, new: dict, params: dict) -> None:
        manager = params.get("fieldManager") or "unknown"
        changed = {p for p in leaf_paths(new) if _get(old, p) != _get(new, p)}
        owners = self._owned(kind, ns, name)
        if changed:
            self._take(owners, manager, changed, "Update")
        self._render_managed(new, owners)

    def _patch(self, kind, ns, name, ctype, data, sub, params) -> tuple[int, dict, str]:
        if ctype == "application/apply-patch+yaml":
            if sub:
                raise ApiError(405, "MethodNotAllowed", "apply on a subresource is not emulated")
            return self._apply(kind, ns, name, data, params)
        existing = self._must(kind, ns, name)
        if ctype == "application/json-patch+json":
            try:
                new = jsonpatch.apply_patch(existing, data or [])
            except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException) as exc:
                raise ApiError(422, "Invalid", f"json patch: {exc}") from None
        elif ctype in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
            if not isinstance(data, dict):
                raise ApiError(400, "BadRequest", "patch body must be an object")
            new = deep_merge(existing, data)
        else:
            raise ApiError(415, "UnsupportedMediaType", f"unsupported patch type {ctype!r}")
        return 200, self._write(kind, ns, name, existing, new, sub, params), JSON

    def _replace(self, kind, ns, name, data, sub, params) -> dict:
        existing = self._must(kind, ns, name)
        new = copy.deepcopy(data)
        new.setdefault("metadata", {})
        for key in (
            "uid",
            "creationTimestamp",
            "generation",
            "resourceVersion",
            "namespace",
            "name",
        ):
            if key in existing["metadata"]:
                new["metadata"][key] = existing["metadata"][key]
        return self._write(kind, ns, name, existing, new, sub, params)

    def _write(self, kind, ns, name, existing, new, sub, params) -> dict:
        """Keep status for main-resource writes and only status for status writes."""
        new = copy.deepcopy(new)
        if sub == "status":
            merged = copy.deepcopy(existing)
            merged["status"] = new.get("status", {})
            new = merged
        elif kind.has_status:
            if "status" in existing:
                new["status"] = copy.deepcopy(existing["status"])
            else:
                new.pop("status", None)
        new["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"]
        new["metadata"]["generation"] = existing["metadata"].get("generation", 1)
        if _dry(params):
            return new
        self._update_owners(kind, ns, name, existing, new, params)
        return self._commit(kind, existing, new)

    def _delete(self, kind: Kind, ns: str | None, name: str) -> dict:
        obj = self._must(kind, ns, name)
        del self.store[kind.key][(ns, name)]
        self.owners.pop((kind.key, ns, name), None)
        if kind.plural == "pods":
            self.pod_logs.pop((ns, name), None)
        if kind.plural == "namespaces":
            for other in self.kinds.values():
                if other.namespaced:
                    for key in [k for k in self.store[other.key] if k[0] == name]:
                        del self.store[other.key][key]
        if kind.plural == "customresourcedefinitions":
            spec = obj.get("spec", {})
            for other in list(self.kinds.values()):
                if other.group == spec.get("group") and other.plural == spec["names"]["plural"]:
                    self.unregister_kind(other)
        self._after_write(kind, obj, deleted=True)
        return obj

    def _delete_collection(self, kind: Kind, ns: str | None, params: dict) -> dict:
        listing = self._list(kind, ns, {k: v for k, v in params.items() if k != "limit"})
        for obj in listing["items"]:
            self._delete(kind, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        return listing

    # ------------------------------------------------------------------ subresources

    def _log(self, kind: Kind, ns: str, name: str) -> str:
        pod = self._must(kind, ns, name)
        if pod.get("status", {}).get("phase", "Pending") == "Pending":
            container = (pod.get("spec", {}).get("containers") or [{}])[0].get("name", "")
            raise ApiError(
                400,
                "BadRequest",
                f'container "{container}" in pod "{name}" is waiting to start: ContainerCreating',
            )
        return self.pod_logs.get((ns, name), "")

    def _proxy(self, ns: str, target: str, path: str) -> tuple[int, Any, str]:
        service, _, port = target.partition(":")
        self._must(self.kinds["/v1/services"], ns, service)
        handler = self.proxies.get((ns, service, port or ""))
        if handler is None:
            raise ApiError(
                503, "ServiceUnavailable", f'no endpoints available for service "{service}"'
            )
        answer = handler(path or "/")
        status, text = answer if isinstance(answer, tuple) else (200, answer)
        return status, text.encode(), "text/plain; version=0.0.4"

    def _evict(self, ns: str, name: str) -> dict:
        pods = self.kinds["/v1/pods"]
        pod = self._must(pods, ns, name)
        for (pdb_ns, _), pdb in list(self.store["policy/v1/poddisruptionbudgets"].items()):
            if pdb_ns != ns or not selector_matches(
                pdb["spec"].get("selector"), pod["metadata"].get("labels") or {}
            ):
                continue
            status = self._pdb_status(pdb)
            if status["disruptionsAllowed"] < 1:
                raise ApiError(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    {
                        "causes": [
                            {
                                "reason": "DisruptionBudget",
                                "message": f"The disruption budget {pdb['metadata']['name']} needs "
                                f"{status['desiredHealthy']} healthy pods and has "
                                f"{status['currentHealthy']} currently",
                            }
                        ]
                    },
                )
        self._delete(pods, ns, name)
        return {
            "apiVersion": "v1",
            "kind": "Status",
            "status": "Success",
            "code": 201,
            "metadata": {},
        }

    def _pdb_status(self, pdb: dict) -> dict:
        ns = pdb["metadata"]["namespace"]
        spec = pdb.get("spec", {})
        matching = [
            p
            for (pns, _), p in self.store["/v1/pods"].items()
            if pns == ns
            and selector_matches(spec.get("selector"), p["metadata"].get("labels") or {})
        ]
        healthy = sum(1 for p in matching if _pod_ready(p))
        expected = len(matching)
        if "minAvailable" in spec:
            desired = _int_or_percent(spec["minAvailable"], expected, round_up=True)
        elif "maxUnavailable" in spec:
            desired = expected - _int_or_percent(spec["maxUnavailable"], expected, round_up=True)
        else:
            desired = 0
        status = {
            "currentHealthy": healthy,
            "desiredHealthy": max(desired, 0),
            "expectedPods": expected,
            "disruptionsAllowed": max(healthy - desired, 0),
            "observedGeneration": pdb["metadata"].get("generation", 1),
        }
        if pdb.get("status") != status:
            pdb["status"] = status
            pdb["metadata"]["resourceVersion"] = self._next_rv()
        return status

    # ------------------------------------------------------------------ emulated controllers

    def _after_write(self, kind: Kind, obj: dict, created: bool = False, deleted: bool = False):
        if kind.plural == "customresourcedefinitions" and created:
            spec = obj.get("spec", {})
            version = next(
                (v["name"] for v in spec.get("versions", []) if v.get("served", True)), "v1"
            )
            self.register_kind(
                Kind(
                    spec["group"],
                    version,
                    spec["names"]["plural"],
                    spec["names"]["kind"],
                    spec.get("scope", "Namespaced") == "Namespaced",
                )
            )
        if kind.plural == "pods" and created:
            self._schedule(obj)
        if kind.plural == "pods":
            for pdb in self.store["policy/v1/poddisruptionbudgets"].values():
                if pdb["metadata"]["namespace"] == obj["metadata"].get("namespace"):
                    self._pdb_status(pdb)
        if kind.plural == "poddisruptionbudgets" and not deleted:
            self._pdb_status(obj)
        if self.auto_daemonsets and kind.plural in ("daemonsets", "nodes") and not deleted:
            for ds in self.store["apps/v1/daemonsets"].values():
                self._daemonset_status(ds, True)

    def _daemonset_status(self, ds: dict, ready: bool) -> None:
        template = ds.get("spec", {}).get("template", {}).get("spec", {})
        selector = template.get("nodeSelector") or {}
        nodes = [
            n
            for n in self.store["/v1/nodes"].values()
            if all((n["metadata"].get("labels") or {}).get(k) == v for k, v in selector.items())
        ]
        count = len(nodes)
        status = {
            "currentNumberScheduled": count,
            "desiredNumberScheduled": count,
            "numberMisscheduled": 0,
            "numberReady": count if ready else 0,
            "numberAvailable": count if ready else 0,
            "updatedNumberScheduled": count if ready else 0,
            "observedGeneration": ds["metadata"].get("generation", 1),
        }
        if not ready:
            status["numberUnavailable"] = count
        if ds.get("status") != status:
            ds["status"] = status
            ds["metadata"]["resourceVersion"] = self._next_rv()

    def _schedule(self, pod: dict) -> None:
        fate = self.pod_policy(copy.deepcopy(pod)) if self.pod_policy else None
        pod.setdefault("status", {})["phase"] = "Pending"
        if fate is None:
            return
        self.set_pod_fate(pod["metadata"]["namespace"], pod["metadata"]["name"], fate)

    def set_pod_fate(self, namespace: str, name: str, fate: PodFate) -> None:
        """Move a pod to Running / Succeeded / Failed (with a log) or keep it Pending with a reason."""
        with self.lock:
            pod = self._must(self.kinds["/v1/pods"], namespace, name)
            now = _now()
            status = pod.setdefault("status", {})
            status["phase"] = fate.phase
            containers = pod.get("spec", {}).get("containers") or [{"name": "main"}]
            if fate.phase == "Pending":
                status["conditions"] = [
                    {
                        "type": "PodScheduled",
                        "status": "False",
                        "reason": fate.reason or "Unschedulable",
                        "message": fate.message,
                        "lastTransitionTime": now,
                    }
                ]
                self._create(
                    self.kinds["/v1/events"],
                    namespace,
                    {
                        "metadata": {"generateName": f"{name}."},
                        "involvedObject": {
                            "kind": "Pod",
                            "name": name,
                            "namespace": namespace,
                            "uid": pod["metadata"]["uid"],
                        },
                        "reason": "FailedScheduling",
                        "message": fate.message,
                        "type": "Warning",
                        "source": {"component": "default-scheduler"},
                        "firstTimestamp": now,
                        "lastTimestamp": now,
                        "count": 1,
                    },
                )
            else:
                running = fate.phase == "Running"
                status["conditions"] = [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                    {
                        "type": "Ready",
                        "status": "True" if running else "False",
                        "lastTransitionTime": now,
                    },
                ]
                state = (
                    {"running": {"startedAt": now}}
                    if running
                    else {
                        "terminated": {
                            "exitCode": fate.exit_code,
                            "reason": fate.reason
                            or ("Completed" if fate.exit_code == 0 else "Error"),
                            "message": fate.message,
                            "startedAt": now,
                            "finishedAt": now,
                        }
                    }
                )
                status["containerStatuses"] = [
                    {
                        "name": c["name"],
                        "ready": running,
                        "restartCount": 0,
                        "image": c.get("image", ""),
                        "imageID": "",
                        "state": state,
                    }
                    for c in containers
                ]
                self.pod_logs[(namespace, name)] = fate.log
            self._touch(pod)


def _pod_ready(pod: dict) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _dry(params: dict) -> bool:
    return params.get("dryRun") == "All"


def _sort_key(key: tuple) -> tuple:
    return (key[0] or "", key[1])


def _parse_path(path: str) -> parsing.ParsedPath:
    """Like kmock's parser, plus the Namespace resource itself (`/api/v1/namespaces[/NAME[/SUB]]`)."""
    parts = [p for p in path.strip("/").split("/") if p != ""]
    if len(parts) >= 2 and parts[0] == "apis" and len(parts) >= 3:
        group, version, rest = parts[1], parts[2], parts[3:]
    elif len(parts) >= 2 and parts[0] == "api":
        group, version, rest = "", parts[1], parts[2:]
    else:
        return parsing.ParsedPath()
    namespace = None
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    plural = rest[0] if rest else None
    name = rest[1] if len(rest) > 1 else None
    sub = "/".join(rest[2:]) or None
    return parsing.ParsedPath(group, version, plural, namespace, name, sub)


# ----------------------------------------------------------------------------- running it


@dataclass
class EmulatorThread:
    """Runs a ClusterEmulator on 127.0.0.1 in a background thread with its own event loop."""

    emulator: ClusterEmulator = field(default_factory=ClusterEmulator)
    port: int = 0
    _thread: threading.Thread | None = None
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> EmulatorThread:
        ready = threading.Event()
        failure: list[BaseException] = []

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                async with self.emulator, kmock.Server(self.emulator) as server:
                    self.port = server.port
                    ready.set()
                    await self._stop.wait()
            except BaseException as exc:  # surfaced by start()
                failure.append(exc)
                ready.set()

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure or not self.port:
            raise RuntimeError(f"emulator did not start: {failure}")
        return self

    def stop(self) -> None:
        if self._loop and self._stop:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread:
            self._thread.join(10)

    def write_kubeconfig(self, path: str | Path, server: str | None = None) -> Path:
        """A kubeconfig whose only context points at this emulator (token auth, plain HTTP)."""
        path = Path(path)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "emulator", "cluster": {"server": server or self.url}}],
            "users": [{"name": "tester", "user": {"token": "emulator-token"}}],
            "contexts": [
                {"name": "emulator", "context": {"cluster": "emulator", "user": "tester"}}
            ],
            "current-context": "emulator",
        }
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        return path
