"""Real GPUs after `molecule converge -s gpu`: driver loaded at the installed version, the
container toolkit wired, a container started through the nvidia runtime sees the GPUs, and,
with GPUSTACK_GPU_KUBECONFIG, `gpustack verify` passes for the cluster.

A host whose driver is not a package and is kept (`nvidia_driver_preinstalled=keep`, e.g. a
driver tree under /usr/local/nvidia) is checked for what gpustack promises there: the loaded
driver answers, and gpustack pinned, held and enabled nothing of it."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import SEARCH_PATH, nvidia_smi, run_ok

NVIDIA_BINARY = "/usr/bin/nvidia-container-runtime"
# A CUDA base image (any image works: the NVIDIA runtime injects nvidia-smi and the driver
# libraries). Override for a registry mirror.
TEST_IMAGE = os.environ.get(
    "GPUSTACK_GPU_TEST_IMAGE", "docker.io/nvidia/cuda:12.8.1-base-ubuntu24.04"
)


DRIVER_PIN = "/etc/apt/preferences.d/gpustack-nvidia-driver.pref"


def driver_kept(host) -> bool:
    """The inventory keeps a preinstalled driver that is not a package (gpustack leaves it)."""
    return host.ansible.get_variables().get("nvidia_driver_preinstalled") == "keep"


def uuids(lines: list[str]) -> list[str]:
    return sorted(re.findall(r"UUID: (GPU-[0-9a-f-]+)", "\n".join(lines)))


def test_nvidia_smi_lists_every_nvidia_pci_device(host, gpu_names):
    # NVIDIA (vendor 10de) display controllers: VGA 0300 and 3D 0302 classes.
    pci = run_ok(host, "lspci -n -d 10de:").splitlines()
    devices = [line for line in pci if re.search(r" 03(00|02): ", line)]
    assert len(gpu_names) == len(devices), (gpu_names, pci)


def test_loaded_module_matches_the_installed_driver(host, gpu_names):
    loaded = host.file("/sys/module/nvidia/version").content_string.strip()
    if driver_kept(host):
        # No module on disk to compare with (it is not a package here): the loaded driver answers
        # at one version everywhere, and gpustack wrote no pin for it.
        smi = nvidia_smi(host, "--query-gpu=driver_version --format=csv,noheader").split()
        assert set(smi) == {loaded}
        assert f"Kernel Module  {loaded}" in host.file("/proc/driver/nvidia/version").content_string
        assert not host.file(DRIVER_PIN).exists, "a kept driver must not be pinned"
        return
    on_disk = run_ok(host, "modinfo -F version nvidia").strip()
    assert loaded == on_disk, f"loaded {loaded}, installed module {on_disk}: reboot required"
    smi = nvidia_smi(host, "--query-gpu=driver_version --format=csv,noheader").split()
    assert set(smi) == {loaded}
    assert f"Kernel Module  {loaded}" in host.file("/proc/driver/nvidia/version").content_string
    pin = host.file("/etc/apt/preferences.d/gpustack-nvidia-driver.pref")
    if pin.exists:  # apt hosts: the pinned package version carries the same upstream version
        pinned = re.search(r"^Pin: version (\S+)", pin.content_string, re.M).group(1)
        assert pinned.split("-")[0].split(":")[-1] == loaded, (pinned, loaded)


def test_driver_and_toolkit_are_held(host):
    if not host.exists("apt-mark"):
        pytest.skip("not an apt host: holds are checked on Debian and Ubuntu")
    holds = set(run_ok(host, "apt-mark showhold").split())
    assert "nvidia-container-toolkit" in holds, holds
    toolkit = {"nvidia-container-toolkit", "nvidia-container-toolkit-base"}
    driver_holds = [h for h in holds - toolkit if h.startswith(("cuda-drivers", "nvidia-"))]
    if driver_kept(host):
        assert driver_holds == [], f"a kept driver is left alone: {driver_holds}"
    else:
        assert driver_holds, holds


def test_persistenced_runs(host, gpu_names):
    if driver_kept(host):
        pytest.skip("a kept preinstalled driver: gpustack installs and enables no persistenced")
    assert host.service("nvidia-persistenced").is_running


def test_container_through_the_nvidia_runtime_sees_the_gpus(host, gpu_names):
    env = [
        "--env",
        "NVIDIA_VISIBLE_DEVICES=all",
        "--env",
        "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
    ]
    name = f"gpustack-molecule-{host.backend.get_hostname()}".replace(".", "-")
    # The runtime mounts nvidia-smi at its host path (/usr/local/nvidia/bin for a driver tree).
    inside_command = ["sh", "-c", f"{SEARCH_PATH}; nvidia-smi -L"]
    if host.exists("ctr") and host.service("containerd").is_running:
        local = host.run(shlex.join(["ctr", "--namespace", "gpustack", "images", "ls", "-q"]))
        if TEST_IMAGE not in local.stdout.split():  # a host without a registry imports it first
            run_ok(host, shlex.join(["ctr", "--namespace", "gpustack", "images", "pull",
                                     TEST_IMAGE]))  # fmt: skip
        command = ["ctr", "--namespace", "gpustack", "run", "--rm", "--runc-binary", NVIDIA_BINARY,
                   *env, TEST_IMAGE, name, *inside_command]  # fmt: skip
    elif host.exists("docker"):
        command = ["docker", "run", "--rm", "--runtime", "nvidia", "--name", name,
                   *env, TEST_IMAGE, *inside_command]  # fmt: skip
    else:
        raise AssertionError("neither containerd nor docker runs on this host")
    inside = run_ok(host, shlex.join(command)).splitlines()
    assert uuids(inside) == uuids(gpu_names), (inside, gpu_names)


@pytest.mark.skipif(
    not os.environ.get("GPUSTACK_GPU_KUBECONFIG"), reason="GPUSTACK_GPU_KUBECONFIG is not set"
)
def test_gpustack_verify_passes_on_the_cluster():
    kubeconfig = os.environ["GPUSTACK_GPU_KUBECONFIG"]
    proc = subprocess.run(
        [sys.executable, "-m", "gpustack", "verify", os.environ["GPUSTACK_GPU_INVENTORY"],
         "--kubeconfig", kubeconfig],
        capture_output=True, text=True, timeout=1200,
        cwd=Path(os.environ["MOLECULE_PROJECT_DIRECTORY"]),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
