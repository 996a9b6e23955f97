"""The pure upgrade planner: batch selection under maxUnavailable, maxParallel and canary."""

from __future__ import annotations

import random

import pytest

from gpustack.errors import BadInput
from gpustack.upgrade.planner import (
    Limits,
    NodeView,
    blocked_reason,
    plan_batches,
    resolve_max_unavailable,
    select_batch,
    summarize,
    unavailable_nodes,
)
from gpustack.upgrade.state import UpgradeState as S


def fleet(n: int, **overrides) -> list[NodeView]:
    nodes = [NodeView(f"n{i:03d}") for i in range(n)]
    for index, view in overrides.items():
        i = int(index.removeprefix("n"))
        nodes[i] = NodeView(nodes[i].name, **view)
    return nodes


@pytest.mark.parametrize(
    ("spec", "total", "expected"),
    [("25%", 200, 50), ("25%", 3, 1), ("10%", 5, 1), ("33%", 10, 4), ("100%", 7, 7),
     ("2", 200, 2), (" 3 ", 10, 3), ("1%", 1, 1), ("50%", 0, 0)],
)  # fmt: skip
def test_max_unavailable_counts_and_percentages_round_up(spec, total, expected):
    assert resolve_max_unavailable(spec, total) == expected


@pytest.mark.parametrize("spec", ["0", "0%", "-1", "abc", "1.5", "101%", "%", ""])
def test_max_unavailable_rejects_nonsense(spec):
    with pytest.raises(BadInput):
        resolve_max_unavailable(spec, 10)


def test_first_batch_is_bounded_by_both_limits():
    assert select_batch(fleet(10), (), Limits(3, 3)) == ["n000", "n001", "n002"]
    assert select_batch(fleet(10), (), Limits(3, 1)) == ["n000"]
    assert select_batch(fleet(10), (), Limits(1, 5)) == ["n000"]
    assert select_batch(fleet(2), (), Limits(5, 5)) == ["n000", "n001"]


def test_in_flight_nodes_use_slots_and_budget():
    nodes = fleet(10)
    assert select_batch(nodes, {"n000", "n001"}, Limits(3, 3)) == ["n002"]
    assert select_batch(nodes, {"n000", "n001", "n002"}, Limits(3, 5)) == []
    assert select_batch(nodes, {"n000"}, Limits(5, 2)) == ["n001"]


def test_already_unavailable_nodes_count_and_are_upgraded_first_for_free():
    # n005 and n007 are NotReady/cordoned: out of service already, so upgrading them costs
    # nothing, while they use up two of the three allowed unavailable nodes.
    nodes = fleet(10, n5={"unavailable": True}, n7={"unavailable": True})
    assert select_batch(nodes, (), Limits(3, 5)) == ["n005", "n007", "n000"]
    assert select_batch(nodes, (), Limits(2, 5)) == ["n005", "n007"]
    assert select_batch(nodes, (), Limits(2, 1)) == ["n005"]


def test_done_but_unavailable_nodes_still_consume_budget():
    # An admin-cordoned node stays cordoned after its upgrade: still out of service.
    nodes = fleet(5, n0={"state": S.DONE.value, "unavailable": True})
    assert select_batch(nodes, (), Limits(2, 5)) == ["n001"]
    assert select_batch(nodes, (), Limits(1, 5)) == []


def test_failed_nodes_stay_unavailable_and_are_retried_only_on_request():
    nodes = fleet(5, n1={"state": S.FAILED.value})
    assert "n001" in unavailable_nodes(nodes, ())
    assert select_batch(nodes, (), Limits(2, 5)) == ["n000"]
    assert select_batch(nodes, (), Limits(1, 5)) == []
    assert select_batch(nodes, (), Limits(1, 5), retry_failed=True) == ["n001"]
    assert select_batch(nodes, (), Limits(2, 5), retry_failed=True) == ["n001", "n000"]


