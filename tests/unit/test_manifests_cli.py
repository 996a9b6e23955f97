"""`gpustack manifests` through the real entry point: files written and valid, or nothing."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from tests.conftest import run_cli, runs_started

INVENTORY = """\
[gpu_nodes]
gpu-1 ansible_host=10.0.0.1
gpu-2 ansible_host=10.0.0.2

[all:vars]
gpustack_k8s_namespace=gpu-ops
"""


@pytest.fixture
def inv(tmp_path):
    path = tmp_path / "inventory" / "hosts.ini"
    path.parent.mkdir()
    path.write_text(INVENTORY)
    (path.parent / "group_vars").mkdir()
    (path.parent / "group_vars" / "all.yml").write_text("gpustack_k8s_time_slicing_replicas: 3\n")
    return path


def _load(directory):
    return {p.name: yaml.safe_load(p.read_text()) for p in sorted(directory.iterdir())}


def test_manifests_writes_valid_yaml_from_inventory_and_extra_vars(tmp_path, inv, state_dir):
    out = tmp_path / "gitops" / "gpu"
    proc = run_cli(
        "manifests", str(inv), "--output-dir", str(out), "--servicemonitor",
        "-e", "gpustack_k8s_registry=mirror.local:5000", "-e", "gpustack_k8s_gfd_enabled=false",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    files = _load(out)
    assert list(files)[:2] == ["00-namespace.yaml", "10-runtimeclass.yaml"]
    assert "50-servicemonitor-dcgm-exporter.yaml" in files
    assert "30-daemonset-gpu-feature-discovery.yaml" not in files  # -e gfd off
    for name in files:
        assert name in proc.stdout
    for name, obj in files.items():
        if obj["kind"] == "ServiceMonitor":
            assert obj["apiVersion"] == "monitoring.coreos.com/v1"
            continue
        kubernetes_validate.validate(obj, "1.37.0", strict=True)
        if obj["kind"] != "Namespace" and obj["kind"] != "RuntimeClass":
            assert obj["metadata"]["namespace"] == "gpu-ops", name  # from [all:vars]
    plugin = yaml.safe_load(
        files["20-configmap-nvidia-device-plugin-config.yaml"]["data"]["config.yaml"]
    )
    assert plugin["sharing"]["timeSlicing"]["resources"][0]["replicas"] == 3  # from group_vars/
    image = files["30-daemonset-nvidia-device-plugin.yaml"]["spec"]["template"]["spec"][
        "containers"
    ][0]["image"]
    assert image == "mirror.local:5000/nvidia/k8s-device-plugin:v0.20.0"  # from -e
    assert runs_started(state_dir) == []

    # Re-running into the same directory replaces gpustack's own files.
    proc = run_cli("manifests", str(inv), "-d", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "50-servicemonitor-dcgm-exporter.yaml" not in _load(out)
    assert "30-daemonset-gpu-feature-discovery.yaml" in _load(out)


def test_bad_input_exits_2_and_writes_nothing(tmp_path, inv, state_dir):
    out = tmp_path / "out"
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine\n")
    split = tmp_path / "split.ini"
    split.write_text("[gpu_nodes]\na gpustack_k8s_namespace=x\nb gpustack_k8s_namespace=y\n")
    cases = [
        (
            ["-e", "gpustack_k8s_mig_strategy=auto"],
            "gpustack_k8s_mig_strategy=auto",
            "none, single or mixed",
        ),
        (["-e", "gpustack_k8s_time_slicing_replicas=0"], "greater than or equal to 1", ""),
        (["-e", "gpustack_k8s_namespace=GPU"], "not a valid namespace name", ""),
        (["-e", "gpustack_k8s_device_plugin_image=nvcr.io/x:1"], "not an image repository", ""),
        (
            ["-e", "gpustack_k8s_namspace=gpu"],
            "unknown variable gpustack_k8s_namspace",
            "gpustack_k8s_namespace",
        ),
        # group_vars/all.yml turns time-slicing on: MPS on top of it is refused
        (
            ["-e", "gpustack_k8s_mps_replicas=2"],
            "gpustack_k8s_time_slicing_replicas=3 and gpustack_k8s_mps_replicas=2",
            "default",
        ),
        (
            [
                "-e",
                "gpustack_k8s_mps_replicas=2",
                "-e",
                "gpustack_k8s_time_slicing_replicas=1",
                "-e",
                "gpustack_k8s_mig_strategy=single",
            ],
            "MPS sharing does not work with MIG",
            "",
        ),
        (["-e", "nvidia_driver_branch=r580"], "is not a driver branch", ""),
    ]
    for extra, message, hint in cases:
        proc = run_cli("manifests", str(inv), "--output-dir", str(out), *extra)
        assert proc.returncode == 2, (extra, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert lines[0].startswith("Error: ") and message in lines[0], (extra, proc.stderr)
        assert lines[1].startswith("Hint: ") and hint in lines[1], (extra, proc.stderr)
        assert "Traceback" not in proc.stderr + proc.stdout
        assert not out.exists(), extra
    proc = run_cli("manifests", str(inv), "--output-dir", str(foreign))
    assert proc.returncode == 2 and "did not write (notes.txt)" in proc.stderr
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    proc = run_cli("manifests", str(split), "--output-dir", str(out))
    assert proc.returncode == 2 and "differs between hosts" in proc.stderr
    proc = run_cli("manifests", str(inv))
    assert proc.returncode == 2 and "Missing option '--output-dir'" in proc.stderr
    proc = run_cli("manifests", str(tmp_path / "nope.ini"), "-d", str(out))
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    assert not out.exists()
    assert runs_started(state_dir) == []
