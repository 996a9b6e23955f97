"""A real Kubernetes control plane per test worker (envtest style): etcd, kube-apiserver,
kube-controller-manager and kube-scheduler at the versions pinned in gpustack/lab/components.py,
built once into the components cache (`python -m gpustack.lab.components` prints it).

Nodes are kwok's (sigs.k8s.io/kwok, pinned there too): a maintained STAND-IN for kubelets
that registers Node objects, heartbeats them and moves pods through their phases. A kwok node's
capacity and allocatable are what the test gives it: "GPUs" on such a node are a stand-in for
a device plugin and prove nothing about real GPUs (the lab's real kubelets do:
tests/lab/test_real_cluster.py).
"""

from __future__ import annotations

import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpustack.lab import components
from gpustack.lab.control_plane import ControlPlane

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"


@dataclass
class Kube:
    """The running control plane, its admin kubeconfig and kwok."""

    cp: ControlPlane
    kubeconfig: Path

    def kubectl_get(self, path: str) -> dict:
        return self.cp.get(path)


def _start_kwok(cp: ControlPlane, kubeconfig: Path, logdir: Path) -> subprocess.Popen:
    bindir = components.build(components.KWOK)
    kwok = bindir / "kwok"
    stages = [f"--config={path}" for path in sorted((bindir.parent / "share").glob("*.yaml"))]
    log = open(logdir / "kwok.log", "ab")  # noqa: SIM115 (the child keeps it)
    proc = subprocess.Popen(
        [
            str(kwok),
            f"--kubeconfig={kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
            "--node-ip=10.0.0.1",
            "--cidr=10.0.0.1/16",
            "--node-lease-duration-seconds=40",
            "--server-address=",
            *stages,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    log.close()
    return proc


@pytest.fixture(scope="session")
def kube(tmp_path_factory) -> Kube:
    root = tmp_path_factory.mktemp("kube")
    cp = ControlPlane(root)
    kubeconfig = cp.start()
    kwok = _start_kwok(cp, kubeconfig, root / "logs")
    yield Kube(cp, kubeconfig)
    kwok.terminate()
    try:
        kwok.wait(10)
    except subprocess.TimeoutExpired:
        kwok.kill()
    cp.stop()


@pytest.fixture
def kubeconfig(kube, tmp_path) -> Path:
    """The admin kubeconfig, copied for the test (a test may not change the session's)."""
    path = tmp_path / "kubeconfig"
    path.write_bytes(kube.kubeconfig.read_bytes())
    return path


@pytest.fixture
def unique() -> str:
    """A short name unique to the test: node names and namespaces never clash on the shared
    control plane."""
    return uuid.uuid4().hex[:6]
