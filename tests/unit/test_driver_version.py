"""The one driver-version vocabulary (gpustack/driver_version.py), on version strings as the
archives really publish them: Debian, Ubuntu, NVIDIA's CUDA repository and EL."""

import pytest

from gpustack import driver_version as dv
from gpustack.ansible.input_formats import check_extra_vars
from gpustack.errors import BadInput
from gpustack.fleet import doctor
from gpustack.fleet.status import desired_driver
from gpustack.upgrade.backend import HostOutcome
from gpustack.upgrade.orchestrator import check_host
from gpustack.upgrade.state import Target
from tests.unit.test_driver_filters import load

filters = load("plugins/filter/nvidia_driver.py", "nd_filters_vocab")

REAL = [
    # (package version, upstream, branch, epoch) — where each comes from
    ("535.261.03-1~deb12u1", "535.261.03", "535", 0),  # Debian 12 non-free
    ("1:550.163.01-1", "550.163.01", "550", 1),  # Debian with an epoch
    ("535.230.02-0ubuntu0.22.04.1", "535.230.02", "535", 0),  # Ubuntu 22.04 restricted
    ("570.172.08-1", "570.172.08", "570", 0),  # CUDA repository, Debian/Ubuntu
    ("575.57.08-0ubuntu1", "575.57.08", "575", 0),  # CUDA repository, Ubuntu
    ("3:570.172.08-1.el9", "570.172.08", "570", 3),  # CUDA repository, EL9 (dnf module)
    ("535.309.01-0+deb12u1", "535.309.01", "535", 0),  # Debian 12 security update
]


@pytest.mark.parametrize(("version", "upstream", "branch", "epoch"), REAL)
def test_real_versions_split_into_epoch_upstream_branch(version, upstream, branch, epoch):
    assert dv.split(version)[0] == epoch
    assert dv.upstream_version(version) == upstream
    assert dv.branch_of(version) == branch
    assert dv.on_branch(version, branch)
    assert not dv.on_branch(version, branch + "0")  # 5350 is not 535
    assert dv.loaded_is_installed(version, upstream)  # what /proc/driver/nvidia/version says
    assert not dv.loaded_is_installed(version, "999.99.99")
    assert dv.same_version(version, version) and dv.same_version(version, dv.without_epoch(version))


def test_epochs_compare_like_dpkg_but_same_version_ignores_a_missing_one():
    assert dv.compare("1:550.163.01-1", "570.172.08-1") == 1  # the epoch wins
    assert dv.compare("535.261.03-1~deb12u1", "535.261.03-1") == -1  # ~ sorts before all
    assert dv.compare("535.309.01-0+deb12u1", "535.261.03-1~deb12u1") == 1
    assert dv.compare("575.57.08-0ubuntu1", "575.57.08-1") == -1
    assert dv.same_version("1:550.163.01-1", "550.163.01-1")
    assert not dv.same_version("550.163.01-1", "550.163.01-2")
    assert not dv.same_version("", "")


def test_nvrm_line_of_proprietary_and_open_modules():
    proprietary = (
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.261.03  Wed Jul  9 2025\n"
        "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
    )
    open_module = (
        "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.172.08  Release Build"
    )
    assert dv.nvrm_version(proprietary) == "535.261.03"
    assert dv.nvrm_version(open_module) == "570.172.08"
    assert dv.nvrm_version("") == ""


def test_resolve_picks_newest_of_a_branch_with_epochs_and_says_why_not():
    offered = ["1:550.163.01-1", "535.261.03-1~deb12u1", "535.309.01-0+deb12u1"]
    assert dv.resolve(offered, branch="535") == "535.309.01-0+deb12u1"
    assert dv.resolve(offered) == "1:550.163.01-1"
    with pytest.raises(dv.VersionError, match="no NVIDIA driver on branch 580"):
        dv.resolve(offered, branch="580", source="distro")
    with pytest.raises(dv.VersionError, match="is not on branch 550"):
        dv.resolve(offered, branch="550", version="535.261.03-1~deb12u1")


