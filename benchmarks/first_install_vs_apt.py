"""Benchmark: a first `gpustack install` on 2 fresh lab nodes vs. the apt floor on 2 others.

Brings up 4 fresh Debian 12 lab nodes (lab `i18f-fi` unless --lab), each prepared as the lab
tests prepare them (Debian's containerd as the user's runtime, the stand-in toolkit repository
and busybox image of tests/fixtures/lab_fixtures.py). Then:

1. `gpustack install` on nodes 1-2 (the distro driver, the stand-in toolkit, containerd wired),
   timed from the command line to its exit;
2. the apt floor on nodes 3-4, both at once over SSH: enable the same sources gpustack enabled
   (contrib, non-free, non-free-firmware on the three bookworm suites; the toolkit repository
   with its key), `apt-get update`, and one `apt-get install --no-install-recommends` of exactly
   the packages gpustack's run added on node 1 (held ones included), at the same versions;

and prints both times and the ratio (target <= 1.3), with the top tasks of gpustack's run from
ansible-runner's job events (benchmarks/run_profile.py), and gpustack's time outside its
apt tasks (transactions and the lists' refresh, run_profile.APT_ACTIONS: the part that does not
depend on how long apt-get and dpkg take). The apt
cache is shared by all lab nodes (as `gpustack lab up` sets it): the packages the floor installs
were fetched by gpustack's run; a round whose gpustack run fetched any (a cache just emptied)
timed downloads the floor did not make, so it is not counted and runs again once on fresh nodes
(`counted_rounds`). --rounds N repeats on fresh nodes and prints the median. The lab is torn
down at the end (--keep leaves it).

gpustack runs `ansible-playbook` as ansible-core ships it (through ansible-runner), with the
settings of gpustack/ansible/settings.py; the round prints ansible-core's and Python's versions.

    python benchmarks/first_install_vs_apt.py [--rounds 1] [--keep] [--lab NAME] [--top 15]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import labbench, run_profile
from gpustack.lab.images import apt_cache_dir
from tests.fixtures import lab_fixtures

LAB = "i18f-fi"
# Installed packages, held ("hi") or not ("ii"): gpustack holds the driver and toolkit packages,
# and the floor must install them too (until 2026-11-26 this read "^ii" and the floor left out
# the 9 held packages, the driver's own among them).
INSTALLED = (
    "dpkg-query -W -f='${Package}=${Version} ${db:Status-Abbrev}\\n'"
    " | awk '$2 ~ /^[ih]i/ {print $1}'"
)
# The sources gpustack enables, by hand: the archive components of the distro driver source and
# the toolkit repository (signed, key from the same file).
FLOOR = """set -e
export DEBIAN_FRONTEND=noninteractive
t0=$(date +%s.%N)
sed -i 's/^Components: main$/Components: main contrib non-free non-free-firmware/' \
  /etc/apt/sources.list.d/debian.sources
gpg --dearmor < {repo}/gpgkey > /usr/share/keyrings/floor-toolkit.gpg
echo "deb [signed-by=/usr/share/keyrings/floor-toolkit.gpg] \
file:{repo}/stable/deb/$(dpkg --print-architecture) /" > /etc/apt/sources.list.d/floor-toolkit.list
t1=$(date +%s.%N)
apt-get update -qq
t2=$(date +%s.%N)
apt-get install -y -qq --no-install-recommends {packages} >/dev/null
echo "floor-steps $t0 $t1 $t2 $(date +%s.%N)"
"""


# Debian's nvidia-persistenced: its package scripts start the daemon before the loader knows
# libnvidia-cfg.so.1; now and then the failing daemon's child never exits and systemd waits out
# its 90 s stop timeout (gpustack masks the unit for the transaction; the floor does not).
HANG = (
    "journalctl -q -o cat -u nvidia-persistenced.service"
    " | grep -c \"State 'stop-sigterm' timed out\" || true"
)


def persistenced_hangs(ssh: dict[str, list[str]], hosts: list[str]) -> list[str]:
    """The hosts where the package scripts' start of nvidia-persistenced hung (90 s lost)."""
    hung = []
    for host in hosts:
        _, proc = labbench.run([*ssh[host], HANG])
        if proc.stdout.strip() not in ("", "0"):
            hung.append(host)
    return hung


