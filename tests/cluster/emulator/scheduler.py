"""A small default scheduler for pods without spec.nodeName.

Filters as kube-scheduler's default plugins do, for what these tests use: NodeUnschedulable
(cordon), TaintToleration (NoSchedule/NoExecute), NodeAffinity (nodeSelector and required
nodeSelectorTerms), NodeResourcesFit for extended resources (allocatable minus what bound,
non-terminal pods request), and DynamicResources (dra.py: a pod's ResourceClaims must be
allocatable from the node's ResourceSlices; the claims are allocated and reserved when the pod
is bound). Node affinity also understands matchFields on metadata.name. The first fitting node (by name) is chosen; no scoring, no
preemption. An unschedulable pod gets PodScheduled=False/Unschedulable and a FailedScheduling
event with the scheduler's "0/N nodes are available: ..." summary.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from tests.cluster.emulator.podstatus import requests
from tests.cluster.emulator.selectors import selector_matches
from tests.cluster.emulator.store import now
from tests.cluster.emulator.strategies import quantity

if TYPE_CHECKING:
    from tests.cluster.emulator.cluster import ClusterEmulator


def tolerates(tolerations: list[dict], taint: dict) -> bool:
    for t in tolerations or []:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t["key"] == taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and t.get("value", "") == taint.get("value", ""):
            return True
    return False


def node_selected(pod_spec: dict, node: dict) -> bool:
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    affinity = ((pod_spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    if affinity:
        terms = affinity.get("nodeSelectorTerms") or []
        return any(
            selector_matches({"matchExpressions": t.get("matchExpressions") or []}, labels)
            and all(_field_matches(f, node) for f in t.get("matchFields") or [])
            for t in terms
        )
    return True


def _field_matches(requirement: dict, node: dict) -> bool:
    """matchFields: only `metadata.name` is a supported field (core validation)."""
    if requirement.get("key") != "metadata.name":
        return False
    name, values = node["metadata"]["name"], requirement.get("values") or []
    if requirement.get("operator") == "In":
        return name in values
    if requirement.get("operator") == "NotIn":
        return name not in values
    return False


class Scheduler:
    def __init__(self, cluster: ClusterEmulator):
        self.cluster = cluster

    def sync(self) -> None:
        cluster = self.cluster
        pods = cluster.kind("v1", "Pod")
        for pod in cluster.store.items(pods):
            spec = pod.get("spec") or {}
            if spec.get("nodeName") or pod["metadata"].get("deletionTimestamp"):
                continue
            if (pod.get("status") or {}).get("phase") not in (None, "Pending"):
                continue
            node, reasons, plans = self._fit(pod)
            if node:
                cluster.dra.allocate(pod, node, plans)  # PreBind: claims allocated, reserved
                spec["nodeName"] = node
                keep = {k: v for k, v in (pod.get("status") or {}).items()
                        if k == "resourceClaimStatuses"}  # fmt: skip
                pod["status"] = {"phase": "Pending", "conditions": [
                    {"type": "PodScheduled", "status": "True", "lastTransitionTime": now()}], **keep}  # fmt: skip
                cluster.store.touch(pod)
                continue
            total = len(cluster.store.items(cluster.kind("v1", "Node")))
            summary = ", ".join(f"{n} {r}" for r, n in sorted(reasons.items()))
            message = (
                f"0/{total} nodes are available: {summary}."
                if summary
                else f"0/{total} nodes are available."
            )
            condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                         "message": message}  # fmt: skip
            old = [
                c
                for c in (pod.get("status") or {}).get("conditions") or []
                if c.get("type") == "PodScheduled"
            ]
            if not old or old[0].get("message") != message:
                condition["lastTransitionTime"] = now()
                keep = {k: v for k, v in (pod.get("status") or {}).items()
                        if k == "resourceClaimStatuses"}  # fmt: skip
                cluster.store.set_status(
                    pods, pod, {"phase": "Pending", "conditions": [condition], **keep}
                )
                cluster.event(pod, "FailedScheduling", message, "Warning", "default-scheduler")

    def _fit(self, pod: dict) -> tuple[str | None, Counter, list]:
        spec = pod.get("spec") or {}
        reasons: Counter = Counter()
        wanted = requests(pod)
        for node in self.cluster.store.items(self.cluster.kind("v1", "Node")):
            name = node["metadata"]["name"]
            taints = list((node.get("spec") or {}).get("taints") or [])
            if (node.get("spec") or {}).get("unschedulable"):
                taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
            bad = [t for t in taints if t.get("effect") in ("NoSchedule", "NoExecute")
                   and not tolerates(spec.get("tolerations") or [], t)]  # fmt: skip
            if bad:
                if bad[0]["key"] == "node.kubernetes.io/unschedulable":
                    reasons["node(s) were unschedulable"] += 1
                else:
                    reasons[
                        f"node(s) had untolerated taint {{{bad[0]['key']}: {bad[0].get('value', '')}}}"
                    ] += 1
                continue
            if not node_selected(spec, node):
                reasons["node(s) didn't match Pod's node affinity/selector"] += 1
                continue
            allocatable = (node.get("status") or {}).get("allocatable") or {}
            short = None
            for resource, amount in wanted.items():
                used = sum(requests(p).get(resource, 0) for p in self.cluster.pods_on(name))
                if amount > quantity(allocatable.get(resource, 0)) - used:
                    short = resource
                    break
            if short:
                reasons[f"Insufficient {short}"] += 1
                continue
            fits, why, plans = self.cluster.dra.fit(pod, name)
            if not fits:
                reasons[why] += 1
                continue
            return name, reasons, plans
        return None, reasons, []
