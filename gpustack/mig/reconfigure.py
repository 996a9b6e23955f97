"""MIG on Kubernetes nodes, the pure part: strategy, expected resources, one node's reconfigure.

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
are idle, and after a change the node's advertised GPU resources are checked against the layout.
Nothing here talks to Kubernetes or a host: the backend (gpustack/k8s/cluster/mig.py) and the
applier (the nvidia_mig role through Ansible, or a test double) are passed in.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gpustack.upgrade.backend import StepFailed, StepOptions
from gpustack.upgrade.executors import Clock

CONFIG_LABEL = "nvidia.com/mig.config"
STATE_LABEL = "nvidia.com/mig.config.state"
PENDING, REBOOTING, SUCCESS, FAILED = "pending", "rebooting", "success", "failed"
ENABLED = "Enabled"  # nvidia-smi's mig.mode.current, as the role's fact carries it


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


# -- the MIG strategy and what the device plugin should advertise ------------------------------


def _mig_on(gpu: Mapping[str, Any], desired: bool) -> bool:
    if desired:
        return gpu.get("desired_mode") == ENABLED
    return gpu.get("mode_current") == ENABLED


def _devices(gpu: Mapping[str, Any], desired: bool) -> dict[str, int]:
    devices = gpu.get("desired" if desired else "applied") or {}
    return {str(k): int(v) for k, v in devices.items() if int(v) > 0}


def node_strategy(gpus: Sequence[Mapping[str, Any]], desired: bool = True) -> str:
    """Pure: none (no GPU in MIG mode), single (every GPU in MIG mode, one profile), else mixed.

    "single" is what k8s-device-plugin accepts as single (NVIDIA/k8s-device-plugin@1b826acc
    `internal/rm/device_map.go`: all GPUs with the same migEnabled value, every MIG-enabled GPU
    with MIG devices, one MIG device type on the node).
    """
    gpus = [g for g in gpus if g.get("mig_capable", True) or _mig_on(g, desired)]
    on = [g for g in gpus if _mig_on(g, desired)]
    if not on:
        return "none"
    profiles = {p for g in on for p in _devices(g, desired)}
    if len(on) == len(gpus) and len(profiles) == 1 and all(_devices(g, desired) for g in on):
        return "single"
    return "mixed"


def derive_strategy(nodes: Mapping[str, Sequence[Mapping[str, Any]]], desired: bool = True) -> str:
    """Pure: one strategy for the cluster (the device plugin's is cluster-wide).

    none when no node has a GPU in MIG mode; single when every node with MIG is single (nodes
    without MIG advertise whole GPUs as nvidia.com/gpu under single too); else mixed.
    """
    per_node = {node_strategy(gpus, desired) for gpus in nodes.values()}
    if per_node <= {"none"}:
        return "none"
    if per_node <= {"none", "single"}:
        return "single"
    return "mixed"


def expected_resources(
    gpus: Sequence[Mapping[str, Any]], strategy: str, desired: bool = True
) -> dict[str, int]:
    """Pure: the GPU resources k8s-device-plugin advertises for these GPUs under `strategy`.

    As `internal/rm/device_map.go`@1b826acc: with none every GPU is one nvidia.com/gpu (MIG
    or not); otherwise a MIG-enabled GPU gives its MIG devices — as nvidia.com/gpu (single) or
    nvidia.com/mig-<profile> (mixed) — and the others one nvidia.com/gpu each.
    """
    out: dict[str, int] = {}
    for gpu in gpus:
        if strategy == "none" or not _mig_on(gpu, desired):
            out["nvidia.com/gpu"] = out.get("nvidia.com/gpu", 0) + 1
            continue
        for profile, count in _devices(gpu, desired).items():
            if "c." in profile.split("+")[0]:  # compute-instance profiles: not a device type
                continue
            name = "nvidia.com/gpu" if strategy == "single" else f"nvidia.com/mig-{profile}"
            out[name] = out.get(name, 0) + count
    return out


def resource_drift(expected: Mapping[str, int], advertised: Mapping[str, Any]) -> str:
    """Pure: '' when the node's GPU allocatable equals `expected`, else what differs."""
    have = {
        k: int(str(v))
        for k, v in advertised.items()
        if k.startswith(("nvidia.com/gpu", "nvidia.com/mig-")) and str(v).isdigit() and int(v)
    }
    want = {k: v for k, v in expected.items() if v}
    if have == want:
        return ""
    names = sorted(set(have) | set(want))
    return ", ".join(f"{n}: {have.get(n, 0)} (layout: {want.get(n, 0)})" for n in names
                     if have.get(n, 0) != want.get(n, 0))  # fmt: skip


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
