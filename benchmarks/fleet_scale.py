"""Benchmark: what each gpustack command costs on N lab nodes, as a ratio to `ansible -m ping`.

Brings up N fresh Debian 12 lab nodes (default 12; lab `i18f-fs` unless --lab), prepared as the
lab tests prepare them (Debian's containerd as the user's runtime, the stand-in toolkit
repository and busybox image of tests/fixtures/lab_fixtures.py; the nodes share one apt cache),
then times over all of them, in this order:

  ping       `ansible gpu_nodes -m ansible.builtin.ping -f N` (the floor: one module call per
             host over the same SSH settings); median of --repeat
  doctor     `gpustack doctor` (read-only preflight); median of --repeat
  install    the first `gpustack install`, Debian's driver at OLD (535.261.03-1)
  no-op      `gpustack install` again (nothing to change); median of --repeat
  status     `gpustack status` (host side; no cluster); median of --repeat
  upgrade    `gpustack upgrade --driver-version NEW` (535.309.01-0+deb12u1), rolling,
             --max-parallel/--max-unavailable K (default 4), host-only

and prints each in seconds, as a ratio to ping and as seconds per node (targets on 12 nodes:
no-op install <= 2x ping, status <= 2x ping). --profile prints the top tasks of the first
install, the no-op install and status from ansible-runner's events (benchmarks/run_profile.py).
The lab is torn down at the end (--keep leaves it up).

    python benchmarks/fleet_scale.py [--nodes 12] [--repeat 3] [--parallel 4] [--keep] [--profile]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import labbench, run_profile
from tests.fixtures import lab_fixtures

LAB = "i18f-fs"
OLD, NEW = "535.261.03-1", "535.309.01-0+deb12u1"


def prepare(containers: list[str], varsfile: Path) -> Path:
    """lab_fixtures.prepare, the per-node steps side by side (12 nodes one after the other take
    minutes of apt that are not what this benchmark measures)."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lab_fixtures.install_containerd, containers))
    repo = lab_fixtures.publish(containers)
    with ThreadPoolExecutor(max_workers=4) as pool:
        list(pool.map(lab_fixtures.import_image, containers))
    varsfile.write_text(json.dumps(lab_fixtures.extra_vars(repo), indent=2))
    return varsfile


def timed(name: str, args: list[str], env: dict, repeat: int = 1, check=None, verify=None):
    """Seconds of each run; check: a non-zero exit that is fine; verify: what is wrong, or None."""
    out = []
    for _ in range(repeat):
        seconds, proc = labbench.run(args, env=env)
        if proc.returncode != 0 and not (check and check(proc)):
            labbench.must(proc, name)
        if verify and (problem := verify(proc)):
            sys.exit(f"{name}: {problem}")
        out.append(seconds)
        print(f"  {name}: {seconds:.1f} s", flush=True)
    return out


def newest_run(state: Path, stem: str) -> Path:
    return sorted(p for p in (state / "runs").iterdir() if f"-{stem}-" in p.name)[-1]


def fast_path_everywhere(proc) -> str | None:
    """A no-op install's figure means something only if every host took the fast path."""
    hosts = json.loads(proc.stdout)["hosts"]
    full = sorted(host for host, result in hosts.items() if not result.get("converged"))
    return f"full play on {', '.join(full)}" if full else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--parallel", type=int, default=4, help="upgrade: nodes at once")
    parser.add_argument("--keep", action="store_true", help="leave the lab up")
    parser.add_argument("--profile", action="store_true", help="print the top tasks")
    parser.add_argument("--read-only", action="store_true",
                        help="only ping, doctor and status (no install, no upgrade)")  # fmt: skip
    parser.add_argument("--no-upgrade", action="store_true", help="leave out the rolling upgrade")
    parser.add_argument("--lab", default=LAB, help=f"lab name (default {LAB})")
    args = parser.parse_args()
    lab, n = args.lab, args.nodes
    inventory = Path(f"/tmp/gpustack-{lab}.ini")
    state = Path(tempfile.mkdtemp(prefix=f"gpustack-{lab}-state-"))
    env = {"GPUSTACK_STATE_DIR": str(state)}
    cli = [*labbench.GPUSTACK]
    times: dict[str, float] = {}
    try:
        labbench.lab_down(lab)
        up = labbench.lab_up(lab, n, inventory)
        varsfile = prepare(labbench.containers(lab, n), inventory.with_suffix(".vars.json"))
        print(f"lab up ({n} nodes): {up:.1f} s; fixtures prepared", flush=True)
        ping = [labbench.ANSIBLE, "-i", str(inventory), "gpu_nodes", "-m", "ansible.builtin.ping",
                "-f", str(n)]  # fmt: skip
        timed("warm-up ping", ping, env)
        vars_ = ["-e", f"@{varsfile}", "-e", f"nvidia_driver_version={OLD}"]
        drift = lambda proc: proc.returncode == 5  # noqa: E731 - status: exit 5 is drift
        times["ansible -m ping"] = statistics.median(timed("ping", ping, env, args.repeat))
        problems = lambda proc: proc.returncode == 3  # noqa: E731 - doctor: 3 is problems found
        doctor = [*cli, "doctor", str(inventory), *vars_]
        times["doctor"] = statistics.median(timed("doctor", doctor, env, args.repeat, problems))
        if args.read_only:
            times["status"] = statistics.median(
                timed("status", [*cli, "status", str(inventory), *vars_], env, args.repeat, drift)
            )
            status = newest_run(state, "status")
            return report(times, n, args.profile and [status])
        times["first install"] = timed("first install", [*cli, "install", str(inventory), *vars_],
                                       env)[0]  # fmt: skip
        first = newest_run(state, "site")
        install = [*cli, "install", str(inventory), *vars_, "--output", "json"]
        times["no-op install"] = statistics.median(
            timed("no-op install", install, env, args.repeat, verify=fast_path_everywhere)
        )
        noop = newest_run(state, "site")  # the converged check runs inside site.yml
        times["status"] = statistics.median(
            timed("status", [*cli, "status", str(inventory), *vars_], env, args.repeat, drift)
        )
        status = newest_run(state, "status")
        if args.no_upgrade:
            return report(times, n, args.profile and [first, noop, status])
        k = str(args.parallel)
        times[f"rolling upgrade (k={k})"] = timed(
            "upgrade",
            [*cli, "upgrade", str(inventory), "--driver-version", NEW, "--max-parallel", k,
             "--max-unavailable", k, "--yes", "-e", f"@{varsfile}"],
            env,
        )[0]  # fmt: skip
    finally:
        if not args.keep:
            labbench.lab_down(lab)
    return report(times, n, args.profile and [first, noop, status])


def report(times: dict[str, float], n: int, profile) -> int:
    floor = times["ansible -m ping"]
    print()
    print(f"machine: {labbench.machine()}; {n} Debian 12 lab nodes")
    print(f"{'command':<26} {'seconds':>8} {'x ping':>7} {'s/node':>7}")
    for name, seconds in times.items():
        print(f"{name:<26} {seconds:8.1f} {seconds / floor:7.1f} {seconds / n:7.2f}")
    for name in ("no-op install", "status"):
        if name not in times:
            continue
        ratio = times[name] / floor
        print(f"target {name} <= 2x ping: {ratio:.1f} ({'met' if ratio <= 2 else 'MISSED'})")
    for path in profile or []:
        run_profile.report(path, 15)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
