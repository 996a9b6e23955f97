"""podman and the machine the lab runs on: commands as Error + Hint, root and tools, the
OCI runtime this machine's cgroup layout needs."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from gpustack.errors import LabError

CGROUP_ROOT = "/sys/fs/cgroup"
LABEL = "io.gpustack.lab"


def run(
    args: list[str], check: bool = True, input_: bytes | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(args, capture_output=True, input=input_, timeout=timeout)
    except FileNotFoundError:
        raise LabError(
            f"{args[0]} is not installed", "apt-get install podman debootstrap openssh-client"
        ) from None
    except subprocess.TimeoutExpired:
        raise LabError(
            f"`{' '.join(args[:3])}` timed out", "retry; check the machine's load"
        ) from None
    if check and proc.returncode != 0:
        err = (proc.stderr or proc.stdout).decode(errors="replace").strip().splitlines()
        raise LabError(
            f"`{' '.join(args[:4])} …` failed: {err[-1] if err else proc.returncode}",
            "see the command's output above; `podman ps -a` shows the nodes",
        )
    return proc


def preconditions() -> None:
    if os.geteuid() != 0:
        raise LabError(
            "the lab needs root (privileged podman containers, debootstrap)",
            "run it as root, e.g. with sudo",
        )
    for tool in ("podman", "debootstrap", "ssh", "ssh-keygen"):
        if not shutil.which(tool):
            raise LabError(
                f"{tool} is not installed", "apt-get install podman debootstrap openssh-client"
            )


def cgroup_layout(root: str = CGROUP_ROOT) -> str:
    """'v2' (unified), 'hybrid' (v1 with controllers also on cgroup2) or 'v1'."""
    base = Path(root)
    if (base / "cgroup.controllers").exists():
        return "v2"
    try:
        unified = (base / "unified" / "cgroup.controllers").read_text().split()
    except OSError:
        return "v1"
    return "hybrid" if unified else "v1"


def oci_runtime(root: str = CGROUP_ROOT) -> str | None:
    """The OCI runtime lab nodes need here, or None for podman's default.

    crun (podman's default on Debian 12) refuses every container on a hybrid hierarchy
    ("cgroups in hybrid mode not supported, drop all controllers from cgroupv2"); runc starts
    systemd nodes there. GPUSTACK_LAB_OCI_RUNTIME overrides the choice.
    """
    chosen = os.environ.get("GPUSTACK_LAB_OCI_RUNTIME") or (
        "runc" if cgroup_layout(root) == "hybrid" else None
    )
    if chosen and not shutil.which(chosen):
        raise LabError(
            f"this machine's cgroup layout needs the {chosen} OCI runtime, which is not installed",
            f"apt-get install {chosen} (./scripts/setup.sh installs it)",
        )
    return chosen
