# -*- coding: utf-8 -*-
"""Pure helpers of the nvidia_driver role: repository paths, version resolution, unload order.

Kept free of Ansible imports at module level (except the error type) so unit tests can load
this file directly.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover - only without ansible-core
    AnsibleFilterError = ValueError

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


def _split(version):
    epoch, _, rest = version.rpartition(":") if ":" in version else ("0", "", version)
    upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "0")
    return int(epoch or 0), upstream, revision


def _order(char):
    if char == "~":
        return -1
    if char.isalpha():
        return ord(char)
    return ord(char) + 256 if char else 0


def _compare_part(a, b):
    """dpkg's verrevcmp: alternate non-digit and digit runs."""
    while a or b:
        na = re.match(r"^[^0-9]*", a).group(0)
        nb = re.match(r"^[^0-9]*", b).group(0)
        for i in range(max(len(na), len(nb))):
            ca = _order(na[i] if i < len(na) else "")
            cb = _order(nb[i] if i < len(nb) else "")
            if ca != cb:
                return -1 if ca < cb else 1
        a, b = a[len(na) :], b[len(nb) :]
        da = re.match(r"^[0-9]*", a).group(0)
        db = re.match(r"^[0-9]*", b).group(0)
        if int(da or 0) != int(db or 0):
            return -1 if int(da or 0) < int(db or 0) else 1
        a, b = a[len(da) :], b[len(db) :]
    return 0


def debian_version_compare(a, b):
    """-1, 0 or 1 as dpkg --compare-versions would say."""
    ea, ua, ra = _split(a)
    eb, ub, rb = _split(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _compare_part(ua, ub) or _compare_part(ra, rb)


def upstream_version(version):
    """'535.261.03' from '535.261.03-1', '3:580.95.05-1ubuntu1' or '580.95.05-1.el9'."""
    if not version:
        return ""
    return _split(str(version))[1]


def driver_branch(version):
    return upstream_version(version).split(".")[0] if version else ""


def resolve_version(available, branch="", version="", source="distro"):
    """Pick the exact package version to install, or fail with a message that helps."""
    available = [v for v in (available or []) if v]
    branch = str(branch or "").strip()
    version = str(version or "").strip()
    if version and branch and driver_branch(version) != branch:
        raise AnsibleFilterError(
            "nvidia_driver_version %s is not on branch %s; set one or make them agree"
            % (version, branch)
        )
    if not available:
        raise AnsibleFilterError(
            "no NVIDIA driver package is available from source %r (repository unreachable or "
            "component not enabled?)" % source
        )
    listing = ", ".join(sorted(set(available), key=_SortKey, reverse=True)[:8])
    if version:
        if version in available:
            return version
        raise AnsibleFilterError(
            "NVIDIA driver version %s is not available from source %r; available: %s"
            % (version, source, listing)
        )
    candidates = [v for v in available if not branch or driver_branch(v) == branch]
    if not candidates:
        raise AnsibleFilterError(
            "no NVIDIA driver on branch %s from source %r; available: %s"
            % (branch, source, listing)
        )
    return sorted(candidates, key=_SortKey)[-1]


class _SortKey(object):
    def __init__(self, version):
        self.version = version

    def __lt__(self, other):
        return debian_version_compare(self.version, other.version) < 0

    def __eq__(self, other):
        return debian_version_compare(self.version, other.version) == 0


def madison_versions(text):
    """Versions from `apt-cache madison PKG` output ('pkg | version | source')."""
    versions = []
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 3 and parts[1] and parts[1] not in versions:
            versions.append(parts[1])
    return versions


def unload_order(modules):
    """nvidia modules loaded (from /proc/modules names), in the order they can be removed."""
    names = [m for m in modules or [] if m.startswith("nvidia")]

    def rank(name):
        for marker, value in UNLOAD_RANK:
            if marker in name:
                return value
        return 9

    return sorted(names, key=lambda n: (rank(n), n))


def nvrm_version(text):
    """Loaded driver version from /proc/driver/nvidia/version ('' when none is loaded)."""
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text or "")
    return match.group(1) if match else ""


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
        same = sorted((v for v in versions if driver_branch(v) == branch), key=_SortKey)
        upstream = upstream_version(target)
        exact = [v for v in same if upstream_version(v) == upstream]
        older = [v for v in same if debian_version_compare(upstream_version(v), upstream) <= 0]
        for choice in (exact, older, same):
            if choice:
                found[name] = choice[-1]
                break
    return found


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
        }
