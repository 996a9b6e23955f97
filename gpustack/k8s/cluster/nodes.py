"""Inventory hosts ↔ Node objects, and the node labels gpustack sets (and only those)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from gpustack.k8s.cluster.connect import FIELD_MANAGER, Cluster, call

NODE_NAME_VAR = "k8s_node_name"
# Which label keys gpustack set on a node: uninstall removes exactly these (user labels stay).
MANAGED_LABELS_ANNOTATION = "gpustack.io/managed-labels"
MERGE_PATCH = "application/merge-patch+json"


@dataclass(frozen=True)
class NodeMatch:
    host: str
    node_name: str  # what the inventory says the node is called
    node: dict[str, Any] | None  # the Node object, None when missing
    error: str = ""
    hint: str = ""


def node_name_for(host: str, hostvars: dict[str, Any]) -> str:
    """`k8s_node_name` host variable, else the inventory hostname."""
    return str(hostvars.get(NODE_NAME_VAR) or host)


def _identities(node: dict[str, Any]) -> set[str]:
    meta = node.get("metadata") or {}
    found = {meta.get("name", "")}
    found.add((meta.get("labels") or {}).get("kubernetes.io/hostname", ""))
    for address in (node.get("status") or {}).get("addresses") or []:
        found.add(address.get("address", ""))
    return {f for f in found if f}


def _pointers(nodes: list[dict[str, Any]]) -> dict[str, list[int]]:
    """{name, short name, hostname label or address: indexes of the nodes it names}."""
    pointed: dict[str, list[int]] = {}
    for index, node in enumerate(nodes):
        for key in _identities(node) | {node["metadata"]["name"].split(".")[0]}:
            pointed.setdefault(key, []).append(index)
    return pointed


def match_hosts(
    wanted: dict[str, str], hostvars: dict[str, dict[str, Any]], nodes: list[dict[str, Any]]
) -> dict[str, NodeMatch]:
    """Pure: map each host (host -> expected node name) to its Node, or explain why not.

    A missing node gets suggestions: nodes whose name, hostname label or an address equals
    the host's name, short name, expected node name or `ansible_host`.
    """
    by_name = {n["metadata"]["name"]: n for n in nodes}
    # Which nodes each name or address points at, built once when a host is missing: a fleet
    # whose inventory names differ from its node names (FQDNs vs short names) would otherwise
    # rescan every node for every host, quadratic in the fleet size.
    pointed: dict[str, list[int]] | None = None
    sample = None
    result = {}
    for host, name in wanted.items():
        node = by_name.get(name)
        if node is not None:
            result[host] = NodeMatch(host, name, node)
            continue
        variables = hostvars.get(host) or {}
        keys = {host, host.split(".")[0], name, name.split(".")[0]}
        if variables.get("ansible_host") and variables["ansible_host"] not in ("127.0.0.1", "::1"):
            keys.add(str(variables["ansible_host"]))
        if pointed is None:
            pointed = _pointers(nodes)
        hits = sorted({i for key in keys for i in pointed.get(key, ())})
        candidates = [nodes[i]["metadata"]["name"] for i in hits]
        if candidates:
            hint = f"set {NODE_NAME_VAR}={candidates[0]} for {host} in the inventory"
            error = (
                f"no Node named {name!r} for host {host}; the cluster has "
                f"{', '.join(repr(c) for c in candidates[:3])} that matches it"
            )
        else:
            if sample is None:
                sample = ", ".join(sorted(by_name)[:5]) + (" …" if len(by_name) > 5 else "")
            hint = (
                f"join {host} to the cluster, or set {NODE_NAME_VAR}=NODE for it "
                f"(nodes: {sample or 'none'})"
            )
            error = f"no Node named {name!r} for host {host}"
        result[host] = NodeMatch(host, name, None, error, hint)
    return result


def find_nodes(
    cluster: Cluster, wanted: dict[str, str], hostvars: dict[str, dict[str, Any]]
) -> dict[str, NodeMatch]:
    """Read the nodes once (paged) and match them to hosts."""
    nodes = cluster.list_all("/api/v1/nodes", "list nodes")
    return match_hosts(wanted, hostvars, nodes)


def label_patch(node: dict[str, Any], labels: dict[str, str | None]) -> dict[str, Any] | None:
    """Pure: the merge patch that sets `labels` and records their keys in the annotation."""
    meta = node.get("metadata") or {}
    recorded = _recorded(meta)
    keys = (recorded | {k for k, v in labels.items() if v is not None}) - {
        k for k, v in labels.items() if v is None
    }
    annotation = ",".join(sorted(keys)) or None
    if not labels and annotation == (meta.get("annotations") or {}).get(MANAGED_LABELS_ANNOTATION):
        return None
    return {
        "metadata": {
            "labels": dict(labels),
            "annotations": {MANAGED_LABELS_ANNOTATION: annotation},
        }
    }


def unlabel_patch(node: dict[str, Any]) -> dict[str, Any] | None:
    """Pure: the merge patch that removes the labels gpustack recorded, and the record."""
    meta = node.get("metadata") or {}
    if MANAGED_LABELS_ANNOTATION not in (meta.get("annotations") or {}):
        return None
    present = meta.get("labels") or {}
    return {
        "metadata": {
            "labels": {key: None for key in _recorded(meta) if key in present},
            "annotations": {MANAGED_LABELS_ANNOTATION: None},
        }
    }


def _recorded(meta: dict[str, Any]) -> set[str]:
    text = (meta.get("annotations") or {}).get(MANAGED_LABELS_ANNOTATION) or ""
    return {k.strip() for k in text.split(",") if k.strip()}


def patch_node(cluster: Cluster, name: str, patch: dict[str, Any]) -> dict[str, Any]:
    return call(
        lambda: cluster.raw(
            "PATCH",
            f"/api/v1/nodes/{name}",
            [("fieldManager", FIELD_MANAGER)],
            body=json.loads(json.dumps(patch)),
            ctype=MERGE_PATCH,
        ),
        f"label node {name}",
    )
