"""Kill-and-rerun on lab nodes: SIGKILL `gpustack install` (or uninstall, upgrade) at a chosen
task or a random moment, run it again, and check that every host converged.

A trial: put the hosts back to the state the chosen task changes (uninstall the layer it
belongs to), start the command, SIGKILL gpustack when the task starts on a host (ansible-runner
events in the run's artifacts; plus a random delay, to land inside or just after the task) or
at a random second, then:

* no ansible-playbook/ssh child of the killed run survives it (orphans: must be 0);
* `gpustack status` before the re-run, to show what the kill left (drift such as a lost restart);
* the re-run exits 0; a further run changes nothing (install: the converged fast path, and once
  per campaign `--full`); `gpustack status` shows no drift (which includes: containerd runs
  the configuration on its disk, with the nvidia runtime handler loaded; companions, holds);
* on each node: `dpkg --audit` empty, containerd active, the driver and toolkit packages held.

Prints one line per trial and `P/N converged`. Exit 0 only when all converged.

    python benchmarks/kill_rerun.py --inventory lab.ini --vars fixture-vars.json --count 24

Lab nodes only (podman containers named gpustack-<host>); the toolkit comes from the TEST
FIXTURE repository (tests/fixtures/lab_fixtures.py).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The driver's transaction call (the record, nvidia-persistenced's mask, the transaction, the
# unmask and enable, the holds and reads in one module run; in site.yml started in the
# background) and, in site.yml, the wait for it.
DRIVER_TRANSACTION = (
    "Install the driver packages at exactly that version"
    " (with nvidia-persistenced and the toolkit's), hold them"
)
DRIVER_JOIN = (
    "Install the driver packages at exactly that version (wait for the background transaction)"
)
HOLD_TOOLKIT = "Hold the toolkit packages (one call, after the dpkg lock)"
# (task name as ansible-runner reports it, the layer to reset before the trial)
KILL_POINTS = [
    # the archive components are written at the start of this call, then the lists refreshed
    (
        "Refresh the package lists (at most hourly; at once when sources changed; distro archive"
        " components first) and list the versions the sources offer",
        "driver",
    ),
    (DRIVER_TRANSACTION, "driver"),  # its pins and the sources' commit are in the same call
    # site.yml: the controller killed while containerd is wired and the transaction runs on
    (
        "Keep what existed, mark a containerd restart pending, write the nvidia runtime drop-in "
        "and the import (every other line kept)",
        "driver",
    ),
    (DRIVER_JOIN, "driver"),
    # skipped where the transaction call regenerated it at its end (a kill point all the same)
    ("Regenerate the initramfs without nouveau", "driver"),
    ("Write the repository source", "toolkit"),
    (DRIVER_TRANSACTION, "toolkit"),  # site.yml: the toolkit's packages go in with the driver's
    ("Install the toolkit packages at exactly that version", "toolkit"),  # driver skipped by tags
    (HOLD_TOOLKIT, "toolkit"),
    (
        "Keep what existed, mark a containerd restart pending, write the nvidia runtime drop-in "
        "and the import (every other line kept)",
        "runtime",
    ),
    ("Check the new effective configuration", "runtime"),
    (
        "Restart containerd (effective configuration changed, or not loaded yet), wait until it "
        "answers",
        "runtime",
    ),
    ("Record the converged stamps of the host roles (one call)", "runtime"),
]
UNINSTALL_POINTS = [
    ("Restore the container runtime configuration", "installed"),
    ("Take the import out of the main configuration (the original back when untouched since)",
     "installed"),
    ("Restart containerd on its original configuration (when changed), wait until it answers",
     "installed"),
    ("Remove the toolkit packages", "installed"),
    ("Remove the driver packages", "installed"),
]  # fmt: skip
UPGRADE_POINTS = [
    (DRIVER_TRANSACTION, "old"),  # its pin is written in the same call, before the transaction
]
LAYERS = {"driver": "driver,toolkit,runtime", "toolkit": "toolkit,runtime", "runtime": "runtime"}
DRIVER_HELD = {"nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "nvidia-persistenced"}
TOOLKIT_HELD = {"nvidia-container-toolkit", "nvidia-container-toolkit-base", "libnvidia-container1"}


@dataclass
class Trial:
    command: str
    point: str
    killed_after_s: float = 0.0
    killed: bool = False
    orphans: int = -1
    status_before: list[str] = field(default_factory=list)
    rerun_rc: int = -1
    again_changed: int = -1
    again_rc: int = -1
    status_rc: int = -1
    node_problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def converged(self) -> bool:
        return (
            self.rerun_rc == 0
            and self.again_rc == 0
            and self.again_changed == 0
            and self.status_rc in (0, -2)
            and self.orphans == 0
            and not self.node_problems
        )


class Lab:
    def __init__(self, inventory: Path, varsfile: Path, state: Path, extra: list[str],
                 expect: tuple[str, ...] = ("driver", "toolkit", "runtime")):  # fmt: skip
        self.inventory = inventory
        self.varsfile = varsfile
        self.state = state
        self.extra = extra
        self.expect = expect  # the layers the lab is meant to have (CI leaves the driver out)
        from gpustack.ansible.inventory import load_inventory

        self.hosts = load_inventory(inventory).hosts

    def cli(self, *args: str, state: Path | None = None, timeout: int = 1800):
        env = {**os.environ, "GPUSTACK_STATE_DIR": str(state or self.state)}
        cmd = [sys.executable, "-m", "gpustack", *args]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)

    def start(self, *args: str, state: Path) -> subprocess.Popen:
        env = {**os.environ, "GPUSTACK_STATE_DIR": str(state)}
        return subprocess.Popen(
            [sys.executable, "-m", "gpustack", *args],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def install_args(self, *more: str) -> list[str]:
        return ["install", str(self.inventory), "-e", f"@{self.varsfile}", *self.extra, *more]

    def node(self, host: str, script: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["podman", "exec", f"gpustack-{host}", "sh", "-c", script],
            capture_output=True,
            text=True,
            check=False,
        )

    def json_run(self, *args: str, state: Path | None = None) -> tuple[int, dict]:
        proc = self.cli(*args, "--output", "json", state=state)
        try:
            return proc.returncode, json.loads(proc.stdout)
        except ValueError:
            return proc.returncode, {"error": (proc.stdout + proc.stderr)[-2000:]}


def wait_for_task(state: Path, task: str, proc: subprocess.Popen, timeout: float) -> bool:
    """True when `task` started on some host of a run under `state` (ansible-runner events)."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        for path in glob.glob(str(state / "runs/*/artifacts/*/job_events/*.json")):
            if path in seen:
                continue
            seen.add(path)
            with contextlib.suppress(OSError, ValueError):
                event = json.loads(Path(path).read_text())
                if (event.get("event") in ("runner_on_start", "playbook_on_task_start")
                        and (event.get("event_data") or {}).get("task") == task):  # fmt: skip
                    return True
        time.sleep(0.05)
    return False


def children_of(state: Path) -> list[int]:
    """Processes still running for a run under `state` (ansible-playbook, its workers, ssh)."""
    found = []
    for path in glob.glob("/proc/[0-9]*/cmdline"):
        with contextlib.suppress(OSError):
            if str(state).encode() in Path(path).read_bytes():
                found.append(int(path.split("/")[2]))
    return [p for p in found if p != os.getpid()]


