# -*- coding: utf-8 -*-
"""Pure helpers of the nvidia_driver role: repository paths, version resolution, unload order.

Filter plugins run on the controller: version parsing, comparison and resolution come from
the collection's module_utils/gpustack_driver_version.py, shared with the CLI. Kept free of
Ansible imports at module level (except the error type) so unit tests can load this file directly.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import sys

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - only without ansible-core
    AnsibleFilterError = ValueError

try:
    from ansible_collections.gpustack.gpustack.plugins.module_utils import (
        gpustack_driver_version as driver_version,
    )
except ImportError:  # loaded as a file, outside Ansible's collection loader (unit tests)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../module_utils"))
    import gpustack_driver_version as driver_version

# The one driver-version vocabulary (module_utils/gpustack_driver_version.py), under the names
# the role uses.
debian_version_compare = driver_version.compare
upstream_version = driver_version.upstream_version
driver_branch = driver_version.branch_of
nvrm_version = driver_version.nvrm_version
madison_versions = driver_version.madison_versions

RHEL_LIKE = ("rhel", "centos", "rocky", "almalinux", "ol")
ARCH_DIRS = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "sbsa", "arm64": "sbsa"}
# Unload order: users of the core module first, the core module last.
UNLOAD_RANK = (("drm", 0), ("modeset", 1), ("uvm", 2), ("peermem", 3), ("fs", 4))


def cuda_repo_path(os_id, version_id, arch):
    """NVIDIA CUDA network repo directory for a host: 'ubuntu2204/x86_64', 'rhel9/sbsa'."""
    os_id = (os_id or "").lower()
    arch_dir = ARCH_DIRS.get(arch)
    if not arch_dir:
        raise AnsibleFilterError("no CUDA repository for architecture %r" % arch)
    major = (version_id or "").split(".")[0]
    if os_id == "ubuntu" and version_id:
        dist = "ubuntu" + version_id.replace(".", "")
    elif os_id == "debian" and major:
        dist = "debian" + major
    elif os_id in RHEL_LIKE and major:
        dist = "rhel" + major
    else:
        raise AnsibleFilterError(
            "no CUDA repository for %s %s: use nvidia_driver_source=distro or mirror"
            % (os_id or "unknown OS", version_id or "")
        )
    return "%s/%s" % (dist, arch_dir)


def resolve_version(available, branch="", version="", source="distro"):
    """Pick the exact package version to install, or fail with a message that helps."""
    try:
        return driver_version.resolve(available, branch, version, source)
    except driver_version.VersionError as exc:
        raise AnsibleFilterError(str(exc)) from None


def unload_order(modules):
    """nvidia modules loaded (from /proc/modules names), in the order they can be removed."""
    names = [m for m in modules or [] if m.startswith("nvidia")]

    def rank(name):
        for marker, value in UNLOAD_RANK:
            if marker in name:
                return value
        return 9

    return sorted(names, key=lambda n: (rank(n), n))


def smi_gpus(text):
    """GPUs from `nvidia-smi --query-gpu=name,uuid,memory.total --format=csv,noheader,nounits`."""
    gpus = []
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[1].startswith(("GPU-", "MIG-")):
            memory = int(parts[2]) if parts[2].isdigit() else None
            gpus.append({"name": parts[0], "uuid": parts[1], "memory_mib": memory})
    return gpus


def url_credentials(url):
    """[username, password] from user:password@ in a URL (percent-decoded), else ['', '']."""
    try:
        from urllib.parse import unquote, urlsplit
    except ImportError:  # pragma: no cover - Python 2 controllers are not supported
        return ["", ""]
    netloc = urlsplit(url or "").netloc
    if "@" not in netloc:
        return ["", ""]
    username, _, password = netloc.rpartition("@")[0].partition(":")
    return [unquote(username), unquote(password)]


def companion_versions(madison, companions, target, source="distro"):
    """{package: version} for the driver's companion packages (persistenced, modprobe, ...).

    From NVIDIA's repository they exist at the driver's exact version: that one. Debian ships
    them from separate source packages with their own versions; the one released with the
    driver is the same upstream version when offered, else the newest not newer than the
    driver, else the newest of its branch (e.g. bookworm's 535.261.03 driver came with
    nvidia-modprobe 535.161.07, its 535.309.01 security update with nvidia-modprobe 535.309.01).
    A companion with none of these is left out (the caller reports it).
    """
    offered = {}
    for line in (madison or "").splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 3 and parts[0] in companions and parts[1]:
            offered.setdefault(parts[0], []).append(parts[1])
    branch = driver_branch(target)
    found = {}
    for name in companions:
        versions = offered.get(name) or []
        if source != "distro":
            if target in versions:
                found[name] = target
            continue
        same = sorted(
            (v for v in versions if driver_branch(v) == branch), key=driver_version.sort_key
        )
        upstream = upstream_version(target)
        exact = [v for v in same if upstream_version(v) == upstream]
        older = [v for v in same if debian_version_compare(upstream_version(v), upstream) <= 0]
        for choice in (exact, older, same):
            if choice:
                found[name] = choice[-1]
                break
    return found


# nvidia_driver_open_kernel_modules=auto, as the GPU Operator's default kernelModuleType "auto"
# (deployments/gpu-operator/values.yaml@a22dbf67). Its driver container resolves "auto" with
# `nvidia-installer --print-recommended-kernel-module-type`, and by driver branch when that fails
# (branch < 560: proprietary; NVIDIA/gpu-driver-container ubuntu22.04/nvidia-driver@06a208ca,
# _resolve_kernel_type and _resolve_kernel_type_from_driver_branch). nvidia-installer's
# recommendation (NVIDIA/nvidia-installer@00aaa9f9, 590.48.01: misc.c pci_device_scan,
# kernel.c valid_kernel_module_types, detect-self-hosted.h), per NVIDIA GPU on the PCI bus:
# - a self-hosted (Grace) Hopper or Blackwell GPU requires the open modules;
# - a GPU without GSP cannot run them: device ids 0x1340-0x1dff (Maxwell, Pascal, Volta) are
#   taken as such; Turing (0x1e00) and newer have GSP;
# - open is valid only when at least one GPU is present and every GPU supports it, and it is
#   the default among valid types from 560 on (kernel.c default_type OPEN since 560.28.03,
#   PROPRIETARY up to 555.58.02).
# NVIDIA requires the open modules on Blackwell (device ids from 0x2900 on; the installer has no
# flag for it because no branch before 560 drives Blackwell): required here as well.
OPEN_MODULES_FROM_BRANCH = 560
_SELF_HOSTED = ((0x2340, 0x237F), (0x2940, 0x297F), (0x31C0, 0x31FF), (0x31A1, 0x31A1))
_NO_GSP = (0x1340, 0x1DFF)
_BLACKWELL = 0x2900
_AUTO = "auto"
_TRUE = ("true", "yes", "on", "1", "y")
_FALSE = ("false", "no", "off", "0", "n")


def _device_id(device):
    raw = device.get("device_id") if isinstance(device, dict) else device
    try:
        return int(str(raw or ""), 16)
    except ValueError:
        return None


def kernel_module_type(setting, branch="", devices=None, installed=None):
    """{'open': bool, 'reason': str}: the kernel modules to install. `setting` is
    nvidia_driver_open_kernel_modules (auto, or a boolean); `branch` the driver branch ('' when
    not known yet); `devices` gpu_preflight's gpus.devices (device_id "0x2335");
    `installed` the kind of the driver installed now, open or proprietary (gpu_preflight's
    driver.installed.kernel_modules; None when none is)."""
    text = str(setting).strip().lower()
    if text in _TRUE:
        return {"open": True, "reason": "nvidia_driver_open_kernel_modules=true"}
    if text in _FALSE:
        return {"open": False, "reason": "nvidia_driver_open_kernel_modules=false"}
    if text != _AUTO:
        raise AnsibleFilterError(
            "nvidia_driver_open_kernel_modules=%s: use auto, true or false" % setting
        )
    choice = _auto_choice(branch, devices)
    if installed in ("open", "proprietary") and choice["open"] != (installed == "open"):
        # auto never switches an installed driver between the two kinds (packages of one kind
        # conflict with the other's): that takes true or false. Where the rule agrees with the
        # installed kind, its reason stands, so the reason a first install published does not
        # change on the runs after it.
        return {
            "open": installed == "open",
            "reason": "auto: keeps the installed driver's %s modules" % installed,
        }
    return choice


def _auto_choice(branch, devices):
    """auto's rule without an installed driver: the GPUs, then the branch."""
    ids = [_device_id(d) for d in devices or []]
    ids = [i for i in ids if i is not None]
    required = [i for i in ids if i >= _BLACKWELL or any(lo <= i <= hi for lo, hi in _SELF_HOSTED)]
    if required:
        return {"open": True, "reason": "auto: GPU 0x%04x needs the open modules" % required[0]}
    unsupported = [i for i in ids if _NO_GSP[0] <= i <= _NO_GSP[1]]
    if not ids:
        return {"open": False, "reason": "auto: no NVIDIA GPU found (nvidia-installer's choice)"}
    if unsupported:
        return {"open": False, "reason": "auto: GPU 0x%04x has no open modules" % unsupported[0]}
    branch = str(branch or "").strip()
    if not branch.isdigit():
        return {"open": False, "reason": "auto: driver branch not known yet"}
    if int(branch) < OPEN_MODULES_FROM_BRANCH:
        return {"open": False, "reason": "auto: branch %s (open is the default from 560)" % branch}
    return {"open": True, "reason": "auto: branch %s, every GPU supports them" % branch}


def package_specs(versions, names):
    """["name=version", ...] for `names` that have a version in `versions`."""
    return ["%s=%s" % (name, versions[name]) for name in names if name in versions]


class FilterModule(object):
    def filters(self):
        return {
            "nvidia_driver_cuda_repo_path": cuda_repo_path,
            "nvidia_driver_resolve_version": resolve_version,
            "nvidia_driver_madison_versions": madison_versions,
            "nvidia_driver_upstream_version": upstream_version,
            "nvidia_driver_branch_of": driver_branch,
            "nvidia_driver_unload_order": unload_order,
            "nvidia_driver_smi_gpus": smi_gpus,
            "nvidia_driver_nvrm_version": nvrm_version,
            "nvidia_driver_url_credentials": url_credentials,
            "nvidia_driver_companion_versions": companion_versions,
            "nvidia_driver_package_specs": package_specs,
            "nvidia_driver_kernel_module_type": kernel_module_type,
        }
