"""Shared pieces of the lab benchmarks: run a command and time it, SSH to a lab node, lab up/down.

The figures these benchmarks print are ratios against a baseline measured in the same run (a
shared machine makes absolute seconds noisy).

Importing this module gives the benchmark's labs an apt archive cache of their own
(GPUSTACK_LAB_CACHE, unless set: ~/.cache/$GPUSTACK_BENCH_CACHE_NAME, default gpustack-bench,
seeded with hard links to the packages of the shared lab cache): lab nodes take a lock on their
cache around every apt-get (see gpustack/lab/images.py), and on a machine where other labs
install packages a shared lock would time their apt runs, not this benchmark's.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _private_cache() -> None:
    if os.environ.get("GPUSTACK_LAB_CACHE"):
        return
    shared = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "gpustack"
    own = shared.with_name(os.environ.get("GPUSTACK_BENCH_CACHE_NAME") or "gpustack-bench")
    for sub in ("apt-archives", "fixtures"):
        (own / sub).mkdir(parents=True, exist_ok=True)
    for deb in (shared / "apt-archives").glob("*.deb"):
        target = own / "apt-archives" / deb.name
        if not target.exists():
            try:
                os.link(deb, target)
            except FileExistsError:
                pass  # another process seeding the same cache (pytest-xdist workers import this)
            except OSError:
                shutil.copy2(deb, target)
    os.environ["GPUSTACK_LAB_CACHE"] = str(own)


_private_cache()
GPUSTACK = [sys.executable, "-m", "gpustack"]
ANSIBLE = str(Path(sys.executable).parent / "ansible")


def run(args: list[str], timeout: int = 3600, env: dict | None = None):
    """(seconds, CompletedProcess)."""
    start = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env={**os.environ, **(env or {})})  # fmt: skip
    return time.perf_counter() - start, proc


def must(proc: subprocess.CompletedProcess, what: str) -> None:
    if proc.returncode != 0:
        sys.exit(
            f"{what} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )


def inventory_ssh(inventory: Path) -> dict[str, list[str]]:
    """host -> the ssh command line (without the remote command) the lab inventory describes."""
    lines = inventory.read_text(encoding="utf-8").splitlines()
    key = next(line.split("=", 1)[1] for line in lines
               if line.startswith("ansible_ssh_private_key_file="))  # fmt: skip
    out = {}
    for line in lines:
        if "ansible_port=" in line and not line.startswith("#"):
            host, port = line.split()[0], line.split("ansible_port=")[1].split()[0]
            out[host] = ["ssh", "-i", key, "-p", port, "-o", "StrictHostKeyChecking=no",
                         "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                         "root@127.0.0.1"]  # fmt: skip
    return out


def on_hosts(ssh: dict[str, list[str]], hosts: list[str], script: str, timeout: int = 3600):
    """Run `script` on every host at once over SSH; (seconds until the last ended, {host: proc})."""
    start = time.perf_counter()
    procs = {h: subprocess.Popen([*ssh[h], script], stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for h in hosts}  # fmt: skip
    out = {}
    for host, proc in procs.items():
        stdout, _ = proc.communicate(timeout=timeout)
        out[host] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, "")
    return time.perf_counter() - start, out


def lab_up(lab: str, nodes: int, inventory: Path) -> float:
    seconds, proc = run([*GPUSTACK, "lab", "up", "--name", lab, "--nodes", str(nodes),
                         "--os", "debian12", "--inventory", str(inventory)])  # fmt: skip
    must(proc, "lab up")
    return seconds


def lab_down(lab: str) -> None:
    run([*GPUSTACK, "lab", "down", "--name", lab])


def containers(lab: str, count: int) -> list[str]:
    return [f"gpustack-{lab}-node{i}" for i in range(1, count + 1)]


def machine() -> str:
    """This machine, as the benchmarks print it: name, CPUs, memory, load average now."""
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{platform.node()} {os.cpu_count()} CPUs, {memory:.0f} GiB, "
            f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