def node_checks(lab: Lab, command: str) -> list[str]:
    problems = []
    for host in lab.hosts:
        audit = lab.node(host, "dpkg --audit")
        if audit.stdout.strip() or audit.returncode not in (0,):
            problems.append(f"{host}: dpkg --audit: {audit.stdout.strip()[:200]}")
        active = lab.node(host, "systemctl is-active containerd").stdout.strip()
        if active != "active":
            problems.append(f"{host}: containerd {active}")
        holds = set(lab.node(host, "apt-mark showhold").stdout.split())
        if command in ("install", "upgrade"):
            wanted = (DRIVER_HELD if "driver" in lab.expect else set()) | (
                TOOLKIT_HELD if "toolkit" in lab.expect else set()
            )
            missing = wanted - holds
            if missing:
                problems.append(f"{host}: not held: {', '.join(sorted(missing))}")
            pending = lab.node(host, "test -e /var/lib/gpustack/containerd.restart-pending")
            if pending.returncode == 0:
                problems.append(f"{host}: containerd restart still pending")
            if "driver" in lab.expect:
                # masked (runtime) only for the driver's apt transaction: a kill inside it leaves
                # the mask, and the re-run must lift it
                state = lab.node(host, "systemctl is-enabled nvidia-persistenced").stdout.strip()
                if state != "enabled":
                    problems.append(f"{host}: nvidia-persistenced {state or 'unknown'}")
        elif holds & (DRIVER_HELD | TOOLKIT_HELD):
            problems.append(f"{host}: still held after uninstall: {sorted(holds)}")
    return problems


