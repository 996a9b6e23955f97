"""The real CLI against a real control plane: install --kubeconfig, verify, uninstall
--components k8s, and `gpustack mig`.

Hosts are this machine over a local connection, and only the read-only preflight runs
(`--tags gpu_preflight`; the driver/toolkit/runtime roles never run here). This machine has
no GPU, so verification fails honestly with "no NVIDIA device" (exit 3). The node is a kwok
node (a STAND-IN for its kubelet) with no GPU resources, like this machine; the API server,
RBAC, admission and the controllers are real. Each test installs into a namespace of its own
(`-e gpustack_k8s_namespace=...`) and removes its node and namespace afterwards.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET

import pytest
from kubernetes.client.exceptions import ApiException

from tests.conftest import run_cli
from tests.kube.stand_ins import kwok_node

pytestmark = pytest.mark.kube

MANAGED = "app.kubernetes.io/managed-by=gpustack"
RUNTIME_CLASSES = "/apis/node.k8s.io/v1/runtimeclasses"
TIMEOUTS = ("-e", "gpustack_k8s_daemonset_timeout=30", "-e", "gpustack_k8s_capacity_timeout=10",
            "-e", "gpustack_k8s_verify_timeout=10")  # fmt: skip


def local_inventory(tmp_path, host="gpuhost"):
    path = tmp_path / "inventory.ini"
    path.write_text(
        f"[gpu_nodes]\n{host} ansible_connection=local ansible_python_interpreter={sys.executable}\n"
    )
    return path


def _gone(raw, path: str) -> None:
    try:
        raw("DELETE", path)
    except ApiException as exc:
        if exc.status != 404:
            raise


def _exists(raw, path: str) -> bool:
    try:
        raw("GET", path)
        return True
    except ApiException as exc:
        if exc.status == 404:
            return False
        raise


@pytest.fixture
def scratch(kube, unique):
    """(namespace, node name) for the test; both removed after it. gpustack's cluster-scoped
    RuntimeClass is removed before and after: the test starts as on a cluster gpustack has
    not been installed on (tests run one after another on a worker's control plane)."""
    cluster = kube.stand_in()

    def runtime_classes():
        for rc in cluster.raw("GET", RUNTIME_CLASSES, [("labelSelector", MANAGED)])["items"]:
            _gone(cluster.raw, f"{RUNTIME_CLASSES}/{rc['metadata']['name']}")

    runtime_classes()
    ns, node = f"gs-{unique}", f"gpuhost-{unique}"
    yield cluster, ns, node
    _gone(cluster.raw, f"/api/v1/namespaces/{ns}")
    _gone(cluster.raw, f"/api/v1/nodes/{node}")
    runtime_classes()


def test_install_applies_labels_verifies_and_exits_3_without_gpu(
    tmp_path, state_dir, kubeconfig, scratch
):
    cluster, ns, host = scratch
    kwok_node(cluster, host)  # no GPU resources, like this machine
    inv = local_inventory(tmp_path, host)
    report, junit = tmp_path / "report.json", tmp_path / "junit.xml"
    scope = ("-e", f"gpustack_k8s_namespace={ns}", *TIMEOUTS)

    result = run_cli(
        "install", str(inv), "--kubeconfig", str(kubeconfig), "--tags", "gpu_preflight",
        "--report", str(report), "--junit", str(junit), *scope, timeout=300,
    )  # fmt: skip

    assert result.returncode == 3, result.stdout + result.stderr
    assert "Applied 11 object(s): 11 created" in result.stdout
    assert host in result.stdout and "FAILED" in result.stdout
    assert "no NVIDIA device" in result.stdout
    assert "1 node(s): 0 passed, 1 failed verification" in result.stdout
    doc = json.loads(report.read_text())
    assert doc["exit_code"] == 3  # the report says what the process exits with
    node = doc["kubernetes"]["nodes"][host]
    assert node["passed"] is False
    assert (
        node["checks"][-1]["name"] == "gpus" and "no NVIDIA device" in node["checks"][-1]["message"]
    )
    ds_path = f"/apis/apps/v1/namespaces/{ns}/daemonsets"
    assert _exists(cluster.raw, f"{ds_path}/nvidia-device-plugin")
    assert _exists(cluster.raw, f"{RUNTIME_CLASSES}/nvidia")
    cases = ET.parse(junit).getroot().findall(".//testcase")
    names = {(c.get("classname"), c.get("name")) for c in cases}
    assert {(host, "reachable"), (host, "host stack"), (host, "k8s gpus")} <= names
    failed = [c for c in cases if c.find("failure") is not None]
    assert [(c.get("name")) for c in failed] == ["k8s gpus"]

    # verify (read-only facts) says the same, as JSON.
    result = run_cli("verify", str(inv), "--kubeconfig", str(kubeconfig), "-o", "json", *scope,
                     timeout=300)  # fmt: skip
    assert result.returncode == 3, result.stderr
    doc = json.loads(result.stdout)
    assert doc["command"] == "verify" and doc["exit_code"] == 3
    assert doc["kubernetes"]["nodes"][host]["passed"] is False
    assert "gpustack_smi" in doc["hosts"][host]["facts"]

    # uninstall --components k8s touches no host: no play runs.
    runs_before = len(list((state_dir / "runs").iterdir()))
    result = run_cli("uninstall", str(inv), "--kubeconfig", str(kubeconfig), "--components",
                     "k8s", "--yes", "-e", f"gpustack_k8s_namespace={ns}")  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Kubernetes: deleted" in result.stdout
    left = cluster.raw("GET", "/apis/apps/v1/daemonsets", [("labelSelector", MANAGED)])["items"]
    assert [d for d in left if d["metadata"]["namespace"] == ns] == []
    assert not _exists(cluster.raw, f"{RUNTIME_CLASSES}/nvidia")
    assert len(list((state_dir / "runs").iterdir())) == runs_before


def test_mig_labels_failed_with_the_role_s_reason_on_a_host_without_gpu(
    tmp_path, state_dir, kubeconfig, scratch
):
    """`gpustack mig` end to end: real CLI, real Ansible (playbooks/mig.yml in check mode on this
    machine: the flow's first, read-only call), the real API server. No GPU here: the role says
    so, the node's nvidia.com/mig.config.state is failed with that reason, and nothing else
    ran."""
    cluster, ns, host = scratch
    kwok_node(cluster, host, labels={"nvidia.com/mig.config": "all-1g.10gb"})
    report = tmp_path / "mig.json"

    # This machine runs no systemd, which the role refuses first: a directory stands in for
    # /run/systemd/system so that the GPU check is the one reached.
    result = run_cli("mig", str(local_inventory(tmp_path, host)), "--kubeconfig", str(kubeconfig),
                     "--report", str(report), "-e", f"__nvidia_mig_systemd_marker={tmp_path}",
                     "-e", f"gpustack_k8s_namespace={ns}", timeout=300)  # fmt: skip

    assert result.returncode == 1, result.stdout + result.stderr
    node = cluster.raw("GET", f"/api/v1/nodes/{host}")
    assert node["metadata"]["labels"]["nvidia.com/mig.config.state"] == "failed"
    reason = node["metadata"]["annotations"]["gpustack.io/mig-config-failure"]
    assert "no NVIDIA device" in reason, reason
    assert not node["spec"].get("unschedulable")  # failed before anything was paused or cordoned
    doc = json.loads(report.read_text())
    assert doc["nodes"][host]["states"] == ["failed"]
    assert doc["mig_strategy"] == "none"  # no device plugin deployed: the configured one
    assert f"{host}: all-1g.10gb failed: " in result.stdout


def test_mig_without_a_cluster_is_bad_input(tmp_path, state_dir, monkeypatch):
    """No cluster at all (none is started for this test)."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    result = run_cli("mig", str(local_inventory(tmp_path)), timeout=120)
    assert result.returncode == 2
    assert "Error: gpustack mig reads each node's nvidia.com/mig.config label" in result.stderr
    assert "Hint: pass --kubeconfig" in result.stderr
