"""Where a playbook run's time went, per task, from ansible-runner's job events (no stdout parsing).

Each `runner_on_ok/changed/failed/skipped/unreachable` event carries the task's start and end on
one host. Per task this prints the wall span (first start to last end over all hosts), the sum
over hosts and the host count; the top N by wall span, and the time between tasks (the
controller's own overhead: templating, includes, forks starting) as one line.

    python benchmarks/run_profile.py ARTIFACTS_DIR [ARTIFACTS_DIR ...] [--top 25]

ARTIFACTS_DIR is a run's `.../artifacts/<ident>` directory (printed by a failed run, or the newest
under ~/.local/state/gpustack/runs/*/artifacts/*) or a run directory above it.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

# Actions that run on the controller only (no round trip to the host).
APT = "ansible.builtin.apt"
# The package manager's work, as the apt floor has it: transactions and the package lists' refresh
# (the driver role refreshes and asks apt-cache madison in one gpustack module call).
APT_ACTIONS = {
    APT,
    "gpustack.gpustack.gpustack_apt_lists",
    "gpustack.gpustack.gpustack_apt_install",
}
CONTROLLER_ACTIONS = {
    f"ansible.builtin.{name}"
    for name in ("set_fact", "assert", "debug", "fail", "include_tasks", "include_role",
                 "import_tasks", "import_role", "include_vars", "validate_argument_spec", "meta")
}  # fmt: skip
HOST_EVENTS = {
    "runner_on_ok",
    "runner_on_failed",
    "runner_on_skipped",
    "runner_on_unreachable",
    "runner_item_on_ok",
}


def _ts(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


@dataclass
class TaskTime:
    name: str
    role: str
    first_start: float
    last_end: float
    action: str = ""
    host_seconds: float = 0.0
    hosts: set[str] = field(default_factory=set)
    skipped: int = 0
    remote_calls: int = 0  # runs on hosts that were not skipped and needed a round trip
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)  # per host
    # gpustack_apt_install's RV steps per host: [name, start, end], the host's clock
    steps: dict[str, list] = field(default_factory=dict)

    @property
    def wall(self) -> float:
        return self.last_end - self.first_start


def events_dir(path: Path) -> Path:
    if (path / "job_events").is_dir():
        return path / "job_events"
    found = sorted(path.glob("artifacts/*/job_events"))
    if not found:
        raise SystemExit(f"no job_events under {path}")
    return found[-1]


def load(path: Path) -> tuple[list[TaskTime], float, float]:
    """Per task timings, and the run's first and last event time."""
    tasks: dict[str, TaskTime] = {}
    first = last = None
    for file in events_dir(path).glob("*.json"):
        event = json.loads(file.read_text(encoding="utf-8"))
        created = _ts(event["created"]) if event.get("created") else None
        if created is not None:
            first = created if first is None else min(first, created)
            last = created if last is None else max(last, created)
        if event.get("event") not in HOST_EVENTS or event.get("event") == "runner_item_on_ok":
            continue
        data = event.get("event_data") or {}
        if not data.get("start") or not data.get("end"):
            continue
        start, end = _ts(data["start"]), _ts(data["end"])
        key = data.get("task_uuid") or data.get("task")
        task = tasks.get(key)
        if task is None:
            task = tasks[key] = TaskTime(
                data.get("task", "?"),
                data.get("role", ""),
                start,
                end,
                action=data.get("task_action") or "",
            )
        task.first_start = min(task.first_start, start)
        task.last_end = max(task.last_end, end)
        task.host_seconds += end - start
        task.hosts.add(data.get("host", "?"))
        if event["event"] != "runner_on_skipped":
            task.spans[data.get("host", "?")] = (start, end)
        task.skipped += event["event"] == "runner_on_skipped"
        if isinstance((data.get("res") or {}).get("steps"), list) and data["res"]["steps"]:
            task.steps[data.get("host", "?")] = data["res"]["steps"]
        if (
            event["event"] != "runner_on_skipped"
            and data.get("task_action") not in CONTROLLER_ACTIONS
        ):
            loop = (data.get("res") or {}).get("results")  # a loop: a round trip per item
            task.remote_calls += len(loop) if isinstance(loop, list) and loop else 1
    return list(tasks.values()), first or 0.0, last or 0.0


