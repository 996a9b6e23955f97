"""Benchmark: what one task costs on 2 lab nodes, by kind, with gpustack's Ansible settings.

The first-install target (<= 1.3 x the apt floor, docs/performance.md) leaves 30 % of the floor
for everything outside apt. This prints what the shape of the run
costs before any work is done: playbooks of 10 tasks each, on 2 fresh lab nodes at once, through
ansible-runner with the environment `gpustack install` uses (pipelining, SSH ControlPersist,
explicit gathering):

- remote: 10 tasks that each run a module on the hosts (`command: /bin/true`), one round trip each;
- controller: 10 `set_fact` tasks (no round trip);
- loop: one task that loops 10 times over the same module (10 round trips, one task);
- empty: the playbook with no task (start-up, inventory, ansible-runner).

Per-task cost = (playbook - empty) / 10, medians of --repeat runs after a warm-up. It then
multiplies the remote and controller costs by the task counts of a given first-install run
(`--run DIR`, a `site` run directory; benchmarks/run_profile.py reads the same events) to show
the part of that run's time that is the task count, not the work.

    python benchmarks/round_trip_cost.py [--repeat 5] [--run RUN_DIR] [--keep]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ansible_runner

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import labbench, run_profile  # noqa: E402
from gpustack.ansible.runner import RunSpec  # noqa: E402

LAB = "i18f-rt"
TASKS = 10
KINDS = {
    "remote": "ansible.builtin.command: /bin/true\n  changed_when: false",
    "controller": "ansible.builtin.set_fact:\n    bench_x: 1",
}


def playbooks(folder: Path) -> dict[str, Path]:
    head = "---\n- name: bench\n  hosts: all\n  gather_facts: false\n  tasks:\n"
    books = {"empty": head + "    []\n"}
    for kind, body in KINDS.items():
        tasks = "".join(f"    - name: t{i}\n      {body.replace(chr(10), chr(10) + '    ')}\n"
                        for i in range(TASKS))  # fmt: skip
        books[kind] = head + tasks
    books["loop"] = (head + "    - name: loop\n      ansible.builtin.command: /bin/true\n"
                     f"      changed_when: false\n      loop: {list(range(TASKS))}\n")  # fmt: skip
    out = {}
    for name, text in books.items():
        out[name] = folder / f"{name}.yml"
        out[name].write_text(text, encoding="utf-8")
    return out


def timed(playbook: Path, inventory: Path, env: dict) -> float:
    with tempfile.TemporaryDirectory() as data:
        start = time.perf_counter()
        result = ansible_runner.run(private_data_dir=data, playbook=str(playbook),
                                    inventory=str(inventory), envvars=env, quiet=True)  # fmt: skip
        seconds = time.perf_counter() - start
    if result.rc != 0:
        sys.exit(f"{playbook.name} failed (rc {result.rc})")
    return seconds


def counts(run_dir: Path) -> tuple[float, float]:
    """(module calls, controller-side tasks run) per host of a run, from its events."""
    tasks, _, _ = run_profile.load(run_dir)
    hosts = len({h for t in tasks for h in t.hosts}) or 1
    calls = sum(t.remote_calls for t in tasks)
    local = sum(len(t.spans) for t in tasks if t.action in run_profile.CONTROLLER_ACTIONS)
    return calls / hosts, local / hosts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--run", type=Path, help="a first install's run directory (costs applied)")
    parser.add_argument("--keep", action="store_true", help="leave the lab up")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="gpustack-rt-"))
    inventory = folder / "lab.ini"
    labbench.lab_up(LAB, 2, inventory)
    spec = RunSpec(playbook=folder / "empty.yml", inventory=inventory, target_group="all", hosts=[])
    env = {**spec.envvars(), "ANSIBLE_HOST_KEY_CHECKING": "False"}
    try:
        books = playbooks(folder)
        for book in books.values():  # warm-up: SSH control masters, caches
            timed(book, inventory, env)
        seconds: dict[str, list[float]] = {name: [] for name in books}
        for _ in range(args.repeat):
            for name, book in books.items():  # interleaved: load changes hit every kind alike
                seconds[name].append(timed(book, inventory, env))
    finally:
        if not args.keep:
            labbench.lab_down(LAB)
    median = {name: statistics.median(values) for name, values in seconds.items()}
    print(f"machine: {labbench.machine()}; 2 Debian 12 lab nodes, {args.repeat} interleaved rounds")
    print(f"{'playbook':<28}{'median s':>9}{'per task s':>11}")
    print(f"{'empty (start-up)':<28}{median['empty']:>9.2f}{'':>11}")
    per = {}
    for name in ("remote", "controller", "loop"):
        per[name] = (median[name] - median["empty"]) / TASKS
        label = f"{name} ({TASKS} {'iterations' if name == 'loop' else 'tasks'})"
        print(f"{label:<28}{median[name]:>9.2f}{per[name]:>11.2f}")
    if args.run:
        calls, local = counts(args.run)
        floor = calls * per["remote"] + local * per["controller"]
        print(
            f"run {args.run.name}: {calls:.0f} module calls and {local:.0f} controller-side "
            f"tasks per host cost at least {floor:.1f} s before any work (at the costs above)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
