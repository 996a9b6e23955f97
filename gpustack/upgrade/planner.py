"""Which nodes may start upgrading now: pure functions, no I/O, no clock.

The rules mirror the GPU Operator's upgrade policy:
- at most `max_unavailable` nodes out of service at any time, counting nodes that are already
  unavailable for other reasons (cordoned by an admin, NotReady) and failed nodes (they stay
  cordoned) as well as the nodes being upgraded;
- at most `max_parallel` nodes upgrading at once;
- a node that is already unavailable costs no extra capacity, so it is taken first;
- an optional canary batch goes alone before everything else.

The orchestrator asks again whenever a node finishes (and on every pass while a slot is free),
so a slot is refilled the moment it frees: rolling, never batch by batch. Among the nodes
that may start, those that took longest in the previous upgrade of the fleet go first
(longest processing time first): when the end of the rollout comes, only short nodes are left
to run, so fewer slots stand idle waiting for the last one. Nodes never measured go before
measured ones (they might be slow); without any measurement the order is the inventory's.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpustack.errors import BadInput
from gpustack.upgrade.state import FINAL, IN_PROGRESS, SKIPPED, UpgradeState

_LIMIT = re.compile(r"^\s*([0-9]+)\s*(%?)\s*$")


@dataclass(frozen=True)
class NodeView:
    """What the planner needs to know about one node."""

    name: str
    state: str = UpgradeState.REQUIRED.value
    unavailable: bool = False  # cordoned or NotReady for a reason other than this upgrade
    skip: bool = False  # nvidia.com/gpu-driver-upgrade.skip=true
    expected: float | None = None  # seconds out of service in its last upgrade (None: unknown)


@dataclass(frozen=True)
class Limits:
    max_unavailable: int
    max_parallel: int = 1


def resolve_max_unavailable(spec: str, total: int) -> int:
    """`N` or `P%` of `total` nodes (rounded up, as upstream), at least 1 when total > 0."""
    match = _LIMIT.match(str(spec))
    if not match:
        raise BadInput(
            f"--max-unavailable {spec!r} is not a count or a percentage",
            "write a whole number (e.g. 2) or a percentage (e.g. 25%)",
        )
    value, percent = int(match.group(1)), bool(match.group(2))
    if percent and value > 100:
        raise BadInput(f"--max-unavailable {spec} is over 100%", "use 1% to 100%")
    if value == 0:
        raise BadInput(
            "--max-unavailable 0 would never let a node upgrade",
            "allow at least one node (e.g. --max-unavailable 1)",
        )
    if percent:
        return max(1, math.ceil(total * value / 100)) if total else 0
    return value


def is_candidate(node: NodeView, retry_failed: bool) -> bool:
    if node.skip or node.state == SKIPPED:
        return False
    if node.state == UpgradeState.DONE:
        return False
    if node.state == UpgradeState.FAILED:
        return retry_failed
    return True  # upgrade-required, or an in-progress state left by an interrupted run


def unavailable_nodes(nodes: Iterable[NodeView], in_flight: Iterable[str]) -> set[str]:
    """Nodes out of service now: upgrading, failed (left cordoned), or unavailable anyway."""
    out = set(in_flight)
    for node in nodes:
        if node.unavailable or node.state == UpgradeState.FAILED or node.state in IN_PROGRESS:
            out.add(node.name)
    return out


def select_batch(
    nodes: Sequence[NodeView],
    in_flight: Iterable[str],
    limits: Limits,
    *,
    retry_failed: bool = False,
    cap: int | None = None,
    longest_first: bool = True,
) -> list[str]:
    """The nodes to start now (possibly none), in a stable order.

    `nodes` is the whole fleet in inventory order; `in_flight` the nodes being upgraded;
    `cap` bounds how many may start (the canary's size); `longest_first=False` keeps the
    inventory order among the nodes that cost capacity (the canary is the inventory's first).
    """
    in_flight = set(in_flight)
    unavailable = unavailable_nodes(nodes, in_flight)
    slots = limits.max_parallel - len(in_flight)
    budget = limits.max_unavailable - len(unavailable)
    if cap is not None:
        slots = min(slots, cap)
    candidates = [n for n in nodes if n.name not in in_flight and is_candidate(n, retry_failed)]
    # Free first (already out of service: resumed, failed-and-retried, cordoned, NotReady),
    # then the rest: longest expected first, unmeasured before measured, else inventory order
    # (the sort is stable).
    candidates.sort(key=lambda n: _priority(n, n.name in unavailable, longest_first))
    chosen: list[str] = []
    for node in candidates:
        if slots <= 0:
            break
        if node.name in unavailable:
            chosen.append(node.name)
            slots -= 1
        elif budget > 0:
            chosen.append(node.name)
            slots -= 1
            budget -= 1
    return chosen


def _priority(node: NodeView, free: bool, longest_first: bool) -> tuple[int, int, float]:
    group = 0 if free else 1
    if not longest_first or node.expected is None:
        return (group, 0, 0.0)
    return (group, 1, -node.expected)


def blocked_reason(nodes: Sequence[NodeView], limits: Limits) -> str:
    """Why nothing can start although candidates remain and nothing is in flight."""
    unavailable = sorted(unavailable_nodes(nodes, ()))
    shown = ", ".join(unavailable[:8]) + (" …" if len(unavailable) > 8 else "")
    return (
        f"{len(unavailable)} node(s) are already unavailable ({shown}) and max-unavailable is "
        f"{limits.max_unavailable}: no node can be taken out of service"
    )


def plan_batches(
    nodes: Sequence[NodeView],
    limits: Limits,
    *,
    canary: int = 0,
    retry_failed: bool = False,
) -> list[list[str]]:
    """The whole rollout as successive batches, assuming every batch succeeds (for --dry-run).

    Each batch is what `select_batch` starts once the previous batch is done; nodes that were
    out of service only because of this upgrade come back after their batch.
    """
    current = {n.name: n for n in nodes}
    batches: list[list[str]] = []
    first = True
    while True:
        view = list(current.values())
        batch = select_batch(
            view,
            (),
            limits,
            retry_failed=retry_failed,
            cap=canary if first and canary else None,
            longest_first=not (first and canary),
        )
        if not batch:
            return batches
        batches.append(batch)
        first = False
        for name in batch:
            old = current[name]
            current[name] = NodeView(
                name, UpgradeState.DONE.value, old.unavailable, old.skip, old.expected
            )


def summarize(nodes: Iterable[NodeView]) -> dict[str, int]:
    counts = {"total": 0, "done": 0, "failed": 0, "skipped": 0, "pending": 0, "in_progress": 0}
    for node in nodes:
        counts["total"] += 1
        if node.skip or node.state == SKIPPED:
            counts["skipped"] += 1
        elif node.state == UpgradeState.DONE:
            counts["done"] += 1
        elif node.state == UpgradeState.FAILED:
            counts["failed"] += 1
        elif node.state in IN_PROGRESS:
            counts["in_progress"] += 1
        else:
            counts["pending"] += 1
    return counts


__all__ = [
    "FINAL",
    "Limits",
    "NodeView",
    "blocked_reason",
    "is_candidate",
    "plan_batches",
    "resolve_max_unavailable",
    "select_batch",
    "summarize",
    "unavailable_nodes",
]
