"""One node's label-driven MIG change, pure: the sequence `gpustack mig` runs on every node.

The sequence follows the GPU Operator's mig-manager (NVIDIA/mig-parted@bd7160f4
`deployments/container/reconfigure-mig.sh`, the script the GPU Operator's
`assets/state-mig-manager/0600_daemonset.yaml`@a22dbf67 runs on every node):

1. the desired layout is the node label `nvidia.com/mig.config`;
2. already applied (mig-parted `assert`; here the role's check mode): state `success`, done;
3. a state `rebooting` left by an earlier run whose mode change still did not take: `failed`
   ("MIG mode change did not take effect after rebooting");
4. state `pending`; the GPU clients are paused through their `nvidia.com/gpu.deploy.*` labels
   and their pods waited for;
5. apply; on success the clients come back and the state is `success`; on any error they come
   back and the state is `failed`.

gpustack adds what upstream leaves to the admin: the node is cordoned and its GPU pods are
evicted with `upgrade`'s machinery (Eviction API, PodDisruptionBudgets respected) so the GPUs
are idle, and after a change the node's advertised GPU resources are checked against the layout
(the resources it should give: gpustack/fleet/mig.py). Nothing here talks to Kubernetes or a
host: the backend (gpustack/k8s/cluster/mig.py) and the applier (the nvidia_mig role through
Ansible, gpustack/mig/host.py, or a test double) are passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpustack.fleet.mig import CONFIG_LABEL, expected_resources
from gpustack.upgrade.backend import StepFailed, StepOptions
from gpustack.upgrade.executors import Clock

# The values of nvidia.com/mig.config.state, as the GPU Operator's mig-manager writes them.
PENDING, REBOOTING, SUCCESS, FAILED = "pending", "rebooting", "success", "failed"


@dataclass
class MigOutcome:
    """What the nvidia_mig role reported for one host (its `gpustack_mig` fact)."""

    ran: bool  # False: the role did not run to its fact (unreachable, bad input, a task failed)
    state: str = ""  # success | pending | rebooting | failed (the fact's `state`)
    reason: str = ""
    changed: bool = False
    reboot_required: bool = False
    gpus: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def from_fact(cls, fact: Mapping[str, Any]) -> MigOutcome:
        return cls(
            ran=True,
            state=str(fact.get("state") or FAILED),
            reason=str(fact.get("reason") or ""),
            changed=bool(fact.get("changed")),
            reboot_required=bool(fact.get("reboot_required")),
            gpus=list(fact.get("gpus") or []),
        )


# (host, layout name, check mode) -> outcome. Check mode only reads (the role's `--check`);
# the role runs with nvidia_mig_reboot=never here: rebooting is the flow's decision.
MigApplier = Callable[[str, str, bool], MigOutcome]
# (host, layout name) -> what gpustack-mig.service recorded at boot: reboots the host for a MIG
# mode change (the role with nvidia_mig_reboot=if_needed) and waits for the boot unit.
MigRebooter = Callable[[str, str], MigOutcome]


# -- one node ------------------------------------------------------------------------------


class MigNodeBackend(Protocol):
    def desired_config(self, host: str) -> str | None: ...

    def state(self, host: str) -> str | None: ...

    def record(self, host: str, state: str, reason: str = "") -> None: ...

    def cordon(self, host: str) -> str: ...

    def uncordon(self, host: str) -> str: ...

    def pause_clients(self, host: str, clock: Clock, opts: StepOptions) -> str: ...

    def resume_clients(self, host: str) -> str: ...

    def evict_gpu_pods(self, host: str, clock: Clock, opts: StepOptions) -> str: ...

    def check_resources(
        self, host: str, expected: Mapping[str, int], clock: Clock, opts: StepOptions
    ) -> str: ...


@dataclass
class NodeResult:
    host: str
    config: str | None
    state: str  # the nvidia.com/mig.config.state written last ("" when none was: no label)
    reason: str = ""
    steps: list[str] = field(default_factory=list)
    states: list[str] = field(default_factory=list)  # every state written, in order


def reconfigure_node(
    host: str,
    backend: MigNodeBackend,
    apply: MigApplier,
    clock: Clock,
    opts: StepOptions,
    strategy: str,
    reboot: MigRebooter | None = None,
) -> NodeResult:
    """Bring one node to the layout its `nvidia.com/mig.config` label names (see the module doc)."""
    config = backend.desired_config(host)
    result = NodeResult(host, config, "")
    if not config:
        result.reason = f"no {CONFIG_LABEL} label: nothing to do"
        return result

    def record(state: str, reason: str = "") -> NodeResult:
        result.steps[:] = [s for s in result.steps if s]  # "" : a step that had nothing to do
        backend.record(host, state, reason)
        result.state, result.reason = state, reason
        result.states.append(state)
        return result

    def fail(reason: str) -> NodeResult:
        step = backend.resume_clients(host)  # a no-op unless this or an earlier run paused them
        if step:
            result.steps.append(step)
        return record(FAILED, reason)

    before = backend.state(host)
    check = apply(host, config, True)
    if not check.ran or check.state == FAILED:
        return fail(check.reason or "the nvidia_mig role failed")
    if check.state == SUCCESS and not check.changed:
        if before in (PENDING, REBOOTING, FAILED):
            # An earlier run left the node paused and cordoned (waiting for a reboot, or failed):
            # the layout is there now, so bring the node back as a change would.
            steps = [backend.resume_clients(host)]
            why = _verify(host, backend, check, clock, opts, strategy, result)
            if why:
                return fail(why)
            steps.append(backend.uncordon(host))
            result.steps += [s for s in steps if s]
        return record(SUCCESS, check.reason or f"{config} applied")
    if before == REBOOTING:
        return fail("MIG mode change did not take effect after rebooting")

    record(PENDING, check.reason)
    try:
        result.steps.append(backend.cordon(host))
        result.steps.append(backend.pause_clients(host, clock, opts))
        result.steps.append(backend.evict_gpu_pods(host, clock, opts))
    except StepFailed as exc:
        return fail(str(exc))
    out = apply(host, config, False)
    if out.ran and out.state == PENDING and out.reboot_required:
        if reboot is None:
            # The GPUs stay idle (cordoned, clients paused) until the reboot the host waits for;
            # the boot unit applies the layout and the next run confirms it and resumes the node.
            return record(PENDING, out.reason or "reboot required for the MIG mode change")
        record(REBOOTING, out.reason)
        out = reboot(host, config)
        if out.ran and out.state != SUCCESS:
            out.reason = out.reason or "MIG mode change did not take effect after rebooting"
    if not out.ran or out.state != SUCCESS:
        return fail(out.reason or "the nvidia_mig role failed")
    result.steps.append(backend.resume_clients(host))
    why = _verify(host, backend, out, clock, opts, strategy, result)
    if why:
        return fail(why)
    result.steps.append(backend.uncordon(host))
    return record(SUCCESS, out.reason or f"{config} applied")


def _verify(host, backend, outcome: MigOutcome, clock, opts, strategy, result) -> str:
    expected = expected_resources(outcome.gpus, strategy, desired=False)
    try:
        result.steps.append(backend.check_resources(host, expected, clock, opts))
    except StepFailed as exc:
        return str(exc)
    return ""
