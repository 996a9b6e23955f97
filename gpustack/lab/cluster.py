"""`gpustack lab up --kubernetes`: a real Kubernetes on the lab.

The control plane (control_plane.py) runs on this machine, detached, listening on the podman
network's gateway address, which the nodes reach and this machine owns; every node gets a
kubelet (kubelets.py). The admin kubeconfig lands in the lab's directory as `kubeconfig`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from gpustack.errors import LabError
from gpustack.lab import kubelets
from gpustack.lab.control_plane import ControlPlane
from gpustack.lab.operand_images import pause_image
from gpustack.lab.podman import run


def gateway() -> str:
    """The podman network's gateway: an address of this machine that containers reach."""
    proc = run(["podman", "network", "inspect", "podman"], check=False)
    try:
        subnets = json.loads(proc.stdout or b"[]")[0].get("subnets") or []
        return next(s["gateway"] for s in subnets if s.get("gateway"))
    except (ValueError, IndexError, StopIteration, KeyError):
        raise LabError(
            "podman's default network has no gateway address",
            "check `podman network inspect podman`",
        ) from None


def control_plane(lab_dir: Path, address: str | None = None) -> ControlPlane:
    return ControlPlane(
        lab_dir / "kubernetes", address=address or gateway(), extra_ips=("127.0.0.1",), detach=True
    )


def up(name: str, lab_dir: Path, nodes, log=print) -> Path:
    """Start (or keep) the control plane, join every node, wait for them Ready."""
    cp = control_plane(lab_dir)
    log(f"Kubernetes control plane for lab {name} (building components if missing)")
    admin = cp.start(log)
    pause = pause_image(log)
    for index, node in enumerate(nodes):
        log(f"kubelet on {node.name}")
        kubelets.join(
            cp, node.container, node.name, index + 1, name, cp.server, pause.archive, pause.refs[0]
        )
    kubelets.wait_ready(cp, [n.name for n in nodes])
    kubeconfig = lab_dir / "kubeconfig"
    shutil.copy2(admin, kubeconfig)
    return kubeconfig


def down(lab_dir: Path) -> None:
    """Stop the lab's control plane, if it has one."""
    root = lab_dir / "kubernetes"
    if (root / "state.json").exists():
        ControlPlane(root, detach=True).stop()
