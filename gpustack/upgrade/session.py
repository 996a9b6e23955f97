"""Start or resume the recorded upgrade of an inventory (pure decisions over the state record)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from gpustack.errors import BadInput
from gpustack.upgrade.state import (
    IN_PROGRESS,
    NodeRecord,
    Target,
    UpgradeRun,
    UpgradeState,
)


def open_run(
    existing: UpgradeRun | None,
    *,
    inventory: Path,
    target: Target,
    hosts: Sequence[str],
    mode: str,
    resume: bool,
    state_file: Path | None,
    label_states: dict[str, str | None] | None = None,
) -> UpgradeRun:
    """The run to execute: the recorded one (--resume) or a new one; BadInput when unsafe.

    `label_states` are the durable states a Kubernetes backend keeps on the nodes; when given
    they win over the local record (the cluster is the source of truth there).
    """
    where = f" ({state_file})" if state_file else ""
    if resume:
        if existing is None:
            raise BadInput(
                f"no upgrade of {inventory} is recorded",
                f"start one without --resume (its state is kept in {state_file})",
            )
        if existing.target != target:
            raise BadInput(
                f"the recorded upgrade of this inventory is to {existing.target.describe()}, "
                f"not {target.describe()}",
                f"resume it with {_flag(existing.target)}, or let it finish before "
                "starting an upgrade to another version",
            )
        if existing.mode != mode:
            raise BadInput(
                f"the recorded upgrade ran {existing.mode}, this one would run {mode}",
                "resume with the same --kubeconfig as the recorded run (or none)",
            )
        run = existing
    else:
        if existing is not None and _unfinished(existing):
            done = sum(1 for n in existing.nodes.values() if n.state == UpgradeState.DONE)
            raise BadInput(
                f"an unfinished upgrade to {existing.target.describe()} is recorded for this "
                f"inventory ({done} of {len(existing.nodes)} node(s) done){where}",
                "continue it with --resume (--retry-failed retries failed nodes), or delete the "
                "state file to forget it (nodes it cordoned stay cordoned)",
            )
        run = UpgradeRun(inventory=str(inventory), target=target, mode=mode)
        if existing is not None:  # what the last upgrade measured orders this one
            run.durations = existing.measured_durations()
    for name in hosts:
        if name not in run.nodes:
            run.nodes[name] = NodeRecord(name=name)
    if label_states:
        for name in hosts:
            state = label_states.get(name)
            if resume and state:
                run.nodes[name].state = state
    return run


def _unfinished(run: UpgradeRun) -> bool:
    """A run that stopped with nodes mid-way or never started (interrupted, paused)."""
    states = [n.state for n in run.nodes.values()]
    return any(s in IN_PROGRESS for s in states) or (
        any(s == UpgradeState.REQUIRED for s in states)
        and any(s != UpgradeState.REQUIRED for s in states)
    )


def _flag(target: Target) -> str:
    return (
        f"--driver-version {target.version}"
        if target.version
        else f"--driver-branch {target.branch}"
    )
