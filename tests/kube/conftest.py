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
import socket
import subprocess
import time
import urllib.error
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from gpustack.k8s.cluster.connect import connect
from gpustack.lab import components
from gpustack.lab.control_plane import ControlPlane
from tests.conftest import wait_until

KWOK_NODE_ANNOTATION = "kwok.x-k8s.io/node"
CRD = "kwok.x-k8s.io_"  # kwok's CRD files in the component's share/
STAND_IN = "stand-in"


@dataclass
class Kube:
    """The running control plane, its admin kubeconfig and kwok."""

    cp: ControlPlane
    kubeconfig: Path

    def kubectl_get(self, path: str) -> dict:
        return self.cp.get(path)

    def stand_in(self):
        """A client for the tests' stand-ins (user `stand-in`, cluster-admin): their requests
        are told apart from gpustack's in the audit log by that user."""
        path = self.kubeconfig.with_name("stand-in.kubeconfig")
        if not path.exists():
            self.cp.user_kubeconfig(path, STAND_IN, ("system:masters",))
        return connect(str(path))

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


def gpustack_requests(events: list[dict]) -> list[tuple[str, str]]:
    """(verb, URI) of gpustack's own requests in audit events: kwok's and the stand-ins' are
    left out."""
    return [
        (e["verb"], e["requestURI"])
        for e in events
        if e["user"]["username"] == "kubernetes-admin"
        and not e.get("userAgent", "").startswith("kwok")
    ]


def gpustack_calls(events: list[dict]) -> list[tuple[str, str]]:
    """(verb, path) of gpustack's own requests."""
    return [(verb, uri.split("?")[0]) for verb, uri in gpustack_requests(events)]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _install_crd(kubeconfig: Path, path: Path) -> None:
    cluster = connect(str(kubeconfig))
    crd = yaml.safe_load(path.read_text())
    cluster.raw("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd,
                ctype="application/json")  # fmt: skip
    name = crd["metadata"]["name"]

    def established():
        got = cluster.raw("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        conditions = (got.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

    wait_until(established, what=f"CRD {name} established")


def _start_kwok(cp: ControlPlane, kubeconfig: Path, logdir: Path) -> subprocess.Popen:
    """kwok plays the kubelets of the annotated nodes, and serves their pods' logs on
    127.0.0.1 (the nodes' InternalIP) from files that ClusterLogs objects name: the API server
    proxies `pods/NAME/log` there as it would to a kubelet."""
    bindir = components.build(components.KWOK)
    kwok = bindir / "kwok"
    share = bindir.parent / "share"
    stages = [f"--config={p}" for p in sorted(share.glob("*.yaml")) if not p.name.startswith(CRD)]
    _install_crd(kubeconfig, share / f"{CRD}clusterlogs.yaml")
    crt, key = cp.pki.issue("kwok-serving", "kwok", server=True, client=False, ips=("127.0.0.1",))
    port = _free_port()
    log = open(logdir / "kwok.log", "ab")  # noqa: SIM115 (the child keeps it)
    proc = subprocess.Popen(
        [
            str(kwok),
            f"--kubeconfig={kubeconfig}",
            "--manage-all-nodes=false",
            f"--manage-nodes-with-annotation-selector={KWOK_NODE_ANNOTATION}=fake",
            "--node-ip=127.0.0.1",
            f"--node-port={port}",
            "--cidr=10.0.0.1/16",
            "--node-lease-duration-seconds=40",
            f"--server-address=127.0.0.1:{port}",
            f"--tls-cert-file={crt}",
            f"--tls-private-key-file={key}",
            "--enable-crds=ClusterLogs",
            *stages,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
    )
    log.close()
    return proc


@contextlib.contextmanager
def control_plane(root: Path, **options) -> Iterator[Kube]:
    """A control plane in `root` with kwok, stopped when the block ends. It keeps an audit log:
    tests count gpustack's API calls there. `options`: ControlPlane's."""
    cp = ControlPlane(root, audit=True, **options)
    try:
        kubeconfig = cp.start()
        kwok = _start_kwok(cp, kubeconfig, root / "logs")
        try:
            yield Kube(cp, kubeconfig)
        finally:
            kwok.terminate()
            try:
                kwok.wait(10)
            except subprocess.TimeoutExpired:
                kwok.kill()
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def kube(tmp_path_factory) -> Iterator[Kube]:
    with control_plane(tmp_path_factory.mktemp("kube")) as running:
        yield running


@pytest.fixture
def kubeconfig(kube, tmp_path) -> Path:
    """The admin kubeconfig, copied for the test (a test may not change the session's)."""
    path = tmp_path / "kubeconfig"
    path.write_bytes(kube.kubeconfig.read_bytes())
    return path


@pytest.fixture
def cluster(kubeconfig):
    """An admin client of the shared control plane, closed after the test."""
    c = connect(str(kubeconfig))
    yield c
    c.close()


@pytest.fixture
def unique() -> str:
    """A short name unique to the test: node names and namespaces never clash on the shared
    control plane."""
    return uuid.uuid4().hex[:6]


@pytest.fixture(autouse=True)
def _nodes_and_namespaces_go_with_their_test(request):
    """Nodes and namespaces a test adds are deleted when it ends: the control plane is shared by
    the tests of a worker. A node left labelled for gpustack's operands would get the next
    test's DaemonSet pods; a namespace left holding gpustack's DaemonSets would put their pods
    (GFD, dcgm-exporter, ...) on the next test's labelled nodes, where a MIG change's pause then
    waits for them. A namespace's DaemonSets are deleted first, at once: the namespace
    controller removes the rest in its own time, and no DaemonSet outlives the test to select a
    later node. (Nodes and namespaces of a module-scoped fixture exist before its tests start:
    kept.)"""
    if "kube" not in request.fixturenames:
        yield
        return
    kube = request.getfixturevalue("kube")
    nodes = _names(kube, "/api/v1/nodes")
    namespaces = _names(kube, "/api/v1/namespaces")
    yield
    cluster = kube.stand_in()
    for ns in sorted(_names(kube, "/api/v1/namespaces") - namespaces):
        for path in (f"/apis/apps/v1/namespaces/{ns}/daemonsets", f"/api/v1/namespaces/{ns}"):
            with contextlib.suppress(ApiException):  # already gone, or already terminating
                cluster.raw("DELETE", path)
    for node in sorted(_names(kube, "/api/v1/nodes") - nodes):
        with contextlib.suppress(ApiException):
            cluster.raw("DELETE", f"/api/v1/nodes/{node}")


def _names(kube: Kube, path: str) -> set[str]:
    return {item["metadata"]["name"] for item in kube.kubectl_get(path)["items"]}
