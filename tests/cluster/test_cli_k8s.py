"""The real CLI against the emulator: install --kubeconfig, verify, uninstall --components k8s.

Hosts are this machine over a local connection, and only the read-only preflight runs
(`--tags gpu_preflight`; the driver/toolkit/runtime roles never run here). This machine has
no GPU, so verification fails honestly with "no NVIDIA device" (exit 3).
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET

from tests.conftest import run_cli

NS = "gpustack-system"


def local_inventory(tmp_path, host="gpuhost"):
    path = tmp_path / "inventory.ini"
    path.write_text(
        f"[gpu_nodes]\n{host} ansible_connection=local ansible_python_interpreter={sys.executable}\n"
    )
    return path


def test_install_applies_labels_verifies_and_exits_3_without_gpu(tmp_path, state_dir, cluster):
    emu = cluster.emulator
    emu.add_node("gpuhost")  # no GPU hardware, like this machine
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    inv = local_inventory(tmp_path)
    report, junit = tmp_path / "report.json", tmp_path / "junit.xml"

    result = run_cli(
        "install", str(inv), "--kubeconfig", str(kubeconfig), "--tags", "gpu_preflight",
        "--report", str(report), "--junit", str(junit), timeout=300,
    )  # fmt: skip

    assert result.returncode == 3, result.stdout + result.stderr
    assert "Applied 11 object(s): 11 created" in result.stdout
    assert "gpuhost" in result.stdout and "FAILED" in result.stdout
    assert "no NVIDIA device" in result.stdout
    assert "1 node(s): 0 passed, 1 failed verification" in result.stdout
    doc = json.loads(report.read_text())
    assert doc["exit_code"] == 3  # the report says what the process exits with
    node = doc["kubernetes"]["nodes"]["gpuhost"]
    assert node["passed"] is False
    assert (
        node["checks"][-1]["name"] == "gpus" and "no NVIDIA device" in node["checks"][-1]["message"]
    )
    assert emu.get("apps/v1", "DaemonSet", "nvidia-device-plugin", NS) is not None
    assert emu.get("node.k8s.io/v1", "RuntimeClass", "nvidia") is not None
    cases = ET.parse(junit).getroot().findall(".//testcase")
    names = {(c.get("classname"), c.get("name")) for c in cases}
    assert {("gpuhost", "reachable"), ("gpuhost", "host stack"), ("gpuhost", "k8s gpus")} <= names
    failed = [c for c in cases if c.find("failure") is not None]
    assert [(c.get("name")) for c in failed] == ["k8s gpus"]

    # verify (read-only facts) says the same, as JSON.
    result = run_cli("verify", str(inv), "--kubeconfig", str(kubeconfig), "-o", "json", timeout=300)
    assert result.returncode == 3, result.stderr
    doc = json.loads(result.stdout)
    assert doc["command"] == "verify" and doc["exit_code"] == 3
    assert doc["kubernetes"]["nodes"]["gpuhost"]["passed"] is False
    assert "gpustack_smi" in doc["hosts"]["gpuhost"]["facts"]

    # uninstall --components k8s touches no host: no play runs.
    runs_before = len(list((state_dir / "runs").iterdir()))
    result = run_cli(
        "uninstall", str(inv), "--kubeconfig", str(kubeconfig), "--components", "k8s", "--yes"
    )
    assert result.returncode == 0, result.stderr
    assert "Kubernetes: deleted" in result.stdout
    assert emu.objects("apps/v1", "DaemonSet") == []
    assert emu.get("node.k8s.io/v1", "RuntimeClass", "nvidia") is None
    assert len(list((state_dir / "runs").iterdir())) == runs_before


def test_mig_labels_failed_with_the_role_s_reason_on_a_host_without_gpu(
    tmp_path, state_dir, cluster
):
    """`gpustack mig` end to end: real CLI, real Ansible (playbooks/mig.yml in check mode on this
    machine: the flow's first, read-only call), the emulator. No GPU here: the role says so, the
    node's nvidia.com/mig.config.state is failed with that reason, and nothing else ran."""
    emu = cluster.emulator
    emu.add_node("gpuhost", labels={"nvidia.com/mig.config": "all-1g.10gb"})
    kubeconfig = cluster.write_kubeconfig(tmp_path / "kubeconfig")
    report = tmp_path / "mig.json"

    # This machine runs no systemd, which the role refuses first: a directory stands in for
    # /run/systemd/system so that the GPU check is the one reached.
    result = run_cli("mig", str(local_inventory(tmp_path)), "--kubeconfig", str(kubeconfig),
                     "--report", str(report), "-e", f"__nvidia_mig_systemd_marker={tmp_path}",
                     timeout=300)  # fmt: skip

    assert result.returncode == 1, result.stdout + result.stderr
    node = emu.get("v1", "Node", "gpuhost")
    assert node["metadata"]["labels"]["nvidia.com/mig.config.state"] == "failed"
    reason = node["metadata"]["annotations"]["gpustack.io/mig-config-failure"]
    assert "no NVIDIA device" in reason, reason
    assert not node["spec"].get("unschedulable")  # failed before anything was paused or cordoned
    doc = json.loads(report.read_text())
    assert doc["nodes"]["gpuhost"]["states"] == ["failed"]
    assert doc["mig_strategy"] == "none"  # no device plugin deployed: the configured one
    assert "gpuhost: all-1g.10gb failed: " in result.stdout


def test_mig_without_a_cluster_is_bad_input(tmp_path, state_dir, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    result = run_cli("mig", str(local_inventory(tmp_path)), timeout=120)
    assert result.returncode == 2
    assert "Error: gpustack mig reads each node's nvidia.com/mig.config label" in result.stderr
    assert "Hint: pass --kubeconfig" in result.stderr
