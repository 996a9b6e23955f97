"""Writes to existing objects: server-side apply with field ownership, patches, PUT.

Server-side apply (`application/apply-patch+yaml`, `fieldManager`, `force`) keeps per-manager
field ownership, renders `managedFields`, answers conflicts with 409 and removes fields a
manager stopped applying. JSON merge / strategic merge (treated as merge) / JSON patch and PUT
record an `Update` owner. Writes to the main resource never change `status`; writes to the
`status` subresource change only `status`. `dryRun=All` stores nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import jsonpatch

from tests.cluster.emulator.dra import validate_update
from tests.cluster.emulator.errors import ApiError
from tests.cluster.emulator.fields import deep_merge, delete_path, fields_v1, get_path, leaf_paths
from tests.cluster.emulator.kinds import Kind
from tests.cluster.emulator.store import Store
from tests.cluster.emulator.strategies import template_generation

Create = Callable[[Kind, str | None, dict, bool], dict]


def dry(params: dict) -> bool:
    return params.get("dryRun") == "All"


class Writer:
    """Applies, patches and replaces objects in a Store; `create` is the API server's create."""

    def __init__(self, store: Store, create: Create, after_write: Callable[[Kind, dict], None]):
        self.store = store
        self.create = create
        self.after_write = after_write

    # -- generation and resourceVersion -------------------------------------------------------

    def commit(self, kind: Kind, old: dict, new: dict) -> dict:
        """Store `new` if it differs from `old`; bump generation on spec-ish changes."""

        def body(o: dict) -> dict:
            return {k: v for k, v in o.items() if k not in ("metadata", "status")}

        def meta(o: dict) -> dict:
            m = o.get("metadata", {})
            keys = ("labels", "annotations", "finalizers", "ownerReferences", "deletionTimestamp")
            return {k: m.get(k) for k in keys}

        if new == old:
            return old
        validate_update(kind, old, new)
        if body(new) != body(old):
            new["metadata"]["generation"] = old["metadata"].get("generation", 1) + 1
        if kind.kind == "DaemonSet":
            template_generation(old, new)
        if (
            body(new) != body(old)
            or meta(new) != meta(old)
            or new.get("status") != old.get("status")
        ):
            self.store.put(kind, new)
            self.after_write(kind, new)
            return new
        return old

    # -- field ownership ------------------------------------------------------------------------

    def _owned(self, kind: Kind, ns: str | None, name: str) -> dict[str, dict]:
        return self.store.owners.setdefault((kind.key, ns, name), {})

    @staticmethod
    def render_managed(obj: dict, owners: dict[str, dict]) -> None:
        obj["metadata"]["managedFields"] = [
            {
                "manager": manager,
                "operation": info["operation"],
                "apiVersion": obj["apiVersion"],
                "fieldsType": "FieldsV1",
                "fieldsV1": fields_v1(info["paths"]),
            }
            for manager, info in owners.items()
            if info["paths"]
        ]

    @staticmethod
    def _take(owners: dict[str, dict], manager: str, paths: set, operation: str) -> None:
        for other, info in owners.items():
            if other != manager:
                info["paths"] -= paths
        entry = owners.setdefault(manager, {"operation": operation, "paths": set()})
        entry["operation"] = operation
        entry["paths"] = set(paths) if operation == "Apply" else entry["paths"] | paths

    def _update_owners(self, kind, ns, name, old: dict, new: dict, params: dict) -> None:
        manager = params.get("fieldManager") or "unknown"
        changed = {p for p in leaf_paths(new) if get_path(old, p) != get_path(new, p)}
        owners = self._owned(kind, ns, name)
        if changed:
            self._take(owners, manager, changed, "Update")
        self.render_managed(new, owners)

    # -- verbs ----------------------------------------------------------------------------------

    def apply(self, kind: Kind, ns, name, applied: Any, params: dict) -> tuple[int, dict]:
        manager = params.get("fieldManager")
        if not manager:
            raise ApiError(422, "Invalid", "fieldManager: Required value: is required for apply")
        if not isinstance(applied, dict):
            raise ApiError(400, "BadRequest", "apply body must be an object")
        applied = copy.deepcopy(applied)
        if kind.has_status:
            applied.pop("status", None)
        force = params.get("force") in ("true", "1")
        existing = self.store.get(kind, ns, name)
        paths = leaf_paths(applied)
        if existing is None:
            applied.setdefault("metadata", {})["name"] = name
            obj = self.create(kind, ns, applied, dry(params))
            if not dry(params):
                owners = self._owned(kind, ns, name)
                self._take(owners, manager, paths, "Apply")
                self.render_managed(obj, owners)
            return 201, obj
        owners = self._owned(kind, ns, name)
        conflicts = [
            (other, path)
            for path in sorted(paths, key=str)
            for other, info in owners.items()
            if other != manager
            and path in info["paths"]
            and get_path(existing, path) != get_path(applied, path)
        ]
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
        mine = owners.get(manager, {})
        previous = mine.get("paths", set()) if mine.get("operation") == "Apply" else set()
        for path in previous - paths:
            if not any(path in info["paths"] for m, info in owners.items() if m != manager):
                delete_path(new, path)
        new = deep_merge(new, {k: v for k, v in applied.items() if k not in ("metadata",)})
        meta = applied.get("metadata") or {}
        for part in ("labels", "annotations"):
            if meta.get(part):
                new["metadata"][part] = {**(new["metadata"].get(part) or {}), **meta[part]}
        if dry(params):
            validate_update(kind, existing, new)
            return 200, new
        trial = copy.deepcopy(owners)
        self._take(trial, manager, paths, "Apply")
        self.render_managed(new, trial)
        stored = self.commit(kind, existing, new)
        owners.clear()
        owners.update(trial)
        if stored is existing:  # nothing changed; ownership may still have moved
            self.render_managed(existing, owners)
        return 200, stored

    def patch(self, kind: Kind, ns, name, ctype: str, data, sub, params) -> tuple[int, dict]:
        if ctype == "application/apply-patch+yaml":
            if sub:
                raise ApiError(405, "MethodNotAllowed", "apply on a subresource is not emulated")
            return self.apply(kind, ns, name, data, params)
        existing = self.store.must(kind, ns, name)
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
        return 200, self.write(kind, ns, name, existing, new, sub, params)

    def replace(self, kind: Kind, ns, name, data, sub, params) -> dict:
        existing = self.store.must(kind, ns, name)
        new = copy.deepcopy(data or {})
        new.setdefault("metadata", {})
        for key in ("uid", "creationTimestamp", "generation", "resourceVersion", "namespace",
                    "name", "deletionTimestamp", "deletionGracePeriodSeconds"):  # fmt: skip
            if key in existing["metadata"]:
                new["metadata"][key] = existing["metadata"][key]
        return self.write(kind, ns, name, existing, new, sub, params)

    def write(self, kind: Kind, ns, name, existing, new, sub, params) -> dict:
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
        if dry(params):
            validate_update(kind, existing, new)
            return new
        self._update_owners(kind, ns, name, existing, new, params)
        return self.commit(kind, existing, new)
