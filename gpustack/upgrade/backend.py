"""Node backends: what cordon, evict, drain and validate mean where the fleet lives.

`HostOnlyBackend` is for fleets without Kubernetes: there is nothing to cordon or evict, so
those steps are recorded as no-ops and the durable state is the local state file alone.
The Kubernetes backend lives in `gpustack/k8s/cluster/upgrade.py` (only gpustack/k8s/cluster/
talks to Kubernetes) and implements the same protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpustack.upgrade.executors import Clock


class StepFailed(Exception):
    """A step could not be completed; the message is the reason recorded on the node."""


@dataclass(frozen=True)
class NodeCondition:
    """A node as the cluster sees it, before this upgrade touches it."""

    cordoned: bool = False
    ready: bool = True
    skip: bool = False
    state: str | None = None  # durable upgrade state kept by the backend (k8s label)
    admin_cordoned: bool | None = None  # recorded by an earlier run, when known

    @property
    def unavailable(self) -> bool:
        return self.cordoned or not self.ready


@dataclass
class StepOptions:
    """The user's upgrade policy for the per-node steps."""

    drain: bool = False
    pod_selector: str = ""  # wait for pods matching it to finish before evicting
    wait_for_jobs_timeout: float = 0  # 0: wait as long as it takes (as upstream)
    pod_deletion_timeout: float = 300
    force: bool = False  # also evict pods no controller (or a gone DaemonSet) manages
    delete_emptydir_data: bool = False  # also evict pods with emptyDir volumes (data lost)
    drain_pod_selector: str = ""  # the drain step takes only pods matching it (kubectl's)
    drain_timeout: float = 300
    validation_timeout: float = 600
    poll: float = 2.0


@dataclass
class HostOutcome:
    """What running the driver role on one host gave."""

    ok: bool
    reason: str = ""
    driver: dict[str, Any] = field(default_factory=dict)
    gpus: int = 0
    artifacts: str = ""
    canceled: bool = False


# (host name, cancel(), clock) -> outcome. The real one runs Ansible (gpustack/upgrade/host.py)
# in real time; simulations spend virtual time on the clock.
HostUpgrader = Callable[[str, Callable[[], bool], Clock], HostOutcome]


class NodeBackend(Protocol):
    mode: str

    def conditions(self, names: Sequence[str]) -> dict[str, NodeCondition]: ...

    def record_state(
        self, name: str, state: str, reason: str = "", admin_cordoned: bool = False
    ) -> None: ...

    def cordon(self, name: str, clock: Clock, opts: StepOptions) -> str: ...

    def wait_for_jobs(self, name: str, clock: Clock, opts: StepOptions) -> str: ...

    def evict_gpu_pods(self, name: str, clock: Clock, opts: StepOptions) -> str: ...

    def drain(self, name: str, clock: Clock, opts: StepOptions) -> str: ...

    def pause_gpu_clients(self, name: str, clock: Clock, opts: StepOptions) -> str: ...

    def resume_gpu_clients(self, name: str) -> str: ...

    # `driver`: the host's gpustack_driver fact after its upgrade (the GPUs the role read)
    def validate(
        self, name: str, clock: Clock, opts: StepOptions, driver: Mapping[str, Any] | None = None
    ) -> str: ...

    def uncordon(self, name: str, clock: Clock, opts: StepOptions) -> str: ...


NO_K8S = "no Kubernetes: nothing to {}"


class HostOnlyBackend:
    """Fleets without Kubernetes: every cluster step is a recorded no-op."""

    mode = "host-only"

    def conditions(self, names: Sequence[str]) -> dict[str, NodeCondition]:
        return {name: NodeCondition() for name in names}

    def record_state(
        self, name: str, state: str, reason: str = "", admin_cordoned: bool = False
    ) -> None:
        """The state file is the durable record; nothing else to write."""

    def cordon(self, name: str, clock: Clock, opts: StepOptions) -> str:
        return NO_K8S.format("cordon")

    def wait_for_jobs(self, name: str, clock: Clock, opts: StepOptions) -> str:
        return NO_K8S.format("wait for")

    def evict_gpu_pods(self, name: str, clock: Clock, opts: StepOptions) -> str:
        return NO_K8S.format("evict")

    def drain(self, name: str, clock: Clock, opts: StepOptions) -> str:
        return NO_K8S.format("drain")

    def pause_gpu_clients(self, name: str, clock: Clock, opts: StepOptions) -> str:
        return NO_K8S.format("pause")

    def resume_gpu_clients(self, name: str) -> str:
        return ""

    def validate(
        self, name: str, clock: Clock, opts: StepOptions, driver: Mapping[str, Any] | None = None
    ) -> str:
        return "host checks only (no Kubernetes)"

    def uncordon(self, name: str, clock: Clock, opts: StepOptions) -> str:
        return NO_K8S.format("uncordon")
