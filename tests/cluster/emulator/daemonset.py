"""The DaemonSet controller: one pod per eligible node, rolling updates, status from pods.

Eligible nodes: the pod template's nodeSelector / required node affinity match and every
NoSchedule/NoExecute taint is tolerated (DaemonSet pods tolerate `unschedulable`, as the real
controller adds that toleration). Pods are created through the API server's create path, so
admission applies (a missing ServiceAccount or RuntimeClass leaves the DaemonSet without pods
and a FailedCreate event). Pods are bound by the controller itself (spec.nodeName).
Failed pods are deleted and replaced; pods whose template is outdated are replaced one at a
time (RollingUpdate, maxUnavailable 1). Status is computed from the pods, never set by tests:
desired/current/ready/updated/available/unavailable/misscheduled, observedGeneration.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import TYPE_CHECKING

from tests.cluster.emulator.errors import ApiError
from tests.cluster.emulator.eviction import pod_ready
from tests.cluster.emulator.scheduler import node_selected, tolerates
from tests.cluster.emulator.strategies import TEMPLATE_GENERATION

if TYPE_CHECKING:
    from tests.cluster.emulator.cluster import ClusterEmulator

HASH_LABEL = "controller-revision-hash"


def template_hash(ds: dict) -> str:
    template = (ds.get("spec") or {}).get("template") or {}
    return hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]


class DaemonSets:
    def __init__(self, cluster: ClusterEmulator):
        self.cluster = cluster

    def eligible(self, ds: dict) -> list[str]:
        spec = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
        names = []
        for node in self.cluster.store.items(self.cluster.kind("v1", "Node")):
            taints = (node.get("spec") or {}).get("taints") or []
            if any(t.get("effect") in ("NoSchedule", "NoExecute")
                   and not tolerates(spec.get("tolerations") or [], t) for t in taints):  # fmt: skip
                continue
            if node_selected(spec, node):
                names.append(node["metadata"]["name"])
        return names

    def sync(self) -> None:
        kind = self.cluster.kind("apps/v1", "DaemonSet")
        for ds in self.cluster.store.items(kind):
            self._sync_one(kind, ds)

    def _pods(self, ds: dict) -> list[dict]:
        uid = ds["metadata"]["uid"]
        return [
            p
            for p in self.cluster.store.items(
                self.cluster.kind("v1", "Pod"), ds["metadata"]["namespace"]
            )
            if any(
                r.get("uid") == uid and r.get("controller")
                for r in p["metadata"].get("ownerReferences") or []
            )
        ]

    def _sync_one(self, kind, ds: dict) -> None:
        api, pods_kind = self.cluster.api, self.cluster.kind("v1", "Pod")
        current = template_hash(ds)
        nodes = set(self.eligible(ds))
        pods = self._pods(ds)
        by_node: dict[str, list[dict]] = {}
        for pod in pods:
            by_node.setdefault(pod["spec"].get("nodeName", ""), []).append(pod)
        for node, node_pods in by_node.items():
            for pod in node_pods:
                meta = pod["metadata"]
                if meta.get("deletionTimestamp"):
                    continue
                if node not in nodes or (pod.get("status") or {}).get("phase") == "Failed":
                    api.delete(pods_kind, meta["namespace"], meta["name"])
        live = [p for p in self._pods(ds) if not p["metadata"].get("deletionTimestamp")]
        outdated = [
            p for p in live if (p["metadata"].get("labels") or {}).get(HASH_LABEL) != current
        ]
        unavailable = sum(1 for p in live if not pod_ready(p))
        if outdated and unavailable == 0:
            victim = outdated[0]["metadata"]
            api.delete(pods_kind, victim["namespace"], victim["name"])
        placed = {p["spec"].get("nodeName") for p in self._pods(ds)}
        for node in sorted(nodes - placed):
            self._create_pod(ds, node, current)
        self._status(kind, ds, nodes, current)

    def _create_pod(self, ds: dict, node: str, current: str) -> None:
        template = copy.deepcopy((ds.get("spec") or {}).get("template") or {})
        meta = template.setdefault("metadata", {})
        name = ds["metadata"]["name"]
        meta["generateName"] = f"{name}-"
        meta["labels"] = {**(meta.get("labels") or {}), HASH_LABEL: current,
                          "pod-template-generation": (ds["metadata"].get("annotations") or {})
                          .get(TEMPLATE_GENERATION, "1")}  # fmt: skip
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": name,
                                    "uid": ds["metadata"]["uid"], "controller": True,
                                    "blockOwnerDeletion": True}]  # fmt: skip
        template["spec"]["nodeName"] = node
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template["spec"]}
        try:
            self.cluster.api.create(
                self.cluster.kind("v1", "Pod"), ds["metadata"]["namespace"], pod
            )
        except ApiError as exc:
            self.cluster.event(ds, "FailedCreate", f"Error creating: {exc.message}", "Warning",
                               "daemonset-controller")  # fmt: skip

    def _status(self, kind, ds: dict, nodes: set[str], current: str) -> None:
        pods = [p for p in self._pods(ds) if not p["metadata"].get("deletionTimestamp")]
        on = [p for p in pods if p["spec"].get("nodeName") in nodes]
        ready = [p for p in on if pod_ready(p)]
        updated = [p for p in on if (p["metadata"].get("labels") or {}).get(HASH_LABEL) == current]
        status = {
            "currentNumberScheduled": len({p["spec"]["nodeName"] for p in on}),
            "desiredNumberScheduled": len(nodes),
            "numberMisscheduled": len([p for p in pods if p["spec"].get("nodeName") not in nodes]),
            "numberReady": len(ready),
            "numberAvailable": len(ready),
            "updatedNumberScheduled": len(updated),
            "observedGeneration": ds["metadata"].get("generation", 1),
        }
        if len(nodes) - len(ready) > 0:
            status["numberUnavailable"] = len(nodes) - len(ready)
        self.cluster.store.set_status(kind, ds, status)
