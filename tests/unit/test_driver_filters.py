"""The nvidia_driver role's pure helpers: OS mapping, version resolution, unload order."""

import importlib.util

import pytest

from tests.conftest import ROOT


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


f = load("plugins/filter/nvidia_driver.py", "nvidia_driver_filters")


@pytest.mark.parametrize(
    ("os_id", "version", "arch", "path"),
    [
        ("ubuntu", "22.04", "x86_64", "ubuntu2204/x86_64"),
        ("ubuntu", "24.04", "aarch64", "ubuntu2404/sbsa"),
        ("debian", "12", "x86_64", "debian12/x86_64"),
        ("rhel", "9.4", "x86_64", "rhel9/x86_64"),
        ("rocky", "8.10", "x86_64", "rhel8/x86_64"),
        ("almalinux", "9.5", "aarch64", "rhel9/sbsa"),
    ],
)
def test_cuda_repo_path(os_id, version, arch, path):
    assert f.cuda_repo_path(os_id, version, arch) == path


@pytest.mark.parametrize(
    ("os_id", "version", "arch", "message"),
    [("arch", "", "x86_64", "no CUDA repository for arch"), ("ubuntu", "22.04", "ppc64le", "")],
)
def test_cuda_repo_path_refuses_unknown(os_id, version, arch, message):
    with pytest.raises(f.AnsibleFilterError, match=message or "architecture"):
        f.cuda_repo_path(os_id, version, arch)


@pytest.mark.parametrize(
    ("a", "b", "result"),
    [
        ("535.309.01-0+deb12u1", "535.261.03-1", 1),
        ("535.261.03-1", "535.261.03-1", 0),
        ("550.163.01-2", "550.163.01-2~deb13u1", 1),
        ("1:535.1-1", "580.1-1", 1),
        ("580.95.05-0ubuntu0.22.04.2", "580.95.05-0ubuntu0.22.04.10", -1),
        ("535.216.03-1~bpo12+1", "535.216.03-1", -1),
    ],
)
def test_debian_version_compare(a, b, result):
    assert f.debian_version_compare(a, b) == result


BOOKWORM = ["535.309.01-0+deb12u1", "535.261.03-1", "535.216.03-1~bpo12+1"]


def test_resolve_exact_version_branch_and_newest():
    assert f.resolve_version(BOOKWORM, "", "535.261.03-1") == "535.261.03-1"
    assert f.resolve_version(BOOKWORM, "535", "") == "535.309.01-0+deb12u1"
    assert f.resolve_version(BOOKWORM + ["550.163.01-2"], "", "") == "550.163.01-2"
    assert f.resolve_version(["1:580.95.05-1", "1:570.1-1"], "580") == "1:580.95.05-1"


@pytest.mark.parametrize(
    ("available", "branch", "version", "message"),
    [
        (BOOKWORM, "", "535.999.99-1", "not available from source 'distro'; available: 535.309"),
        (BOOKWORM, "580", "", "no NVIDIA driver on branch 580"),
        (BOOKWORM, "550", "535.261.03-1", "is not on branch 550"),
        ([], "535", "", "no NVIDIA driver package is available"),
    ],
)
def test_resolve_errors_say_what_is_available(available, branch, version, message):
    with pytest.raises(f.AnsibleFilterError, match=message.replace("+", r"\+")):
        f.resolve_version(available, branch, version)


def test_madison_and_upstream():
    text = (
        "nvidia-smi | 535.309.01-0+deb12u1 | http://deb.debian.org/debian bookworm-updates/"
        "non-free amd64 Packages\n"
        "nvidia-smi | 535.261.03-1 | http://deb.debian.org/debian bookworm/non-free amd64 Packages\n"
    )
    assert f.madison_versions(text) == ["535.309.01-0+deb12u1", "535.261.03-1"]
    assert f.upstream_version("535.309.01-0+deb12u1") == "535.309.01"
    assert f.upstream_version("3:580.95.05-1ubuntu1") == "580.95.05"
    assert f.driver_branch("550.163.01-2") == "550"


def test_unload_order_users_first_core_last():
    loaded = ["nvidia", "nvidia_uvm", "nvidia_drm", "nvidia_modeset", "nvidia_peermem", "ext4"]
    assert f.unload_order(loaded) == [
        "nvidia_drm", "nvidia_modeset", "nvidia_uvm", "nvidia_peermem", "nvidia",
    ]  # fmt: skip
    assert f.unload_order(["nvidia_current_drm", "nvidia_current"]) == [
        "nvidia_current_drm", "nvidia_current",
    ]  # fmt: skip


def test_smi_gpus():
    text = (
        "NVIDIA H100 80GB HBM3, GPU-5b3c4a1e-8f2d-4c6b-9e7a-0123456789ab, 81559\n"
        "NVIDIA H100 80GB HBM3, GPU-6c4d5b2f-9a3e-4d7c-8f8b-123456789abc, 81559\n"
    )
    gpus = f.smi_gpus(text)
    assert [g["uuid"][:12] for g in gpus] == ["GPU-5b3c4a1e", "GPU-6c4d5b2f"]
    assert gpus[0] == {
        "name": "NVIDIA H100 80GB HBM3",
        "uuid": gpus[0]["uuid"],
        "memory_mib": 81559,
    }
    assert f.smi_gpus("NVIDIA-SMI has failed because it couldn't communicate") == []


def test_nvrm_version_parses_both_module_flavours():
    assert (
        f.nvrm_version("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.07  Sat")
        == "535.161.07"
    )
    assert (
        f.nvrm_version(
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release"
        )
        == "580.95.05"
    )
    assert f.nvrm_version("") == ""
