"""A real Kubernetes control plane per test worker (envtest style): etcd, kube-apiserver,
kube-controller-manager and kube-scheduler at the versions pinned in gpustack/lab/components.py,
built once into the components cache (`python -m gpustack.lab.components` prints it).

Nodes are kwok's (sigs.k8s.io/kwok, pinned there too): a maintained STAND-IN for kubelets
that registers Node objects, heartbeats them and moves pods through their phases. A kwok node's
capacity and allocatable are what the test gives it: "GPUs" on such a node are a stand-in for
a device plugin and prove nothing about real GPUs (the lab's real kubelets do:
tests/lab/test_real_cluster.py).

The API server keeps an audit log of the admin's requests (`Kube.audit_events`): tests count
the calls gpustack makes from the API server's own record, not by wrapping the client.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
import urllib.error
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

    def audit_mark(self) -> int:
        """Where the audit log ends now: `audit_events(mark)` returns what came after it."""
        return self.cp.audit_log.stat().st_size if self.cp.audit_log.exists() else 0

    def audit_events(self, mark: int, timeout: float = 10) -> list[dict]:
        """The audit events (stage ResponseComplete) of the requests completed since `mark`.

        A request of the test's own (a GET of a name nobody uses) closes the window: once its
        event is written, every request answered before it has been logged too."""
        fence = f"/api/v1/namespaces/audit-fence-{uuid.uuid4().hex[:8]}"
        with contextlib.suppress(urllib.error.HTTPError):  # 404, as meant
            self.cp.get(fence)
        deadline = time.monotonic() + timeout
        while fence not in {e.get("requestURI") for e in self._events_after(mark)}:
            if time.monotonic() > deadline:
                raise AssertionError("the audit log never recorded the fence request")
            time.sleep(0.1)
        time.sleep(0.2)  # a request answered just before the fence may be logged just after
        return [e for e in self._events_after(mark) if e.get("requestURI") != fence]

    def _events_after(self, mark: int) -> list[dict]:
        with open(self.cp.audit_log, "rb") as log:
            log.seek(mark)
            data = log.read()
        lines = data[: data.rfind(b"\n") + 1].splitlines()  # whole lines only
        events = (json.loads(line) for line in lines if line.strip())
        return [e for e in events if e.get("stage") == "ResponseComplete"]


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
    cp = ControlPlane(root, audit=True)  # tests count gpustack's API calls in its audit log
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
