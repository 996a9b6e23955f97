"""Children die with the controller: ansible-playbook runs under this guard.

ansible-runner starts its command in a new session on a pty and ignores SIGHUP, so a
`gpustack` killed with SIGKILL used to leave `ansible-playbook`, its forked workers and their
`ssh` clients running and changing hosts. gpustack therefore asks ansible-runner to start this
guard instead of ansible-playbook (runner.py, `binary=`). The guard:

* leads the process group of the run (ansible-runner's pty makes it a session leader; its
  children — ansible-playbook, the workers, ssh — stay in that group);
* asks the kernel for SIGTERM when its parent dies (Linux `PR_SET_PDEATHSIG`) and, everywhere,
  polls its parent pid, which changes when the parent dies, SIGKILL included;
* on either, or on SIGTERM/SIGINT/SIGHUP, stops the whole group: SIGTERM, then SIGKILL after
  a grace period, so no orphan keeps changing a host;
* otherwise exits with ansible-playbook's exit code.

Usage (by runner.py only): python -m gpustack.ansible.childguard ansible-playbook ARGS...
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

GRACE_S = 5.0
POLL_S = 0.5
PR_SET_PDEATHSIG = 1


def _ask_for_parent_death_signal() -> None:
    """Linux: SIGTERM to this process when its parent dies; elsewhere the ppid poll covers it."""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def stop_group(child: subprocess.Popen, grace: float = GRACE_S) -> None:
    """SIGTERM to every process of our group but us, then SIGKILL to those left."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    group = os.getpgrp()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    # Workers and ssh clients may outlive ansible-playbook's own exit: no survivor.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, signal.SIGKILL)  # also ends this guard


def main(argv: list[str]) -> int:
    if not argv:
        sys.stderr.write("usage: python -m gpustack.ansible.childguard COMMAND [ARGS...]\n")
        return 2
    parent = os.getppid()
    _ask_for_parent_death_signal()
    if os.getpgrp() != os.getpid():
        with contextlib.suppress(OSError):
            os.setpgid(0, 0)
    stop = {"requested": False}

    def on_signal(signum, frame):
        stop["requested"] = True

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, on_signal)
    if os.getppid() != parent:  # the parent died before the signal was armed
        return 143
    child = subprocess.Popen(argv)
    while True:
        try:
            rc = child.wait(timeout=POLL_S)
            return rc if rc >= 0 else 128 - rc
        except subprocess.TimeoutExpired:
            pass
        if stop["requested"] or os.getppid() != parent:
            stop_group(child)
            return 143


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
