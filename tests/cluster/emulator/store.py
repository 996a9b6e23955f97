"""The object store behind the emulated API server: one dict per resource, resourceVersions.

Objects are plain dicts keyed by (namespace or None, name). `rv` grows on every write, so
controllers can tell whether anything changed since they last looked (`Store.rv`).
"""

from __future__ import annotations

import copy
import datetime
import threading
import uuid
from collections.abc import Callable

from tests.cluster.emulator.errors import ApiError
from tests.cluster.emulator.kinds import BUILTIN_KINDS, Kind
from tests.cluster.emulator.selectors import label_matcher

Key = tuple[str | None, str]


def now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def sort_key(key: Key) -> tuple[str, str]:
    return (key[0] or "", key[1])


class Store:
    def __init__(self, on_kinds_changed: Callable[[Kind, bool], None] | None = None):
        self.lock = threading.RLock()
        self.kinds: dict[str, Kind] = {}
        self._by_name: dict[tuple[str, str], Kind] = {}
        self.objects: dict[str, dict[Key, dict]] = {}
        self.owners: dict[tuple, dict[str, dict]] = {}  # (kind key, ns, name) -> manager -> info
        self.rv = 1000
        self._on_kinds_changed = on_kinds_changed
        for kind in BUILTIN_KINDS:
            self.register(kind)

    # -- kinds -----------------------------------------------------------------------------

    def register(self, kind: Kind) -> None:
        with self.lock:
            self.kinds[kind.key] = kind
            self._by_name[(kind.api_version, kind.kind)] = kind
            self.objects.setdefault(kind.key, {})
            if self._on_kinds_changed:
                self._on_kinds_changed(kind, True)

    def unregister(self, kind: Kind) -> None:
        with self.lock:
            self.kinds.pop(kind.key, None)
            self._by_name.pop((kind.api_version, kind.kind), None)
            self.objects.pop(kind.key, None)
            if self._on_kinds_changed:
                self._on_kinds_changed(kind, False)

    def kind_of(self, api_version: str, kind_name: str) -> Kind:
        kind = self._by_name.get((api_version, kind_name))
        if kind is None:
            raise KeyError(f"{api_version} {kind_name} is not served")
        return kind

    def served(self, api_version: str, kind_name: str) -> Kind | None:
        try:
            return self.kind_of(api_version, kind_name)
        except KeyError:
            return None

    def kind_at(self, group: str, version: str, plural: str) -> Kind | None:
        return self.kinds.get(f"{group}/{version}/{plural}")

    # -- reading ---------------------------------------------------------------------------

    def get(self, kind: Kind, ns: str | None, name: str) -> dict | None:
        return self.objects.get(kind.key, {}).get((ns if kind.namespaced else None, name))

    def must(self, kind: Kind, ns: str | None, name: str) -> dict:
        obj = self.get(kind, ns, name)
        if obj is None:
            raise kind.not_found(name)
        return obj

    def items(self, kind: Kind, ns: str | None = None, selector: str = "") -> list[dict]:
        """Objects of a kind (sorted by namespace, name), optionally in one namespace."""
        match = label_matcher(selector)
        objs = self.objects.get(kind.key, {})
        return [
            objs[k]
            for k in sorted(objs, key=sort_key)
            if (ns is None or k[0] == ns) and match(objs[k]["metadata"].get("labels"))
        ]

    def all(self, api_version: str, kind_name: str, ns: str | None = None) -> list[dict]:
        kind = self.served(api_version, kind_name)
        return self.items(kind, ns) if kind else []

    # -- writing ---------------------------------------------------------------------------

    def next_rv(self) -> str:
        self.rv += 1
        return str(self.rv)

    def new_meta(self, obj: dict, ns: str | None) -> None:
        meta = obj.setdefault("metadata", {})
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if not meta.get("name"):
            raise ApiError(422, "Invalid", "metadata.name: Required value")
        if ns is not None:
            meta["namespace"] = ns
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = now()
        meta["generation"] = 1
        meta["resourceVersion"] = self.next_rv()

    def insert(self, kind: Kind, obj: dict) -> dict:
        key = (
            obj["metadata"].get("namespace") if kind.namespaced else None,
            obj["metadata"]["name"],
        )
        if key in self.objects[kind.key]:
            raise ApiError(
                409,
                "AlreadyExists",
                f'{kind.plural} "{key[1]}" already exists',
                {"name": key[1], "kind": kind.plural},
            )
        self.objects[kind.key][key] = obj
        self.owners[(kind.key, *key)] = {}
        return obj

    def put(self, kind: Kind, obj: dict) -> dict:
        """Store `obj` in place of the object with its key; bumps its resourceVersion."""
        obj["metadata"]["resourceVersion"] = self.next_rv()
        key = (
            obj["metadata"].get("namespace") if kind.namespaced else None,
            obj["metadata"]["name"],
        )
        self.objects[kind.key][key] = obj
        return obj

    def touch(self, obj: dict) -> None:
        """An object changed in place (by a controller): new resourceVersion."""
        obj["metadata"]["resourceVersion"] = self.next_rv()

    def remove(self, kind: Kind, ns: str | None, name: str) -> dict:
        obj = self.must(kind, ns, name)
        del self.objects[kind.key][(ns if kind.namespaced else None, name)]
        self.owners.pop((kind.key, ns if kind.namespaced else None, name), None)
        self.rv += 1
        return obj

    def set_status(self, kind: Kind, obj: dict, status: dict) -> bool:
        """What a controller's status update does; False when nothing changed."""
        if obj.get("status") == status:
            return False
        obj["status"] = copy.deepcopy(status)
        self.touch(obj)
        return True