def test_the_filter_plugin_speaks_the_same_vocabulary():
    assert filters.upstream_version("3:570.172.08-1.el9") == dv.upstream_version(
        "3:570.172.08-1.el9"
    )
    assert filters.driver_branch("575.57.08-0ubuntu1") == "575"
    assert filters.debian_version_compare("1:550.163.01-1", "570.172.08-1") == 1
    assert filters.resolve_version(["570.172.08-1", "575.57.08-1"], "570") == "570.172.08-1"
    with pytest.raises(filters.AnsibleFilterError, match="not available"):
        filters.resolve_version(["570.172.08-1"], "", "575.57.08-1", "cuda")


def test_upgrade_and_status_agree_on_epochs():
    """The fleet pinned without the epoch, the host reports it with one: both call it done."""
    installed = "1:550.163.01-1"
    assert Target(version="550.163.01-1").matches(installed)
    want = desired_driver({"nvidia_driver_version": "550.163.01-1"}, None)
    assert want.version == "550.163.01-1" and dv.same_version(installed, want.version)
    assert not Target(version="550.163.01-2").matches(installed)
    assert Target(branch="550").matches(installed) and not Target(branch="55").matches(installed)


def test_doctor_says_loaded_for_an_epoch_package_and_reboot_when_it_differs():
    facts = {"driver": {"installed": {"version": "1:550.163.01-1"}, "loaded_version": "550.163.01"}}
    assert doctor.driver_state(facts) == "loaded 550.163.01"
    facts["driver"]["loaded_version"] = "535.261.03"
    assert doctor.driver_state(facts).endswith("reboot required")


def test_upgrade_validation_reads_the_published_reboot_boolean():
    target = Target(version="570.172.08-1")
    driver = {"installed_version": "570.172.08-1", "held": True, "state": "loaded 570.172.08"}
    assert check_host(target, HostOutcome(True, driver={**driver, "reboot_required": False})) == ""
    pending = check_host(target, HostOutcome(True, driver={**driver, "reboot_required": True}))
    assert "reboot" in pending and "nvidia_driver_reboot=if_needed" in pending


def test_input_check_uses_the_same_branch_rule():
    check_extra_vars({"nvidia_driver_version": "3:570.172.08-1.el9", "nvidia_driver_branch": "570"})
    with pytest.raises(BadInput, match="is not on branch 57"):
        check_extra_vars({"nvidia_driver_version": "570.172.08-1", "nvidia_driver_branch": "57"})


# `apt-cache madison nvidia-kernel-dkms linux-headers-… nvidia-persistenced nvidia-modprobe
# nvidia-settings nvidia-xconfig` on a bookworm lab node (non-free enabled), as the driver role
# runs it: one call for the driver, the kernel headers (none here) and the companions.
MADISON_MANY = (
    "nvidia-kernel-dkms | 535.309.01-0+deb12u1 | http://deb.debian.org/debian-security bookworm-security/non-free amd64 Packages\n"
    "nvidia-kernel-dkms | 535.261.03-1 | http://deb.debian.org/debian bookworm/non-free amd64 Packages\n"
    "nvidia-persistenced | 535.171.04-1~deb12u1 | http://deb.debian.org/debian bookworm/contrib amd64 Packages\n"
    "nvidia-modprobe | 535.309.01-0+deb12u1 | http://deb.debian.org/debian-security bookworm-security/contrib amd64 Packages\n"
    "nvidia-modprobe | 535.161.07-1~deb12u1 | http://deb.debian.org/debian bookworm/contrib amd64 Packages\n"
)  # fmt: skip


def test_madison_of_several_packages_is_read_per_package():
    from gpustack.driver_version import madison_versions

    assert madison_versions(MADISON_MANY, "nvidia-kernel-dkms") == [
        "535.309.01-0+deb12u1",
        "535.261.03-1",
    ]
    assert madison_versions(MADISON_MANY, "nvidia-modprobe") == [
        "535.309.01-0+deb12u1",
        "535.161.07-1~deb12u1",
    ]
    assert madison_versions(MADISON_MANY, "linux-headers-6.18.44-fc-v595") == []
    assert madison_versions("  nvidia-smi | 1.0-1 | src\n", "nvidia-smi") == ["1.0-1"]  # padded
