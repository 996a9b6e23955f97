"""pods/NAME/eviction as kube-apiserver's EvictionREST does it, and the disruption controller.

Read from kubernetes/kubernetes pkg/registry/core/pod/storage/eviction.go
@01aa0f3f6052c9866dcb69054d8924fa8c96e3cb (EvictionREST.Create, canIgnorePDB,
checkAndDecrement, getPodDisruptionBudgets):
- a pod that is Pending, Succeeded, Failed or already terminating is deleted without a PDB check;
- a PDB with an empty selector matches nothing; more than one matching PDB answers 500
  "This pod has more than one PodDisruptionBudget, which the eviction subresource does not
  support.";
- a PDB the controller has not observed yet (observedGeneration < generation) answers 429;
- an unready pod is deleted without using the budget when `unhealthyPodEvictionPolicy` is
  AlwaysAllow, or when currentHealthy >= desiredHealthy > 0 (IfHealthyBudget, the default);
- otherwise disruptionsAllowed == 0 answers 429 with a DisruptionBudget cause, else it is
  decremented, the pod recorded in status.disruptedPods, and the pod deleted gracefully
  (DisruptionTarget condition first, as with PodDisruptionConditions).
The name in the URL must match the Eviction's name (400).
"""

from __future__ import annotations

from typing import Any

from tests.cluster.emulator.errors import ApiError
from tests.cluster.emulator.kinds import Kind
from tests.cluster.emulator.kmock_adapter import JSON, ApiRequest
from tests.cluster.emulator.selectors import selector_matches
from tests.cluster.emulator.store import now

PDB_KEY = "policy/v1/poddisruptionbudgets"


def pod_ready(pod: dict) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or pod["metadata"].get("deletionTimestamp"):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def _int_or_percent(value: Any, total: int, round_up: bool) -> int:
    if isinstance(value, str) and value.endswith("%"):
        share = int(value[:-1]) * total / 100
        return int(-(-share // 1)) if round_up else int(share)
    return int(value)


def _matches(pdb: dict, pod: dict) -> bool:
    selector = (pdb.get("spec") or {}).get("selector")
    if not selector or not (selector.get("matchLabels") or selector.get("matchExpressions")):
        return False  # "a nil or empty selector ... should match nothing"
    return selector_matches(selector, pod["metadata"].get("labels") or {})


class Disruption:
    """Eviction handler plus the disruption controller's PDB status."""

    def __init__(self, api):
        self.api = api
        self.store = api.store

    def pdb_status(self, pdb: dict) -> dict:
        """What the disruption controller writes to a PDB's status."""
        ns = pdb["metadata"]["namespace"]
        spec = pdb.get("spec", {})
        disrupted = dict((pdb.get("status") or {}).get("disruptedPods") or {})
        pods = self.store.items(self.store.kinds["/v1/pods"], ns)
        matching = [p for p in pods if _matches(pdb, p)]
        names = {p["metadata"]["name"] for p in matching}
        disrupted = {k: v for k, v in disrupted.items() if k in names}
        healthy = sum(
            1 for p in matching if pod_ready(p) and p["metadata"]["name"] not in disrupted
        )
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
        if disrupted:
            status["disruptedPods"] = disrupted
        return status

    def sync(self) -> None:
        kind = self.store.kinds[PDB_KEY]
        for pdb in self.store.items(kind):
            self.store.set_status(kind, pdb, self.pdb_status(pdb))

    def evict(self, request: ApiRequest, pods: Kind) -> tuple[int, Any, str]:
        if request.method != "POST":
            raise ApiError(405, "MethodNotAllowed", "eviction accepts POST only")
        ns, name = request.namespace, request.name
        body = request.data or {}
        if (body.get("metadata") or {}).get("name", name) != name:
            raise ApiError(400, "BadRequest", "name in URL does not match name in Eviction object")
        grace = (body.get("deleteOptions") or {}).get("gracePeriodSeconds")
        pod = self.store.must(pods, ns, name)
        phase = (pod.get("status") or {}).get("phase", "Pending")
        if phase in ("Pending", "Succeeded", "Failed") or pod["metadata"].get("deletionTimestamp"):
            self.api.delete(pods, ns, name, grace)  # canIgnorePDB
            return 201, _success(), JSON
        pdbs = [p for p in self.store.items(self.store.kinds[PDB_KEY], ns) if _matches(p, pod)]
        if len(pdbs) > 1:
            raise ApiError(500, "InternalError", "This pod has more than one PodDisruptionBudget, "
                           "which the eviction subresource does not support.")  # fmt: skip
        if pdbs:
            pdb = pdbs[0]
            status = pdb.get("status") or {}
            policy = (pdb.get("spec") or {}).get("unhealthyPodEvictionPolicy")
            unready_ok = not pod_ready(pod) and (
                policy == "AlwaysAllow"
                or (status.get("currentHealthy", 0) >= status.get("desiredHealthy", 0) > 0)
            )
            if not unready_ok:
                self._check_and_decrement(pdb, name)
        self._disrupt(pod)
        self.api.delete(pods, ns, name, grace)
        return 201, _success(), JSON

    def _check_and_decrement(self, pdb: dict, pod_name: str) -> None:
        status = pdb.get("status") or {}
        name = pdb["metadata"]["name"]
        if status.get("observedGeneration", 0) < pdb["metadata"].get("generation", 1):
            raise _too_many(f"The disruption budget {name} is still being processed by the server.")
        if status.get("disruptionsAllowed", 0) <= 0:
            raise _too_many(f"The disruption budget {name} needs {status.get('desiredHealthy', 0)} "
                            f"healthy pods and has {status.get('currentHealthy', 0)} currently")  # fmt: skip
        new = dict(status)
        new["disruptionsAllowed"] = status["disruptionsAllowed"] - 1
        new["disruptedPods"] = {**(status.get("disruptedPods") or {}), pod_name: now()}
        self.store.set_status(self.store.kinds[PDB_KEY], pdb, new)

    def _disrupt(self, pod: dict) -> None:
        conditions = [c for c in (pod.get("status") or {}).get("conditions") or []
                      if c.get("type") != "DisruptionTarget"]  # fmt: skip
        conditions.append({"type": "DisruptionTarget", "status": "True",
                           "reason": "EvictionByEvictionAPI", "message": "Eviction API: evicting",
                           "lastTransitionTime": now()})  # fmt: skip
        pod.setdefault("status", {})["conditions"] = conditions
        self.store.touch(pod)


def _too_many(cause: str) -> ApiError:
    return ApiError(
        429,
        "TooManyRequests",
        "Cannot evict pod as it would violate the pod's disruption budget.",
        {"causes": [{"reason": "DisruptionBudget", "message": cause}]},
    )


def _success() -> dict:
    return {"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201, "metadata": {}}
