"""What a kubelet reports: container states, pod phase (getPhase) and conditions.

`ContainerRun` / `PodRun` are a kubelet's own view of one pod; `pod_status` turns them into
the Pod status the API shows (waiting reasons, CrashLoopBackOff with lastState, Ready and
ContainersReady conditions, DisruptionTarget kept). `requests` sums extended resources as the
scheduler and kubelet do (containers summed, init containers as a maximum).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tests.cluster.emulator.context import Device
from tests.cluster.emulator.images import Profile
from tests.cluster.emulator.store import now
from tests.cluster.emulator.strategies import is_extended, quantity


@dataclass
class ContainerRun:
    name: str
    profile: Profile
    state: str = "waiting"  # waiting | running | terminated
    reason: str = "ContainerCreating"
    exit_code: int = 0
    restarts: int = 0
    log: str = ""
    last_exit: dict | None = None
    started_at: str = ""


@dataclass
class PodRun:
    uid: str
    admitted: bool = False
    devices: dict[str, list[Device]] = field(default_factory=dict)  # container -> devices
    init_done: bool = False
    dra_done: bool = False  # ResourceClaims prepared (devices in `devices`)
    containers: dict[str, ContainerRun] = field(default_factory=dict)
    waiting: tuple[str, str] | None = None  # (reason, message) before containers start
    events: set[tuple[str, str]] = field(default_factory=set)


def pod_status(pod: dict, run: PodRun, phase: str | None = None) -> dict:
    """The status a kubelet reports for a pod from its containers' states."""
    spec = pod.get("spec") or {}
    statuses = []
    for container in spec.get("containers") or []:
        c = run.containers.get(container["name"])
        entry = {"name": container["name"], "image": container.get("image", ""), "imageID": "",
                 "restartCount": c.restarts if c else 0, "ready": bool(c and c.state == "running"),
                 "started": bool(c and c.state == "running")}  # fmt: skip
        if c is None or run.waiting:
            reason, message = run.waiting or ("ContainerCreating", "")
            entry["state"] = {
                "waiting": {"reason": reason, **({"message": message} if message else {})}
            }
        elif c.state == "running":
            entry["state"] = {"running": {"startedAt": c.started_at}}
        elif c.state == "terminated":
            entry["state"] = {"terminated": c.last_exit or {"exitCode": c.exit_code}}
        else:
            pod_ref = f"{pod['metadata']['name']}_{pod['metadata']['namespace']}({pod['metadata']['uid']})"
            entry["state"] = {"waiting": {"reason": c.reason, "message": f"back-off 10s restarting failed container={c.name} pod={pod_ref}"}}  # fmt: skip
        if c and c.last_exit and c.state != "terminated":
            entry["lastState"] = {"terminated": c.last_exit}
        statuses.append(entry)
    phase = phase or _phase(spec, run)
    ready = phase == "Running" and all(s["ready"] for s in statuses)
    unready = [s["name"] for s in statuses if not s["ready"]]
    conditions = [
        {"type": "PodScheduled", "status": "True"},
        {"type": "Initialized", "status": "True" if run.init_done or not spec.get("initContainers") else "False"},
        {"type": "ContainersReady", "status": "True" if ready else "False"},
        {"type": "Ready", "status": "True" if ready else "False",
         **({} if ready else {"reason": "PodCompleted" if phase in ("Succeeded", "Failed") else "ContainersNotReady",
                              "message": f"containers with unready status: [{' '.join(unready)}]"})},
    ]  # fmt: skip
    old = pod.get("status") or {}
    disruption = [c for c in old.get("conditions") or [] if c.get("type") == "DisruptionTarget"]
    status = {"phase": phase, "conditions": conditions + disruption, "containerStatuses": statuses,
              "hostIP": "10.0.0.1", "startTime": old.get("startTime") or now()}  # fmt: skip
    if old.get("resourceClaimStatuses"):  # written by the resourceclaim controller
        status["resourceClaimStatuses"] = old["resourceClaimStatuses"]
    return status


def requests(pod: dict) -> dict[str, int]:
    """Extended resources a pod requests (max of init containers, sum of containers)."""
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for container in spec.get("containers") or []:
        for key, value in ((container.get("resources") or {}).get("limits") or {}).items():
            if is_extended(key):
                total[key] = total.get(key, 0) + quantity(value)
    for container in spec.get("initContainers") or []:
        for key, value in ((container.get("resources") or {}).get("limits") or {}).items():
            if is_extended(key):
                total[key] = max(total.get(key, 0), quantity(value))
    return total


def _phase(spec: dict, run: PodRun) -> str:
    """kubelet's getPhase over the container states."""
    if run.waiting or not run.containers:
        return "Pending"
    states = [run.containers.get(c["name"]) for c in spec.get("containers") or []]
    if any(s is None for s in states):
        return "Pending"
    if any(s.state == "running" for s in states) or any(s.state == "waiting" for s in states):
        return "Running"
    return "Succeeded" if all(s.exit_code == 0 for s in states) else "Failed"
