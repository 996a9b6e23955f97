"""Host locks: a run that changes hosts never overlaps another gpustack run on the same hosts.

One lock file per host under `<state root>/locks/`, named after the host's connection address
(`ansible_host:ansible_port`, so two inventories naming one machine differently still collide).
A lock is an `fcntl.flock` held by the running `gpustack` process: the kernel releases it when
that process ends, however it ends (SIGKILL included), so the lock of a dead run is taken over
at once and never blocks forever. Who holds it (pid, command, start time, host, inventory) is
written beside it for the refusal message. Locks are all-or-nothing: a run gets every host it
needs or none. Read-only commands (status, doctor, plan, verify) take no lock.

Scope: the locks live on the controller. Two controllers driving one fleet are not serialised
by them (docs/fleet.md, "Concurrent runs").
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpustack import paths
from gpustack.errors import ExitCode, GpustackError


class HostsLocked(GpustackError):
    """Another gpustack run holds some of the hosts this run would change."""

    exit_code = ExitCode.BUSY


@dataclass(frozen=True)
class Holder:
    pid: int
    command: str
    started: str
    host: str
    inventory: str
    controller: str

    def describe(self) -> str:
        return (
            f"pid {self.pid} on {self.controller}, `{self.command}`, started {self.started}, "
            f"inventory {self.inventory}"
        )


def lock_dir() -> Path:
    return paths.state_root() / "locks"


def host_key(name: str, hostvars: dict[str, Any]) -> str:
    """The machine a host entry reaches: address and port (what two inventories share)."""
    address = str(hostvars.get("ansible_host") or name)
    port = str(hostvars.get("ansible_port") or 22)
    return re.sub(r"[^A-Za-z0-9._-]", "_", f"{address}:{port}")


def _read_holder(path: Path) -> Holder | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Holder(**{k: data[k] for k in Holder.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError):
        return None


class HostLocks:
    """Every lock of one run; released together (or by the kernel when the process dies)."""

    def __init__(self) -> None:
        self._files: list[Any] = []

    def release(self) -> None:
        for fh in self._files:
            with contextlib.suppress(OSError):
                Path(fh.name + ".json").unlink(missing_ok=True)
                fh.close()
        self._files = []

    def try_acquire(self, keys: dict[str, str], info: dict[str, Any]) -> list[Holder | str]:
        """Take every lock or none; returns the holders (or host names) of the locks refused."""
        root = lock_dir()
        root.mkdir(parents=True, exist_ok=True)
        busy: list[Holder | str] = []
        for key, host in sorted(keys.items()):
            path = root / f"{key}.lock"
            fh = open(path, "a+")  # noqa: SIM115 - held open for the run's lifetime
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.close()
                busy.append(_read_holder(Path(str(path) + ".json")) or host)
                continue
            self._files.append(fh)
            holder = {**info, "host": host}
            tmp = Path(f"{path}.json.{os.getpid()}")
            tmp.write_text(json.dumps(holder), encoding="utf-8")
            tmp.replace(Path(f"{path}.json"))
        if busy:
            self.release()
        return busy


def _run_info(command: str, inventory: Path) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "command": command,
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "inventory": str(inventory),
        "controller": socket.gethostname(),
    }


def refusal(busy: list[Holder | str]) -> HostsLocked:
    first = busy[0]
    if isinstance(first, Holder):
        hosts = ", ".join(h.host if isinstance(h, Holder) else h for h in busy)
        message = f"another gpustack run is changing {hosts}: {first.describe()}"
    else:
        message = f"another gpustack run is changing {', '.join(map(str, busy))}"
    return HostsLocked(
        message,
        "wait for it to finish, or add --wait to start when it has; a killed run's lock is "
        "released with it",
    )


@contextlib.contextmanager
def hold(
    inventory,
    command: str,
    wait: bool = False,
    poll: float = 1.0,
    on_wait: Callable[[list[Holder | str]], None] | None = None,
) -> Iterator[HostLocks]:
    """Lock the inventory's target hosts for the block; refuse (HostsLocked) or wait."""
    keys = {host_key(h, inventory.hostvars.get(h, {})): h for h in inventory.hosts}
    locks = HostLocks()
    info = _run_info(command, inventory.path)
    told = False
    while True:
        busy = locks.try_acquire(keys, info)
        if not busy:
            break
        if not wait:
            raise refusal(busy)
        if on_wait and not told:
            on_wait(busy)
            told = True
        time.sleep(poll)
    try:
        yield locks
    finally:
        locks.release()


def command_line(argv: list[str] | None = None) -> str:
    args = sys.argv if argv is None else argv
    return " ".join(["gpustack", *args[1:]])
