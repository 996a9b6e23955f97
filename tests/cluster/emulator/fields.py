"""Field ownership for server-side apply (leaf paths, managedFields) and JSON merge patch."""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

_IDENTITY = {("apiVersion",), ("kind",), ("metadata", "name"), ("metadata", "namespace")}


def leaf_paths(obj: Any, prefix: tuple = ()) -> set[tuple]:
    """Paths of the leaves a manager owns; lists are atomic, most of metadata is server-owned."""
    if prefix == ("metadata",):
        return {
            ("metadata", part, key)
            for part in ("labels", "annotations")
            for key in (obj.get(part) or {})
        }
    if isinstance(obj, dict) and obj:
        paths: set[tuple] = set()
        for key, value in obj.items():
            paths |= leaf_paths(value, (*prefix, key))
        return paths - _IDENTITY
    return {prefix} if prefix else set()


def get_path(obj: Any, path: tuple) -> Any:
    for part in path:
        if not isinstance(obj, dict) or part not in obj:
            return _MISSING
        obj = obj[part]
    return obj


_MISSING = object()


def delete_path(obj: dict, path: tuple) -> None:
    parents = []
    for part in path[:-1]:
        if not isinstance(obj.get(part), dict):
            return
        parents.append((obj, part))
        obj = obj[part]
    obj.pop(path[-1], None)
    for parent, part in reversed(parents):  # drop containers left empty
        if parent[part] == {}:
            del parent[part]


def deep_merge(base: dict, patch: dict) -> dict:
    """JSON merge patch (RFC 7386): dicts merge, None deletes, everything else replaces."""
    result = dict(base)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        elif isinstance(value, dict) and isinstance(result.get(key), dict):
            result[key] = deep_merge(result[key], value)
        else:
            result[key] = copy.deepcopy(value)
    return result


def fields_v1(paths: Iterable[tuple]) -> dict:
    tree: dict = {}
    for path in sorted(paths):
        node = tree
        for part in path:
            node = node.setdefault(f"f:{part}", {})
    return tree
