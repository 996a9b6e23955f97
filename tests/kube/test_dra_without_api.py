"""gpustack_k8s_gpu_allocation=dra on a cluster that does not serve resource.k8s.io/v1.

The cluster is a second real control plane (etcd, kube-apiserver, kube-controller-manager and
kube-scheduler at the pinned 1.36.3, kwok nodes) whose API server runs with
`--runtime-config=resource.k8s.io/v1=false`: the group is switched off by the API server's own
flag and its discovery does not list it (asserted below), as on a release before 1.34 (no
release that lacks the group is built here). Two more flags follow from 1.36 locking the
DynamicResourceAllocation feature gate on (`--feature-gates=DynamicResourceAllocation=false`
is refused: "feature is locked to true", asserted below):
- the API server authorizes with RBAC only: the Node authorizer watches v1 ResourceSlices, its
  informer never syncs without the group and /readyz stays 500 (`informer-sync`). No request
  here is a kubelet's, which is what the Node authorizer is for;
- kube-scheduler runs with `--emulated-version=1.33`, where DRA is off by default as on such a
  cluster: at 1.36 it waits for its DeviceClass, ResourceClaim and ResourceSlice informers
  before scheduling anything, and they never sync.

What is real: the API server's discovery and its 404 for the switched-off group, its audit log
(the requests gpustack made, by verb), the DaemonSet controller and the scheduler rolling out
the device plugin's DaemonSets, the garbage collector. STAND-INS: the nodes are kwok's, their
"GPUs" allocatable numbers the test writes; the host facts are SIMULATED (tests/builders.py);
the verification pods' output is `VerificationPods`' (tests/kube/stand_ins.py).
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gpustack.errors import BadInput, LabError
from gpustack.k8s.cluster import connect, flow
from gpustack.lab.control_plane import ControlPlane
from tests.builders import gpu_facts, inventory, run_result, smi_output, uuids_for
from tests.conftest import run_cli
from tests.kube.conftest import control_plane, gpustack_calls, gpustack_requests
from tests.kube.stand_ins import Outcome, VerificationPods, kwok_node
from tests.kube.test_uninstall import PollingClock, group_vars, nodes_ready

pytestmark = pytest.mark.kube

NO_DRA = {
    "apiserver_args": ("--runtime-config=resource.k8s.io/v1=false", "--authorization-mode=RBAC"),
    "scheduler_args": ("--emulated-version=1.33",),
}
DRA = {"gpustack_k8s_gpu_allocation": "dra"}
RESOURCE_API = "/apis/resource.k8s.io/v1"
READS = {"get", "list", "watch"}


@pytest.fixture(scope="module")
def old(tmp_path_factory):
    """The control plane without resource.k8s.io/v1, for this module's tests."""
    with control_plane(tmp_path_factory.mktemp("kube-no-dra"), **NO_DRA) as running:
        yield running