def test_interrupted_nodes_are_resumed_first():
    nodes = fleet(5, n3={"state": S.POD_RESTART.value})
    assert select_batch(nodes, (), Limits(1, 1)) == ["n003"]
    assert select_batch(nodes, (), Limits(2, 2)) == ["n003", "n000"]


def test_skip_label_and_done_nodes_are_never_selected():
    nodes = fleet(4, n0={"skip": True}, n1={"state": S.DONE.value})
    assert select_batch(nodes, (), Limits(4, 4)) == ["n002", "n003"]
    assert summarize(nodes) == {
        "total": 4, "done": 1, "failed": 0, "skipped": 1, "pending": 2, "in_progress": 0,
    }  # fmt: skip


def test_canary_caps_the_batch():
    assert select_batch(fleet(10), (), Limits(5, 5), cap=2) == ["n000", "n001"]
    assert select_batch(fleet(10), (), Limits(5, 5), cap=0) == []


def test_blocked_reason_names_the_unavailable_nodes():
    nodes = fleet(4, n0={"unavailable": True, "state": S.DONE.value})
    assert select_batch(nodes, (), Limits(1, 1)) == []
    reason = blocked_reason(nodes, Limits(1, 1))
    assert "1 node(s) are already unavailable (n000)" in reason
    assert "max-unavailable is 1" in reason


def test_plan_batches_covers_the_fleet_within_limits():
    assert [len(b) for b in plan_batches(fleet(10), Limits(3, 3))] == [3, 3, 3, 1]
    assert [len(b) for b in plan_batches(fleet(10), Limits(3, 3), canary=1)] == [1, 3, 3, 3]
    assert [len(b) for b in plan_batches(fleet(10), Limits(4, 2))] == [2] * 5
    # Two nodes already down: they go first, and every later batch is one smaller.
    nodes = fleet(8, n6={"unavailable": True}, n7={"unavailable": True})
    assert plan_batches(nodes, Limits(3, 3)) == [
        ["n006", "n007", "n000"], ["n001"], ["n002"], ["n003"], ["n004"], ["n005"],
    ]  # fmt: skip


def test_plan_batches_is_empty_when_everything_is_done_or_skipped():
    nodes = fleet(3, n0={"state": S.DONE.value}, n1={"skip": True}, n2={"state": S.DONE.value})
    assert plan_batches(nodes, Limits(1, 1)) == []


@pytest.mark.parametrize("seed", range(25))
def test_random_rollouts_never_exceed_the_limits(seed):
    """Random fleets, limits and completion orders: the invariants hold at every step."""
    rng = random.Random(seed)
    n = rng.randint(1, 60)
    limits = Limits(rng.randint(1, 10), rng.randint(1, 10))
    nodes = {
        f"n{i}": NodeView(
            f"n{i}",
            rng.choice([S.REQUIRED.value] * 6 + [S.DONE.value, S.FAILED.value]),
            unavailable=rng.random() < 0.1,
            skip=rng.random() < 0.05,
        )
        for i in range(n)
    }
    outside = len(unavailable_nodes(nodes.values(), ()))
    in_flight: set[str] = set()
    started: list[str] = []
    for _ in range(10 * n + 10):
        batch = select_batch(list(nodes.values()), in_flight, limits)
        assert len(set(batch)) == len(batch)
        in_flight.update(batch)
        started += batch
        assert len(in_flight) <= limits.max_parallel
        unavailable = unavailable_nodes(nodes.values(), in_flight)
        assert len(unavailable) <= max(limits.max_unavailable, outside)
        if not in_flight:
            break
        done = rng.choice(sorted(in_flight))
        in_flight.remove(done)
        old = nodes[done]
        nodes[done] = NodeView(done, S.DONE.value, old.unavailable, old.skip)
    assert len(started) == len(set(started)), "no node is upgraded twice"
    for view in nodes.values():
        if view.name in started:
            assert not view.skip
