"""Label and field selectors, as the API server and controllers evaluate them."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from tests.cluster.emulator.errors import ApiError

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