@pytest.fixture
def kubeconfig(old, tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_bytes(old.kubeconfig.read_bytes())
    return path


def gpu_node(old, name: str, gpus: int = 1) -> None:
    """A kwok node with `gpus` nvidia.com/gpu, created by the stand-ins' user (not gpustack's
    requests in the audit log), Ready."""
    cluster = old.stand_in()
    kwok_node(cluster, name, gpus=gpus)
    nodes_ready(cluster, name)


def writes(events: list[dict]) -> list[tuple[str, str]]:
    return [(verb, uri) for verb, uri in gpustack_requests(events) if verb not in READS]


def test_the_api_server_serves_no_resource_k8s_io_v1(old):
    groups = {g["name"]: g for g in old.kubectl_get("/apis")["groups"]}
    assert "resource.k8s.io" not in groups, groups.get("resource.k8s.io")
    assert "apps" in groups and "node.k8s.io" in groups
    with pytest.raises(urllib.error.HTTPError) as caught:
        old.kubectl_get(RESOURCE_API)
    assert caught.value.code == 404
    assert old.kubectl_get("/version")["gitVersion"].startswith("v1.36.")
    pid = old.cp.running()["kube-apiserver"]
    args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")
    assert "--runtime-config=resource.k8s.io/v1=false" in args
    assert "--authorization-mode=RBAC" in args and "--authorization-mode=Node,RBAC" not in args
    with urllib.request.urlopen(f"{old.cp.server}/readyz", context=old.cp._ssl_context()) as ready:
        assert ready.status == 200


def test_the_dra_feature_gate_is_locked_on_in_1_36(tmp_path):
    """Why the group is switched off by --runtime-config alone: the gate cannot be."""
    cp = ControlPlane(
        tmp_path / "gate",
        with_controllers=False,
        apiserver_args=("--feature-gates=DynamicResourceAllocation=false",),
    )
    try:
        with pytest.raises(LabError) as caught:
            cp.start(timeout=60)
        assert "cannot set feature gate DynamicResourceAllocation to false" in str(caught.value)
        assert "feature is locked to true" in str(caught.value)
    finally:
        cp.stop()
    assert cp.running() == {}  # etcd, started before the API server failed, is stopped too


def test_a_cluster_without_resource_k8s_io_v1_is_refused_before_anything_is_applied(
    old, kubeconfig, unique, tmp_path
):
    gpu = f"gpu1-{unique}"
    gpu_node(old, gpu)
    node_before = old.kubectl_get(f"/api/v1/nodes/{gpu}")["metadata"]
    namespaces_before = old.kubectl_get("/api/v1/namespaces")["items"]
    mark = old.audit_mark()

    with pytest.raises(BadInput) as caught:
        flow.prepare(str(kubeconfig), inventory(tmp_path, [gpu]), DRA)

    message, hint = caught.value.message, caught.value.hint
    assert "resource.k8s.io/v1" in message and "v1.36.3" in message, message
    assert "does not serve" in message and "nothing was applied" in message
    assert "deviceclasses, resourceclaims, resourceclaimtemplates, resourceslices" in message
    assert "1.34" in hint and "device-plugin" in hint
    events = old.audit_events(mark)
    assert ("get", RESOURCE_API) in gpustack_calls(events)
    assert writes(events) == []
    node = old.kubectl_get(f"/api/v1/nodes/{gpu}")["metadata"]
    assert node["labels"] == node_before["labels"]
    assert node.get("annotations") == node_before.get("annotations")
    assert old.kubectl_get("/api/v1/namespaces")["items"] == namespaces_before


@pytest.mark.parametrize("extravars", [{}, {"gpustack_k8s_gpu_allocation": "device-plugin"}])
def test_the_same_cluster_is_accepted_with_the_device_plugin(
    old, kubeconfig, unique, tmp_path, extravars
):
    gpu = f"gpu1-{unique}"
    gpu_node(old, gpu)
    mark = old.audit_mark()

    session = flow.prepare(str(kubeconfig), inventory(tmp_path, [gpu]), extravars)

    assert session is not None and session.config.gpu_allocation == "device-plugin"
    assert session.version.startswith("v1.36.")
    events = old.audit_events(mark)
    assert writes(events) == []
    assert not [uri for _, uri in gpustack_calls(events) if uri.startswith(RESOURCE_API)]


def test_the_cli_refuses_dra_on_an_old_cluster_with_error_and_hint_and_no_change(
    old, kubeconfig, unique, tmp_path, state_dir
):
    host = f"gpuhost-{unique}"
    gpu_node(old, host, gpus=0)
    inv = tmp_path / "inventory.ini"
    inv.write_text(
        f"[gpu_nodes]\n{host} ansible_connection=local ansible_python_interpreter={sys.executable}\n"
    )
    node_before = old.kubectl_get(f"/api/v1/nodes/{host}")["metadata"]
    mark = old.audit_mark()

    result = run_cli(
        "install", str(inv), "--kubeconfig", str(kubeconfig), "--tags", "gpu_preflight",
        "-e", "gpustack_k8s_gpu_allocation=dra", timeout=300,
    )  # fmt: skip

    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    errors = [line for line in output.splitlines() if line.startswith("Error:")]
    hints = [line for line in output.splitlines() if line.startswith("Hint:")]
    assert len(errors) == 1 and "resource.k8s.io/v1" in errors[0], output
    assert "nothing was applied" in errors[0]
    assert len(hints) == 1 and "1.34" in hints[0] and "device-plugin" in hints[0]
    assert "Traceback" not in output
    events = old.audit_events(mark)
    assert ("get", RESOURCE_API) in gpustack_calls(events)
    assert writes(events) == []
    assert old.kubectl_get(f"/api/v1/nodes/{host}")["metadata"]["labels"] == node_before["labels"]
    assert not (state_dir / "runs").exists() or not list((state_dir / "runs").iterdir())


def test_uninstall_on_a_cluster_without_dra_passes_over_its_kinds(
    old, kubeconfig, unique, tmp_path
):
    gpu, variables = f"gpu1-{unique}", group_vars(unique)
    ns = variables["gpustack_k8s_namespace"]
    gpu_node(old, gpu)
    inv = inventory(tmp_path, [gpu], **variables)
    outcome = Outcome(smi_output(uuids_for(gpu, 1)))
    with VerificationPods(old.stand_in(), tmp_path, {gpu: outcome}):
        report = flow.install(
            flow.prepare(str(kubeconfig), inv, {}),
            run_result({gpu: gpu_facts(gpu, 1)}),
            clock=PollingClock(),
        )
    assert report.passed, report.to_dict()
    assert not [a for a in report.applied if a.kind in ("DeviceClass", "ResourceClaimTemplate")]
    mark = old.audit_mark()

    result = flow.uninstall(flow.prepare(str(kubeconfig), inv, {}))

    assert f"DaemonSet {ns}/nvidia-device-plugin" in result["deleted"]
    assert not [ref for ref in result["deleted"] if ref.startswith("DeviceClass")]
    assert not [ref for ref in result["deleted"] if ref.startswith("Resource")]
    calls = gpustack_calls(old.audit_events(mark))
    assert not [c for c in calls if c[1].startswith(f"{RESOURCE_API}/")], calls
    cluster = connect.connect(str(kubeconfig))
    assert cluster.raw("GET", f"/apis/apps/v1/namespaces/{ns}/daemonsets")["items"] == []
    cluster.close()
