"""The lab's operand images (gpustack/lab/operand_images.py) in a lab node's real containerd:
built here from NVIDIA's Go modules and Kubernetes' pause.c, imported with `load_into_node`
into the `k8s.io` namespace (the kubelet's) under the names gpustack renders for the lab, and run
with `ctr run` on the native snapshotter. The node has no GPU: the device plugin must say so
and stop, the verify image has no nvidia-smi of its own."""

from __future__ import annotations

import os
import subprocess

import pytest

from gpustack.lab import components, operand_images
from tests.conftest import lab_nodes
from tests.fixtures import lab_fixtures

pytestmark = pytest.mark.lab

LAB = f"{os.environ.get('GPUSTACK_TEST_LAB_PREFIX', '')}img{os.getpid()}"
CONTAINER = f"gpustack-{LAB}-node1"


def ctr_run(ref: str, name: str, *argv: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["podman", "exec", CONTAINER, "ctr", "-n", "k8s.io", "run", "--rm", "--snapshotter",
         "native", ref, name, *argv],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    images = operand_images.build_all()
    inventory = tmp_path_factory.mktemp("img") / "img.ini"
    with lab_nodes(LAB, 1, inventory):
        lab_fixtures.install_containerd(CONTAINER)
        refs = operand_images.load_into_node(CONTAINER, images.values())
        yield images, refs


def test_every_image_is_listed_under_the_rendered_name(loaded):
    images, refs = loaded
    config = operand_images.lab_config()
    assert config.image("device_plugin") in refs and config.image("verify") in refs
    assert images["pause"].refs[0] in refs
    # a second import of the same archives changes nothing and still succeeds
    assert operand_images.load_into_node(CONTAINER, images.values()) == refs


def test_the_device_plugin_image_runs_nvidias_commands_and_says_there_is_no_gpu(loaded):
    images, _ = loaded
    ref = images["device_plugin"].refs[0]
    version = f"v{components.DEVICE_PLUGIN_VERSION}"
    # config-manager has no --version flag (it prints its version with its usage)
    for command in ("nvidia-device-plugin", "gpu-feature-discovery", "mps-control-daemon"):
        proc = ctr_run(ref, f"{LAB}-{command}", command, "--version")
        assert proc.returncode == 0, proc.stderr
        assert version in proc.stdout, proc.stdout
    # No GPU and no NVIDIA library in the node: with the default fail-on-init-error the plugin
    # exits non-zero saying NVML cannot be loaded (never a device it does not have). Its socket
    # directory comes first (the kubelet's hostPath in a cluster).
    proc = ctr_run(ref, f"{LAB}-plugin", "sh", "-c",
                   "mkdir -p /var/lib/kubelet/device-plugins && exec nvidia-device-plugin")  # fmt: skip
    assert proc.returncode != 0
    assert "Failed to initialize NVML: ERROR_LIBRARY_NOT_FOUND" in proc.stdout + proc.stderr


def test_the_verify_image_has_a_shell_and_glibc_but_no_nvidia_smi_of_its_own(loaded):
    images, _ = loaded
    proc = ctr_run(images["verify"].refs[0], f"{LAB}-verify", "sh", "-c",
                   "echo verify-ok; /lib64/ld-linux-x86-64.so.2 --version | head -1; "
                   "command -v nvidia-smi || echo no-nvidia-smi")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "verify-ok" in proc.stdout and "GLIBC" in proc.stdout, proc.stdout
    assert "no-nvidia-smi" in proc.stdout


def test_the_pause_image_is_kubernetes_pause_of_the_pinned_release(loaded):
    images, _ = loaded
    proc = ctr_run(images["pause"].refs[0], f"{LAB}-pause", "/pause", "-v")
    assert proc.returncode == 0, proc.stderr
    tag = images["pause"].refs[0].rsplit(":", 1)[1]
    assert f"pause.c v{tag}-v{components.KUBERNETES_VERSION}" in proc.stdout + proc.stderr