def reset(lab: Lab, command: str, layer: str, upgrade_from: str, fresh_lists=False) -> None:
    if command == "install":
        lab.cli("uninstall", str(lab.inventory), "--components", LAYERS[layer], "--yes")
        if fresh_lists and layer != "runtime":
            # package lists without the removed sources, as on a fresh node: a kill between
            # writing a source and refreshing the lists then shows whether the re-run recovers
            for host in lab.hosts:
                lab.node(host, "apt-get update -qq")
    elif command == "uninstall":
        lab.cli(*lab.install_args())
    elif command == "upgrade":
        lab.cli(*lab.install_args("-e", f"nvidia_driver_version={upgrade_from}"))


DRIFT_OF = {"driver": ("driver", "companion"), "toolkit": ("toolkit",)}


def status_drift(lab: Lab, state: Path, extra: list[str]) -> tuple[int, list[str]]:
    """`gpustack status` exit code and drift, leaving out layers the lab is not meant to have."""
    rc, doc = lab.json_run("status", str(lab.inventory), *extra, state=state)
    ignored = tuple(p for layer, prefixes in DRIFT_OF.items() if layer not in lab.expect
                    for p in prefixes)  # fmt: skip
    drift = [f"{h}: {d}" for h, items in (doc.get("drift") or {}).items() for d in items
             if not (ignored and d.startswith(ignored))]  # fmt: skip
    if rc == 5 and not drift:
        rc = 0  # the only drift is in layers this lab leaves out
    return rc, drift


def trial(lab: Lab, command: str, point: str, layer: str, delay: float, args) -> Trial:
    started = time.monotonic()
    result = Trial(command=command, point=point)
    reset(lab, command, layer, args.upgrade_from, getattr(args, "fresh_lists", False))
    state = Path(tempfile.mkdtemp(prefix="kill-", dir=lab.state))
    if command == "install":
        argv = lab.install_args()
        again_argv = lab.install_args()
        status_extra = ["-e", f"@{lab.varsfile}"]
    elif command == "uninstall":
        argv = ["uninstall", str(lab.inventory), "--components", "driver,toolkit,runtime", "--yes"]
        again_argv = argv
        status_extra = []
    else:
        argv = ["upgrade", str(lab.inventory), "--driver-version", args.upgrade_to, "--yes",
                "--max-unavailable", "1", "-e", f"@{lab.varsfile}"]  # fmt: skip
        again_argv = [*argv, "--resume"]
        status_extra = ["-e", f"@{lab.varsfile}", "-e", f"nvidia_driver_version={args.upgrade_to}"]
    proc = lab.start(*argv, state=state)
    t0 = time.monotonic()
    if point.startswith("random"):
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=delay)
        hit = proc.poll() is None
    else:
        hit = wait_for_task(state, point, proc, timeout=900)
        if hit and delay:
            time.sleep(delay)
    result.killed = hit and proc.poll() is None
    result.killed_after_s = round(time.monotonic() - t0, 1)
    if result.killed:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while children_of(state) and time.monotonic() < deadline:
        time.sleep(0.2)
    result.orphans = len(children_of(state))
    if command != "uninstall":
        _, result.status_before = status_drift(lab, state, status_extra)
    rerun = again_argv if command == "upgrade" else argv
    result.rerun_rc, doc = lab.json_run(*rerun, state=state)
    if result.rerun_rc != 0:
        failures = {h: v.get("failures") for h, v in (doc.get("hosts") or {}).items()}
        result.node_problems.append(f"re-run failed: {json.dumps(failures or doc)[:600]}")
    if command == "upgrade":
        # resumed to the end: a further install of the target version changes nothing
        again = lab.install_args("-e", f"nvidia_driver_version={args.upgrade_to}")
    else:
        again = again_argv
    result.again_rc, doc = lab.json_run(*again, state=state)
    # gpustack's own bookkeeping (a converged stamp written for the first time after an upgrade,
    # which runs the driver role without stamps) is not a change of the host
    changed = [
        f"{name}: {c.get('role', '')} : {c.get('task', '')}"
        for name, h in (doc.get("hosts") or {}).items()
        for c in h.get("changes") or []
        if not str(c.get("task", "")).startswith("Record the converged stamp")
    ]
    result.again_changed = len(changed)
    if changed:  # what the further run still changed, by name
        result.node_problems.append("further run changed " + "; ".join(changed))
    if command == "uninstall":
        result.status_rc = -2  # uninstalled hosts drift by definition
    else:
        result.status_rc, drift = status_drift(lab, state, status_extra)
        if drift:
            result.node_problems += drift
    result.node_problems += node_checks(lab, command)
    result.seconds = round(time.monotonic() - started, 1)
    return result


