"""Pure Kubernetes API semantics the emulator needs: selectors, field ownership, merge patch.

Kept apart from the server (tests/cluster/emulator.py) so each stays one idea.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterable
from typing import Any


class ApiError(Exception):
    """Answered as a Kubernetes `Status` with this code and reason."""

    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details or {}

    def status(self) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Failure",
            "code": self.code,
            "reason": self.reason,
            "message": self.message,
            "details": self.details,
        }


# ----------------------------------------------------------------------------- selectors

_SELECTOR_TERM = re.compile(
    r"^\s*(?P<neg>!)?\s*(?P<key>[A-Za-z0-9_./-]+)\s*"
    r"(?:(?P<op>==|!=|=|\s+in\s+|\s+notin\s+)\s*(?P<value>\([^)]*\)|[^,]*))?\s*$"
)


def _split_terms(selector: str) -> list[str]:
    terms, depth, current = [], 0, ""
    for char in selector:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [t for t in terms if t.strip()]


def label_matcher(selector: str | None) -> Callable[[dict], bool]:
    """A predicate over a labels dict for a Kubernetes label selector string."""
    checks = []
    for term in _split_terms(selector or ""):
        m = _SELECTOR_TERM.match(term)
        if not m:
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {term!r}")
        key, op, value = m["key"], (m["op"] or "").strip(), (m["value"] or "").strip()
        if m["neg"]:
            checks.append(lambda labels, k=key: k not in labels)
        elif not op:
            checks.append(lambda labels, k=key: k in labels)
        elif op in ("=", "=="):
            checks.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif op == "!=":
            checks.append(lambda labels, k=key, v=value: labels.get(k) != v)
        else:
            values = {v.strip() for v in value.strip("()").split(",") if v.strip()}
            if op == "in":
                checks.append(lambda labels, k=key, vs=values: labels.get(k) in vs)
            else:
                checks.append(lambda labels, k=key, vs=values: labels.get(k) not in vs)
    return lambda labels: all(check(labels or {}) for check in checks)


def selector_matches(selector: dict | None, labels: dict) -> bool:
    """A LabelSelector object (matchLabels / matchExpressions) against labels."""
    selector = selector or {}
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], set(expr.get("values") or [])
        ok = {
            "In": labels.get(key) in values,
            "NotIn": labels.get(key) not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def _dotted(obj: dict, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict):
            return None
        obj = obj.get(part)
    return obj


def field_matcher(selector: str | None) -> Callable[[dict], bool]:
    checks = []
    for term in _split_terms(selector or ""):
        m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*$", term)
        if not m:
            raise ApiError(400, "BadRequest", f"invalid field selector: {term!r}")
        path, op, value = m.groups()
        if op == "!=":
            checks.append(lambda o, p=path, v=value: str(_dotted(o, p) or "") != v)
        else:
            checks.append(lambda o, p=path, v=value: str(_dotted(o, p) or "") == v)
    return lambda obj: all(check(obj) for check in checks)


# ----------------------------------------------------------------------------- field ownership

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


def _get(obj: Any, path: tuple) -> Any:
    for part in path:
        if not isinstance(obj, dict) or part not in obj:
            return _MISSING
        obj = obj[part]
    return obj


_MISSING = object()


def _delete(obj: dict, path: tuple) -> None:
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


def _fields_v1(paths: Iterable[tuple]) -> dict:
    tree: dict = {}
    for path in sorted(paths):
        node = tree
        for part in path:
            node = node.setdefault(f"f:{part}", {})
    return tree
