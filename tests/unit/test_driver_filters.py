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


H100, H200, L4, T4, V100, P100, B200, GH200 = (
    "0x2330", "0x2335", "0x27b8", "0x1eb8", "0x1db4", "0x15f8", "0x2901", "0x2342",
)  # fmt: skip


def gpus(*ids):
    return [{"device_id": i, "class": "030200", "model": ""} for i in ids]


@pytest.mark.parametrize(
    ("setting", "branch", "devices", "expected_open"),
    [
        # auto, as nvidia-installer recommends and the GPU Operator's "auto" installs
        ("auto", "580", gpus(H100, H100), True),  # Hopper, 560 or later: open
        ("auto", "570", gpus(L4), True),
        ("auto", "580", gpus(T4), True),  # Turing is the first with GSP
        ("auto", "555", gpus(H200), False),  # before 560 the installer defaulted to proprietary
        ("auto", "535", gpus(L4), False),
        ("auto", "580", gpus(V100), False),  # Volta: no GSP, no open modules
        ("auto", "580", gpus(P100, H100), False),  # one GPU without them decides
        ("auto", "580", gpus(B200), True),  # Blackwell needs them
        ("auto", "535", gpus(GH200), True),  # self-hosted Grace Hopper needs them
        ("auto", "580", [], False),  # no GPU: the installer recommends proprietary
        ("auto", "", gpus(H100), False),  # branch not known yet (distro, before the lists)
        # explicit settings win, in any of Ansible's boolean spellings
        (True, "535", gpus(V100), True),
        ("false", "580", gpus(H100), False),
        ("False", "580", gpus(B200), False),
        ("yes", "580", [], True),
    ],
)
def test_kernel_module_type(setting, branch, devices, expected_open):
    choice = f.kernel_module_type(setting, branch, devices)
    assert choice["open"] is expected_open
    assert choice["reason"]


def test_kernel_module_type_names_why():
    assert f.kernel_module_type("auto", "535", gpus(H100))["reason"] == (
        "auto: branch 535 (open is the default from 560)"
    )
    assert f.kernel_module_type("auto", "580", gpus(P100))["reason"] == (
        "auto: GPU 0x15f8 has no open modules"
    )
    assert (
        "0x2901 needs the open modules" in f.kernel_module_type("auto", "580", gpus(B200))["reason"]
    )


def test_auto_keeps_the_kind_of_an_installed_driver():
    keep = f.kernel_module_type("auto", "580", gpus(H100), "proprietary")
    assert keep == {
        "open": False,
        "reason": "auto: keeps the installed driver's proprietary modules",
    }
    assert f.kernel_module_type("auto", "535", gpus(V100), "open")["open"]
    assert f.kernel_module_type("true", "580", gpus(H100), "proprietary")["open"]
    assert f.kernel_module_type("auto", "580", gpus(H100), None)["open"]
    # the installed kind agrees with the rule: the rule's reason, as the first install said it
    assert f.kernel_module_type("auto", "580", [], "proprietary") == {
        "open": False,
        "reason": "auto: no NVIDIA GPU found (nvidia-installer's choice)",
    }


def test_kernel_module_type_refuses_other_words():
    with pytest.raises(f.AnsibleFilterError, match="use auto, true or false"):
        f.kernel_module_type("perhaps", "580", [])


@pytest.mark.parametrize(
    ("installed", "kind"),
    [
        (["nvidia-kernel-dkms", "nvidia-driver-libs"], "proprietary"),  # Debian
        (["nvidia-open-kernel-dkms", "nvidia-driver-libs"], "open"),
        (["nvidia-headless-580-server-open", "nvidia-dkms-580-server-open"], "open"),  # Ubuntu
        (["nvidia-headless-580-server", "nvidia-dkms-580-server"], "proprietary"),
        (["cuda-drivers-580", "cuda-drivers", "nvidia-driver-580"], "proprietary"),  # CUDA repo
        (["nvidia-driver-580-open", "nvidia-kernel-open-dkms"], "open"),
        (["kmod-nvidia-open-dkms", "nvidia-driver"], "open"),  # EL
        (["nvidia-driver-libs"], None),  # no module package: nothing to keep
    ],
)
def test_the_probe_reads_the_installed_kind(installed, kind):
    from tests.unit.host_modules import load as load_module

    probe = load_module("plugins/modules/gpustack_host_probe.py", "probe_kernel_kind")
    assert probe.kernel_module_kind(installed) == kind