def plan(args) -> list[tuple[str, str, float]]:
    rng = random.Random(args.seed)
    points = {"install": KILL_POINTS, "uninstall": UNINSTALL_POINTS, "upgrade": UPGRADE_POINTS}
    chosen = [p for p in points[args.command] if not args.only or any(o in p[0] for o in args.only)]
    out = []
    for i in range(args.count):
        if args.random_every and (i + 1) % args.random_every == 0:
            out.append((f"random kill at {args.random_max:.0f}s max", args.random_layer, 0.0))
            continue
        name, layer = chosen[i % len(chosen)]
        out.append((name, layer, round(rng.uniform(0, args.max_delay), 2)))
    rng.shuffle(out)
    return [
        (p, layer, rng.uniform(3, args.random_max) if p.startswith("random") else d)
        for p, layer, d in out
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--inventory", required=True, type=Path)
    parser.add_argument("--vars", required=True, type=Path, help="fixture -e vars file")
    parser.add_argument("--command", choices=("install", "uninstall", "upgrade"), default="install")
    parser.add_argument("--count", type=int, default=len(KILL_POINTS))
    parser.add_argument("--only", action="append", help="only kill points containing this text")
    parser.add_argument("--random-every", type=int, default=0, help="every Nth kill at random")
    parser.add_argument("--random-max", type=float, default=150.0)
    parser.add_argument("--random-layer", choices=sorted(LAYERS), default="driver")
    parser.add_argument(
        "--max-delay", type=float, default=1.5, help="random delay after a task starts"
    )
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--upgrade-from", default="535.261.03-1")
    parser.add_argument("--upgrade-to", default="535.309.01-0+deb12u1")
    parser.add_argument(
        "--skip-tags", default="", help="passed to install (CI: runtime layer only)"
    )
    parser.add_argument(
        "--fresh-lists",
        action="store_true",
        help="after a reset, refresh the package lists (as a fresh node's lists are)",
    )
    parser.add_argument("--report", type=Path)
    args = parser.parse_args(argv)
    state = Path(tempfile.mkdtemp(prefix="gpustack-kill-rerun-"))
    extra = ["--skip-tags", args.skip_tags] if args.skip_tags else []
    lab = Lab(args.inventory.resolve(), args.vars.resolve(), state, extra)
    trials = []
    start = time.monotonic()
    for point, layer, delay in plan(args):
        one = trial(lab, args.command, point, layer, delay, args)
        trials.append(one)
        mark = "converged" if one.converged else "NOT CONVERGED"
        where = f"+{delay:.1f}s" if not point.startswith("random") else ""
        print(f"{mark:13} {args.command} killed={'yes' if one.killed else 'no (ended first)'} "
              f"at {point!r}{where} after {one.killed_after_s}s; orphans {one.orphans}; "
              f"status before re-run: {len(one.status_before)} drift; re-run rc {one.rerun_rc}; "
              f"again changed {one.again_changed}; {one.seconds}s", flush=True)  # fmt: skip
        for line in one.status_before:
            if "containerd" in line:
                print(f"              before re-run: {line}", flush=True)
        for problem in one.node_problems:
            print(f"              problem: {problem}", flush=True)
    if args.command == "install" and trials:
        rc, doc = lab.json_run(*lab.install_args("--full"))
        full_changed = sum(h.get("changed", 0) for h in (doc.get("hosts") or {}).values())
        print(f"final install --full: rc {rc}, changed {full_changed}")
    converged = sum(t.converged for t in trials)
    killed = sum(t.killed for t in trials)
    print(f"{converged}/{len(trials)} converged ({killed} killed mid-run, "
          f"{time.monotonic() - start:.0f}s)")  # fmt: skip
    if args.report:
        args.report.write_text(json.dumps([asdict(t) for t in trials], indent=2))
    return 0 if converged == len(trials) else 1


if __name__ == "__main__":
    raise SystemExit(main())