def turns(spans: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Each host's own share of a step the hosts take in turns (the lab's nodes share one apt
    cache and its lock): from the later of its start and the previous host's end, to its end."""
    own, previous = {}, None
    for host, (start, end) in sorted(spans.items(), key=lambda kv: kv[1][1]):
        own[host] = end - max(start, previous if previous is not None else start)
        previous = end
    return own


def report(path: Path, top: int) -> float:
    """Print the run's profile; return the wall time of its apt tasks (APT_ACTIONS)."""
    tasks, first, last = load(path)
    total = last - first
    busy = _union([(t.first_start, t.last_end) for t in tasks])
    print(f"{path}: {len(tasks)} tasks, {total:.1f} s from first to last event")
    print(f"  time inside tasks (union of spans) {busy:.1f} s; between tasks {total - busy:.1f} s")
    hosts = {h for t in tasks for h in t.hosts} or {"?"}
    remote = sum(t.remote_calls for t in tasks)
    apt = sum(t.remote_calls for t in tasks if t.action in APT_ACTIONS)
    print(
        f"  module calls on the hosts (round trips): {remote / len(hosts):.0f} per host, "
        f"{apt / len(hosts):.0f} of them apt (ansible.builtin.apt, gpustack_apt_lists, "
        "gpustack_apt_install)"
    )
    apt_wall = _union([(t.first_start, t.last_end) for t in tasks if t.action in APT_ACTIONS])
    print(f"  wall time in apt tasks {apt_wall:.1f} s, outside them {total - apt_wall:.1f} s")
    for task in (t for t in tasks if t.action in APT_ACTIONS and len(t.spans) > 1 and t.wall > 5):
        shares = ", ".join(f"{h} {s:.1f} s" for h, s in turns(task.spans).items())
        print(f"  {task.name[:60]}: each host's own turn: {shares}")
    for host, (before, inside, after) in sorted(package_path(tasks, first, last).items()):
        amid = total - before - inside - after
        print(f"  {host}: {before:.1f} s before its first apt task, {inside:.1f} s in apt tasks "
              f"(lock waits included), {amid:.1f} s in other tasks between them, {after:.1f} s "
              "after its last")  # fmt: skip
    for host, steps in sorted(transaction_steps(tasks).items()):
        began = next((start for name, start, _ in steps if name == "apt-get"), None)
        when = f"; apt-get began {began - first:.1f} s after the first event" if began else ""
        shares = ", ".join(f"{name} {end - start:.2f}" for name, start, end in steps)
        print(f"  {host}: the transaction call's steps (s): {shares}{when}")
    print(f"  {'wall s':>7} {'host s':>7} {'hosts':>5}  task")
    for task in sorted(tasks, key=lambda t: t.wall, reverse=True)[:top]:
        role = f"{task.role} : " if task.role else ""
        skipped = f" (skipped on {task.skipped})" if task.skipped else ""
        print(f"  {task.wall:7.2f} {task.host_seconds:7.2f} {len(task.hosts):5d}  "
              f"{role}{task.name}{skipped}")  # fmt: skip
    return apt_wall


def transaction_steps(tasks: list[TaskTime]) -> dict[str, list]:
    """Per host, the steps gpustack_apt_install timed in the call that ran the transaction (its
    RV steps; a background transaction's come with the join): [name, start, end], the host's
    clock (the lab's nodes share the machine's)."""
    found: dict[str, list] = {}
    for task in tasks:
        for host, steps in task.steps.items():
            if any(name == "apt-get" for name, _, _ in steps) or host not in found:
                found[host] = steps
    return found


def package_path(
    tasks: list[TaskTime], first: float, last: float
) -> dict[str, tuple[float, float, float]]:
    """Per host: seconds from the run's first event to its first apt task, inside its apt tasks
    (their union: waits for the package locks included), and from its last apt task to the run's
    last event. The host whose apt tasks end last carries the run's critical path: what it does
    before, between and after them adds to the package manager's own time. (Under the linear
    strategy a host's time between them includes waiting at each task for the other hosts.)"""
    spans: dict[str, list[tuple[float, float]]] = {}
    for task in tasks:
        if task.action in APT_ACTIONS:
            for host, span in task.spans.items():
                spans.setdefault(host, []).append(span)
    return {
        host: (
            min(s for s, _ in own) - first,
            _union(own),
            last - max(e for _, e in own),
        )
        for host, own in spans.items()
    }


def _union(spans: list[tuple[float, float]]) -> float:
    total, end = 0.0, None
    for start, stop in sorted(spans):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    for path in args.paths:
        report(path, args.top)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
