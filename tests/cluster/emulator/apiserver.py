"""The emulated kube-apiserver: routing, list/get/create/update/patch/delete, cascades.

Lists support label selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!key`), field
selectors and pagination (`limit` / `continue`, `remainingItemCount`). Watches are not
emulated (405). Creates pass the registry strategies and admission plugins of strategies.py.
Pod deletion is graceful (deletionTimestamp first; the emulated kubelet removes the pod on its
next sync), other kinds go at once; deleting an owner deletes its dependents (background
propagation), deleting a Namespace deletes what is in it, deleting a CRD stops serving it.
"""

from __future__ import annotations

import base64
import copy
import datetime
import json
from collections.abc import Callable
from typing import Any

from tests.cluster.emulator import dra, strategies
from tests.cluster.emulator.apply import Writer, dry
from tests.cluster.emulator.errors import ApiError
from tests.cluster.emulator.kinds import Kind, kind_of_crd
from tests.cluster.emulator.kmock_adapter import JSON, ApiRequest
from tests.cluster.emulator.selectors import field_matcher, label_matcher
from tests.cluster.emulator.store import Store, now, sort_key

Subresource = Callable[[ApiRequest, Kind], tuple[int, Any, str]]


class ApiServer:
    def __init__(self, store: Store, version: dict):
        self.store = store
        self.version = version
        self.writer = Writer(store, self.create, self._after_update)
        self.subresources: dict[str, Subresource] = {}  # "log", "eviction", "proxy"
        self.on_change: list[Callable[[Kind, dict, str], None]] = []  # (kind, obj, event)

    # -- routing ----------------------------------------------------------------------------

    def handle(self, request: ApiRequest) -> tuple[int, Any, str]:
        if request.path in ("/version", "/version/"):  # VersionApi asks for /version/
            return 200, self.version, JSON
        if request.group is None or request.plural is None:
            raise ApiError(404, "NotFound", f"the server could not find {request.path}")
        kind = self.store.kind_at(request.group, request.version or "", request.plural)
        if kind is None:
            raise ApiError(
                404,
                "NotFound",
                f"the server could not find the requested resource ({request.plural})",
            )
        method, params, sub = request.method, request.params, request.subresource
        ns = request.namespace if kind.namespaced else None
        if request.name is None:
            if method == "GET":
                if params.get("watch") in ("true", "1"):
                    raise ApiError(405, "MethodNotAllowed", "watch is not emulated")
                return 200, self.list(kind, ns, params), JSON
            if method == "POST":
                obj = self.create(kind, ns, request.data or {}, dry(params))
                return 201, obj, JSON
            if method == "DELETE":
                return 200, self.delete_collection(kind, ns, params), JSON
        else:
            name = request.name
            if sub:
                head = sub.split("/", 1)[0]
                if head in self.subresources and head in kind.subresources:
                    return self.subresources[head](request, kind)
                if sub != "status":
                    raise ApiError(404, "NotFound", f"subresource {sub} is not emulated")
            if method == "GET":
                return 200, self.store.must(kind, ns, name), JSON
            if method == "DELETE":
                return 200, self.delete(kind, ns, name, _grace(request)), JSON
            if method == "PUT":
                return 200, self.writer.replace(kind, ns, name, request.data, sub, params), JSON
            if method == "PATCH":
                status, obj = self.writer.patch(
                    kind, ns, name, request.content_type, request.data, sub, params
                )
                return status, obj, JSON
        raise ApiError(405, "MethodNotAllowed", f"{method} {request.path} is not emulated")

    # -- verbs --------------------------------------------------------------------------------

    def list(self, kind: Kind, ns: str | None, params: dict) -> dict:
        labels = label_matcher(params.get("labelSelector"))
        fields = field_matcher(params.get("fieldSelector"))
        objs = self.store.objects[kind.key]
        keys = sorted(objs, key=sort_key)
        if ns is not None:
            keys = [k for k in keys if k[0] == ns]
        token = params.get("continue")
        if token:
            try:
                after = tuple(json.loads(base64.urlsafe_b64decode(token)))
            except ValueError:
                raise ApiError(410, "Expired", "invalid continue token") from None
            keys = [k for k in keys if sort_key(k) > sort_key(after)]
        items = [objs[k] for k in keys]
        items = [o for o in items if labels(o["metadata"].get("labels")) and fields(o)]
        meta: dict[str, Any] = {"resourceVersion": str(self.store.rv)}
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

    def create(self, kind: Kind, ns: str | None, obj: dict, dry_run: bool = False) -> dict:
        obj = copy.deepcopy(obj)
        ns = (
            (ns or obj.get("metadata", {}).get("namespace") or "default")
            if kind.namespaced
            else None
        )
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        meta = obj.setdefault("metadata", {})
        if ns is not None:
            meta["namespace"] = ns
        strategies.prepare_for_create(kind, obj)
        dra.validate_create(kind, obj)
        if kind.kind == "Pod":
            dra.validate_pod(obj)
        strategies.admit(self.store, kind, obj)
        self.store.new_meta(obj, ns)
        if dry_run:
            return obj
        self.store.insert(kind, obj)
        if kind.kind == "CustomResourceDefinition":
            self.store.register(kind_of_crd(obj))
        self._notify(kind, obj, "created")
        return obj

    def delete(self, kind: Kind, ns: str | None, name: str, grace: int | None = None) -> dict:
        obj = self.store.must(kind, ns, name)
        if kind.kind == "Pod":
            period = strategies.grace_period(obj, grace)
            if period > 0:
                if obj["metadata"].get("deletionTimestamp"):
                    return obj  # already terminating
                at = datetime.datetime.now(tz=datetime.UTC) + datetime.timedelta(seconds=period)
                obj["metadata"]["deletionTimestamp"] = at.strftime("%Y-%m-%dT%H:%M:%SZ")
                obj["metadata"]["deletionGracePeriodSeconds"] = period
                self.store.touch(obj)
                self._notify(kind, obj, "terminating")
                return obj
        return self.remove(kind, obj)

    def remove(self, kind: Kind, obj: dict) -> dict:
        """Delete at once, with the cascades a real cluster runs."""
        meta = obj["metadata"]
        ns, name = (meta.get("namespace") if kind.namespaced else None), meta["name"]
        self.store.remove(kind, ns, name)
        if kind.kind == "Namespace":
            for other in list(self.store.kinds.values()):
                if other.namespaced:
                    for item in self.store.items(other, name):
                        self.remove(other, item)
        if kind.kind == "CustomResourceDefinition":
            served = kind_of_crd(obj)
            if self.store.kind_at(served.group, served.version, served.plural):
                self.store.unregister(served)
        self._notify(kind, obj, "deleted")
        self._cascade(meta.get("uid"))
        return obj

    def _cascade(self, owner_uid: str | None) -> None:
        """Garbage collection of dependents (background propagation)."""
        if not owner_uid:
            return
        for kind in list(self.store.kinds.values()):
            for obj in list(self.store.objects.get(kind.key, {}).values()):
                refs = obj["metadata"].get("ownerReferences") or []
                if refs and any(r.get("uid") == owner_uid for r in refs):
                    others = [r for r in refs if r.get("uid") != owner_uid]
                    if not any(self._uid_exists(r.get("uid")) for r in others):
                        ns = obj["metadata"].get("namespace")
                        if self.store.get(kind, ns, obj["metadata"]["name"]) is not None:
                            self.delete(kind, ns, obj["metadata"]["name"])

    def _uid_exists(self, uid: str | None) -> bool:
        return any(
            o["metadata"].get("uid") == uid
            for objs in self.store.objects.values()
            for o in objs.values()
        )

    def delete_collection(self, kind: Kind, ns: str | None, params: dict) -> dict:
        listing = self.list(kind, ns, {k: v for k, v in params.items() if k != "limit"})
        for obj in listing["items"]:
            self.delete(kind, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        return listing

    # -- change notifications -------------------------------------------------------------------

    def _after_update(self, kind: Kind, obj: dict) -> None:
        self._notify(kind, obj, "updated")

    def _notify(self, kind: Kind, obj: dict, event: str) -> None:
        for listener in self.on_change:
            listener(kind, obj, event)


def _grace(request: ApiRequest) -> int | None:
    value = request.params.get("gracePeriodSeconds")
    if value is None and isinstance(request.data, dict):
        value = request.data.get("gracePeriodSeconds")
    return None if value is None else int(value)


__all__ = ["ApiServer", "now"]