def floor_steps(outputs: dict[str, str]) -> dict[str, tuple[float, float, float, float]]:
    """Per floor host, from its `floor-steps` line: (sources, update, install) seconds and the
    end of its install, the clock starting at the first host's start (the nodes share the
    machine's clock)."""
    marks = {}
    for host, text in outputs.items():
        line = next(line for line in text.splitlines() if line.startswith("floor-steps "))
        marks[host] = [float(value) for value in line.split()[1:]]
    start = min(m[0] for m in marks.values())
    return {h: (m[1] - m[0], m[2] - m[1], m[3] - m[2], m[3] - start) for h, m in marks.items()}


def print_floor_steps(outputs: dict[str, str]) -> None:
    """The floor's steps per node. Lab nodes take turns on the shared apt cache's lock, so the
    second node's install includes its wait for the first; its own share starts at the first
    one's end."""
    steps = floor_steps(outputs)
    own = run_profile.turns({h: (step[3] - step[2], step[3]) for h, step in steps.items()})
    for host, (sources, update, install, end) in sorted(steps.items(), key=lambda kv: kv[1][3]):
        print(
            f"  {host}: sources {sources:.1f} s, apt-get update {update:.1f} s, apt-get install "
            f"{install:.1f} s (its own turn {own[host]:.1f} s), done at {end:.1f} s"
        )


def print_first_install_start(state: Path, began: float, floor: dict[str, str]) -> None:
    """When the first `apt-get install` began: gpustack's (the transaction call's steps, on the
    nodes' clock, which is the machine's) from the CLI's start, the floor's from its start."""
    starts = [
        start
        for run_dir in sorted((state / "runs").iterdir())
        for steps in run_profile.transaction_steps(run_profile.load(run_dir)[0]).values()
        for name, start, _ in steps
        if name == "apt-get"
    ]
    steps = floor_steps(floor)
    floor_at = min(update + sources for sources, update, _, _ in steps.values())
    ours = f"{min(starts) - began:.1f} s after the CLI started" if starts else "not timed"
    print(
        f"  the first apt-get install began: gpustack's {ours}, the floor's {floor_at:.1f} s "
        "after its start"
    )


def installed(ssh: list[str]) -> set[str]:
    _, proc = labbench.run([*ssh, INSTALLED])
    labbench.must(proc, "dpkg-query")
    return set(proc.stdout.split())


