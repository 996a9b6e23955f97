"""The emulated kubelets: admission, sandbox, volumes, images, containers, restarts, deletion.

For every pod bound to a node (spec.nodeName), in the order a kubelet goes:
1. admission, once (pkg/kubelet/cm/admission/errors.go@3a53ab6e069d623654427784a2447b82f49fb952:
   reason `UnexpectedAdmissionError`, message "Allocate failed due to <device manager or
   plugin error>, which is unexpected"): device plugin resources are allocated by devices.py;
   extended resources in allocatable that no emulated plugin registered (`set_allocatable`)
   are checked as the scheduler's fit predicate does (reason `OutOf<resource>`). A rejected pod
   is Failed with message "Pod was rejected: <message>" and a Warning event (kubelet rejectPod);
2. sandbox: the RuntimeClass handler (or the node's default runtime) must be configured on
   the node (`NodeHardware.runtime_handlers`), else FailedCreatePodSandBox, pod Pending;
3. volumes: ConfigMaps must exist, else FailedMount, pod Pending;
4. images: `ClusterEmulator.unpullable` images give ErrImagePull, pod Pending;
   then DRA (dra.py): the pod's ResourceClaims must be allocated and reserved for it and their
   driver's kubelet plugin registered, else FailedPrepareDynamicResources, pod Pending;
5. init containers, then containers, each by its image profile (images.py) or, for images that
   are not operands, by the test's `pod_policy` (SIMULATED workload behaviour).
A container that exits under restartPolicy Always (or fails under OnFailure) crash-loops:
waiting `CrashLoopBackOff`, `lastState.terminated`, restartCount growing at each kubelet sync
(every request the emulator serves; back-off timing is not modelled), pod not Ready.
Graceful deletion: a terminating pod is removed at the kubelet's next sync.
`pause(node)` stops a node's kubelet (pods stay as they are) until `resume(node)`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tests.cluster.emulator.context import RunContext
from tests.cluster.emulator.devices import AllocationError
from tests.cluster.emulator.images import Outcome, profile_for
from tests.cluster.emulator.podstatus import ContainerRun, PodRun, pod_status, requests
from tests.cluster.emulator.store import now
from tests.cluster.emulator.strategies import is_extended, quantity

if TYPE_CHECKING:
    from tests.cluster.emulator.cluster import ClusterEmulator


class Kubelets:
    def __init__(self, cluster: ClusterEmulator):
        self.cluster = cluster
        self.runs: dict[str, PodRun] = {}
        self.paused: set[str] = set()
        self.pending = False  # crash-looping containers or terminating pods wait for a sync
        self._mps: dict[str, str] = {}  # node -> uid of the MPS daemon pod serving it

    # -- hooks for profiles -------------------------------------------------------------------

    def mps_ready(self, node: str) -> bool:
        return node in self._mps

    def set_mps_ready(self, node: str, uid: str) -> None:
        self._mps[node] = uid

    def pause(self, node: str) -> None:
        self.paused.add(node)

    def resume(self, node: str) -> None:
        self.paused.discard(node)

    def finish(self, pod: dict, outcome: Outcome) -> None:
        """A workload's process ends (never an operand: their behaviour is their image's)."""
        run = self.runs.get(pod["metadata"]["uid"])
        policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
        for c in run.containers.values() if run else []:
            if c.profile.operand:
                raise ValueError(
                    f"{c.name} runs an operand image; its behaviour is not a test's to set"
                )
            if c.state == "running":
                self._apply(c, outcome, policy)
        if run:
            self._write_status(pod, run)

    def log(self, pod: dict, container: str | None) -> str | None:
        run = self.runs.get(pod["metadata"]["uid"])
        if not run or not run.containers:
            return None
        if container and container in run.containers:
            return run.containers[container].log
        return next(iter(run.containers.values())).log

    # -- the sync loop -------------------------------------------------------------------------

    def sync(self, restart: bool) -> None:
        """One sync of every kubelet; `restart`: also restart crash-looping containers and
        finish graceful deletions (done once per request, before it is served)."""
        cluster = self.cluster
        pods_kind = cluster.kind("v1", "Pod")
        live = set()
        pending = False
        for pod in list(cluster.store.items(pods_kind)):
            node = (pod.get("spec") or {}).get("nodeName")
            uid = pod["metadata"]["uid"]
            live.add(uid)
            if not node or node in self.paused or cluster.node(node) is None:
                continue
            if pod["metadata"].get("deletionTimestamp"):
                if restart:
                    self._stop(pod)
                    cluster.api.remove(pods_kind, pod)
                    live.discard(uid)
                else:
                    pending = True
                continue
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                self._stop(pod)
                continue
            self._sync_pod(pod, node, restart)
            run = self.runs.get(uid)
            if run and any(
                c.state == "waiting" and c.reason == "CrashLoopBackOff"
                for c in run.containers.values()
            ):
                pending = True
            if run and run.waiting and run.waiting[0].startswith("Init:"):
                pending = True
        self.pending = pending
        for uid in [u for u in self.runs if u not in live]:
            self.runs.pop(uid)
            cluster.devices.release(uid)
        for node, uid in list(self._mps.items()):
            if uid not in live or not self._running(uid):
                del self._mps[node]
        for node, plugins in [
            (n, cluster.devices.plugins(n)) for n in list(cluster.devices.registrations)
        ]:
            for plugin in plugins:
                if not self._running(plugin):
                    cluster.devices.unregister(node, plugin)
        for node, drivers in list(cluster.dra.plugins.items()):
            for plugin in set(drivers.values()):
                if not self._running(plugin):
                    cluster.dra.unregister(node, plugin)
        for node in cluster.store.items(cluster.kind("v1", "Node")):
            self._node_status(node)

    def _running(self, uid: str) -> bool:
        run = self.runs.get(uid)
        return bool(run) and any(c.state == "running" for c in run.containers.values())

    def _stop(self, pod: dict) -> None:
        uid = pod["metadata"]["uid"]
        run = self.runs.get(uid)
        if run:
            for c in run.containers.values():
                if c.state == "running":
                    c.profile.stop(self._context(pod, c.name))
        self.cluster.devices.release(uid)

    # -- one pod ----------------------------------------------------------------------------------

    def _sync_pod(self, pod: dict, node: str, restart: bool) -> None:
        uid = pod["metadata"]["uid"]
        run = self.runs.setdefault(uid, PodRun(uid))
        spec = pod.get("spec") or {}
        if not run.admitted:
            problem = self._admit(pod, node, run)
            if problem:
                self._reject(pod, *problem)
                return
            run.admitted = True
        blocked = self._blocked(pod, node) or self._prepare_claims(pod, node, run)
        if blocked:
            run.waiting = blocked[:2]
            self._event(pod, run, blocked[2], blocked[3], "Warning")
            self._write_status(pod, run)
            return
        if run.waiting and run.waiting[0].startswith("Init:") and not restart:
            return  # a failed init container is retried at the next restart sync
        run.waiting = None
        if not run.init_done:
            for container in spec.get("initContainers") or []:
                outcome = self._start(pod, container, run)
                if outcome.running or outcome.exit_code != 0:
                    self._init_failed(pod, run, container, outcome)
                    return
            run.init_done = True
        for container in spec.get("containers") or []:
            self._sync_container(pod, container, run, restart)
        self._write_status(pod, run)

    def _init_failed(self, pod, run, container, outcome) -> None:
        policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
        c = run.containers.setdefault(
            container["name"], ContainerRun(container["name"], profile_for(container))
        )
        c.state, c.exit_code, c.log = "terminated", outcome.exit_code, outcome.log
        if policy == "Never":
            self._terminal(pod, run, "Failed", "Init container failed")
        else:
            c.restarts += 1
            run.waiting = (
                "Init:CrashLoopBackOff",
                f"init container {container['name']} exited {outcome.exit_code}",
            )
            self._write_status(pod, run)

    def _sync_container(self, pod, container, run: PodRun, restart: bool) -> None:
        name = container["name"]
        c = run.containers.get(name)
        policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
        if c is None:
            c = run.containers[name] = ContainerRun(name, profile_for(container))
            self._apply(c, self._start(pod, container, run), policy)
        elif c.state == "waiting" and c.reason == "CrashLoopBackOff" and restart:
            c.restarts += 1
            self._apply(c, self._start(pod, container, run), policy)
        elif c.state == "running":
            c.profile.sync(self._context(pod, name, run))

    def _apply(self, c: ContainerRun, outcome: Outcome, policy: str) -> None:
        c.log = outcome.log
        if outcome.running:
            c.state, c.reason, c.started_at = "running", "", now()
            return
        finished = {"exitCode": outcome.exit_code, "reason": "Completed" if outcome.exit_code == 0 else "Error",
                    "startedAt": now(), "finishedAt": now()}  # fmt: skip
        if policy == "Always" or (policy == "OnFailure" and outcome.exit_code != 0):
            c.state, c.reason, c.last_exit = "waiting", "CrashLoopBackOff", finished
        else:
            c.state, c.exit_code, c.last_exit = "terminated", outcome.exit_code, finished

    def _start(self, pod, container, run) -> Outcome:
        ctx = self._context(pod, container["name"], run, container)
        profile = profile_for(container)
        if not profile.operand and self.cluster.pod_policy is not None:
            fate = self.cluster.pod_policy(pod)
            if fate is not None:
                return fate.outcome()
        if profile.operand or profile.name != "generic":
            return profile.start(ctx)
        return Outcome.run()

    def _context(self, pod, name, run: PodRun | None = None, container=None) -> RunContext:
        spec = pod.get("spec") or {}
        if container is None:
            container = next((c for c in (spec.get("containers") or []) + (spec.get("initContainers") or [])
                              if c["name"] == name), {"name": name})  # fmt: skip
        node = spec["nodeName"]
        run = run or self.runs.get(pod["metadata"]["uid"])
        devices = (run.devices.get(name) if run else None) or []
        return RunContext(self.cluster, pod, container, node, self.cluster.hardware(node),
                          self._handler(pod, node) or "runc", devices)  # fmt: skip

    # -- admission, sandbox, volumes, images ------------------------------------------------------

    def _admit(self, pod: dict, node: str, run: PodRun) -> tuple[str, str] | None:
        devices = self.cluster.devices
        uid = pod["metadata"]["uid"]
        spec = pod.get("spec") or {}
        for container in (spec.get("initContainers") or []) + (spec.get("containers") or []):
            for resource, value in ((container.get("resources") or {}).get("limits") or {}).items():
                if not is_extended(resource) or not devices.is_device_resource(node, resource):
                    continue
                try:
                    got = devices.allocate(node, uid, resource, quantity(value))
                except AllocationError as exc:
                    devices.release(uid)
                    return (
                        "UnexpectedAdmissionError",
                        f"Allocate failed due to {exc}, which is unexpected",
                    )
                run.devices.setdefault(container["name"], []).extend(got)
        node_obj = self.cluster.node(node)
        allocatable = ((node_obj.get("status") or {}).get("allocatable")) or {}
        for resource, wanted in requests(pod).items():
            if devices.is_device_resource(node, resource) or resource not in allocatable:
                continue  # removeMissingExtendedResources: unknown to the node, not checked
            used = sum(requests(p).get(resource, 0) for p in self.cluster.pods_on(node)
                       if p["metadata"]["uid"] != uid and self.runs.get(p["metadata"]["uid"], PodRun("")).admitted)  # fmt: skip
            capacity = quantity(allocatable[resource])
            if used + wanted > capacity:
                devices.release(uid)
                return (f"OutOf{resource}", f"Node didn't have enough resource: {resource}, "
                        f"requested: {wanted}, used: {used}, capacity: {capacity}")  # fmt: skip
        return None

    def _reject(self, pod: dict, reason: str, message: str) -> None:
        self.cluster.event(pod, reason, message, "Warning", "kubelet")
        status = {"phase": "Failed", "reason": reason, "message": f"Pod was rejected: {message}",
                  "startTime": now()}  # fmt: skip
        self.cluster.store.set_status(self.cluster.kind("v1", "Pod"), pod, status)

    def _handler(self, pod: dict, node: str) -> str | None:
        name = (pod.get("spec") or {}).get("runtimeClassName")
        if not name:
            return self.cluster.hardware(node).default_runtime
        rc = self.cluster.store.get(self.cluster.kind("node.k8s.io/v1", "RuntimeClass"), None, name)
        return (rc or {}).get("handler")

    def _blocked(self, pod: dict, node: str) -> tuple[str, str, str, str] | None:
        """(waiting reason, message, event reason, event message) while the pod cannot start."""
        hw = self.cluster.hardware(node)
        handler = self._handler(pod, node)
        if handler not in hw.runtime_handlers:
            text = (f"Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get "
                    f'sandbox runtime: no runtime for "{handler}" is configured')  # fmt: skip
            return "ContainerCreating", "", "FailedCreatePodSandBox", text
        ns = pod["metadata"]["namespace"]
        for volume in (pod.get("spec") or {}).get("volumes") or []:
            cm = volume.get("configMap")
            if (
                cm
                and self.cluster.store.get(self.cluster.kind("v1", "ConfigMap"), ns, cm["name"])
                is None
            ):
                text = f'MountVolume.SetUp failed for volume "{volume["name"]}" : configmap "{cm["name"]}" not found'
                return "ContainerCreating", "", "FailedMount", text
        for container in (pod.get("spec") or {}).get("initContainers", []) + (
            pod.get("spec") or {}
        ).get("containers", []):
            image = container.get("image", "")
            if image in self.cluster.unpullable:
                text = f'Failed to pull image "{image}": rpc error: code = NotFound desc = failed to pull and unpack image "{image}": not found'  # fmt: skip
                return "ErrImagePull", text, "Failed", text
        return None

    def _prepare_claims(self, pod: dict, node: str, run: PodRun):
        """The DRA manager's NodePrepareResources (dra.py), once per pod; blocked while it fails."""
        if run.dra_done or not (pod.get("spec") or {}).get("resourceClaims"):
            return None
        error, devices = self.cluster.dra.prepare(pod, node)
        if error:
            return "ContainerCreating", "", "FailedPrepareDynamicResources", error
        for container, got in devices.items():
            run.devices.setdefault(container, []).extend(got)
        run.dra_done = True
        return None

    # -- status --------------------------------------------------------------------------------

    def _event(self, pod, run: PodRun, reason: str, message: str, type_: str) -> None:
        if (reason, message) not in run.events:
            run.events.add((reason, message))
            self.cluster.event(pod, reason, message, type_, "kubelet")

    def _terminal(self, pod, run, phase: str, message: str = "") -> None:
        self._write_status(pod, run, phase)

    def _write_status(self, pod: dict, run: PodRun, phase: str | None = None) -> None:
        status = pod_status(pod, run, phase)
        self.cluster.store.set_status(self.cluster.kind("v1", "Pod"), pod, status)

    def _node_status(self, node: dict) -> None:
        name = node["metadata"]["name"]
        resources = self.cluster.devices.node_resources(name)
        if not resources:
            return
        status = dict(node.get("status") or {})
        capacity = dict(status.get("capacity") or {})
        allocatable = dict(status.get("allocatable") or {})
        for resource, (cap, alloc) in resources.items():
            capacity[resource], allocatable[resource] = str(cap), str(alloc)
        if capacity != status.get("capacity") or allocatable != status.get("allocatable"):
            status["capacity"], status["allocatable"] = capacity, allocatable
            self.cluster.store.set_status(self.cluster.kind("v1", "Node"), node, status)