def one_round(lab: str, top: int) -> tuple[float, float, float, int]:
    """(gpustack seconds, floor seconds, gpustack seconds outside apt tasks, packages fetched)."""
    inventory = Path(f"/tmp/gpustack-{lab}.ini")
    state = Path(tempfile.mkdtemp(prefix=f"gpustack-{lab}-state-"))
    env = {"GPUSTACK_STATE_DIR": str(state)}
    print(f"  controller: {controller()}")
    labbench.lab_down(lab)  # fresh nodes every round
    labbench.lab_up(lab, 4, inventory)
    containers = labbench.containers(lab, 4)
    varsfile = lab_fixtures.prepare(containers, inventory.with_suffix(".vars.json"))
    ssh = labbench.inventory_ssh(inventory)
    hosts = sorted(ssh)
    ours, floor_hosts = hosts[:2], hosts[2:]
    before = installed(ssh[ours[0]])
    cached = set(apt_cache_dir().glob("*.deb"))
    began = time.time()
    seconds, proc = labbench.run(
        [*labbench.GPUSTACK, "install", str(inventory), "-l", ",".join(ours), "-e", f"@{varsfile}",
         "--output", "json"], env=env,
    )  # fmt: skip
    labbench.must(proc, "gpustack install")
    fetched = len(set(apt_cache_dir().glob("*.deb")) - cached)
    doc = json.loads(proc.stdout)
    changed = doc["summary"]["changed"]
    print(f"gpustack install on {', '.join(ours)}: {seconds:.1f} s "
          f"(changed {changed}, packages fetched into the cache: {fetched})")  # fmt: skip
    added = sorted(installed(ssh[ours[0]]) - before)
    script = FLOOR.format(repo=lab_fixtures.REPO_IN_NODE, packages=" ".join(added))
    floor_s, procs = labbench.on_hosts(ssh, floor_hosts, script)
    for host, done in procs.items():
        labbench.must(done, f"apt floor on {host}")
    outputs = {host: done.stdout for host, done in procs.items()}
    print_floor_steps(outputs)
    print_first_install_start(state, began, outputs)
    floor_added = sorted(installed(ssh[floor_hosts[0]]) - before)
    differs = sorted(set(floor_added) ^ set(added))
    same = "the same set" if not differs else f"{len(floor_added)}, differing in {differs}"
    print(f"apt floor on {', '.join(floor_hosts)}: {floor_s:.1f} s "
          f"({len(added)} packages; floor node added {same})")  # fmt: skip
    for host in persistenced_hangs(ssh, hosts):
        print(f"WARNING: {host}: nvidia-persistenced's start by its package scripts hung until "
              "systemd's 90 s stop timeout (Debian packaging race): this round's time is not "
              "comparable")  # fmt: skip
    # The CLI's time outside its playbooks' apt tasks: what gpustack itself adds to package work.
    outside = seconds - sum(
        run_profile.report(run_dir, top) for run_dir in sorted((state / "runs").iterdir())
    )
    return seconds, floor_s, outside, fetched


def controller() -> str:
    """What runs the playbooks: ansible-core's and Python's versions."""
    from ansible.release import __version__

    return f"ansible-core {__version__}, Python {platform.python_version()}"


def counted_rounds(rounds: int, one: Callable[[], tuple[float, float, float, int]]) -> list:
    """`rounds` measured rounds of `one`. A round whose gpustack run fetched packages into the
    cache timed downloads the floor then did not make (it finds them there): it is not counted
    and is run again once on fresh nodes, with the cache now holding them. (The first round on a
    machine whose lab cache was just emptied, as after a reboot, fetched 59 packages.)"""
    measured: list = []
    retried = False
    while len(measured) < rounds:
        print(f"round {len(measured) + 1}/{rounds}")
        result = one()
        if result[3] and not retried:
            retried = True
            print(f"  not counted: gpustack's run fetched {result[3]} packages the floor did "
                  "not download; the round runs again with them in the cache")  # fmt: skip
            continue
        measured.append(result)
    return measured


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--keep", action="store_true", help="leave the lab up")
    parser.add_argument("--lab", default=LAB, help=f"lab name (default {LAB})")
    parser.add_argument("--top", type=int, default=15, help="tasks of the profile to print")
    args = parser.parse_args()
    try:
        measured = counted_rounds(args.rounds, lambda: one_round(args.lab, args.top))
    finally:
        if not args.keep:
            labbench.lab_down(args.lab)
    ours, floors, outside = ([m[i] for m in measured] for i in range(3))
    install_s, floor_s = statistics.median(ours), statistics.median(floors)
    ratio = install_s / floor_s
    print(f"first install: median {install_s:.1f} s ({', '.join(f'{s:.1f}' for s in ours)})")
    print(f"apt floor:     median {floor_s:.1f} s ({', '.join(f'{s:.1f}' for s in floors)})")
    others = ", ".join(f"{s:.1f}" for s in outside)
    print(f"first install outside its apt tasks (CLI, playbook starts, all other tasks): median "
          f"{statistics.median(outside):.1f} s ({others})")  # fmt: skip
    print(f"ratio first install / apt floor: {ratio:.2f} "
          f"(target <= 1.3: {'met' if ratio <= 1.3 else 'MISSED'})")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
