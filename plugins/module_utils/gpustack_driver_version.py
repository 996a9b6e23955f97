"""The one vocabulary of NVIDIA driver versions, pure (no Ansible, no hosts).

Package versions come as Debian writes them (`[epoch:]upstream[-revision]`: 535.261.03-1~deb12u1,
1:550.163.01-1, 535.230.02-0ubuntu0.22.04.1, 575.57.08-0ubuntu1 from the CUDA repository) or as
EL writes them (3:570.172.08-1.el9); the loaded kernel module reports only the upstream version
(`/proc/driver/nvidia/version`). The nvidia_driver role's filter plugin, `status`, `doctor`,
`upgrade`, the converged-host check and the input checks all use these functions, so they agree
on epochs, branches and "loaded equals installed".

Written for the controller's Python and for the filter plugin alike (no 3.10+ syntax needed).
It lives in the collection's module_utils so the roles' filters find it wherever the collection
is installed (an AWX execution node has no gpustack package); `gpustack/driver_version.py`
loads this file for the CLI.
"""

from __future__ import annotations

import re
from functools import cmp_to_key

_NVRM = re.compile(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)")


class VersionError(ValueError):
    """No version to pick; the message says why and what is available."""


def split(version: str) -> tuple[int, str, str]:
    """(epoch, upstream, revision): '1:550.163.01-1' -> (1, '550.163.01', '1')."""
    version = str(version or "")
    epoch, _, rest = version.partition(":") if ":" in version else ("0", "", version)
    upstream, _, revision = rest.rpartition("-") if "-" in rest else (rest, "", "0")
    return int(epoch) if epoch.isdigit() else 0, upstream, revision


def without_epoch(version: str | None) -> str:
    """'3:570.172.08-1.el9' -> '570.172.08-1.el9'."""
    return re.sub(r"^[0-9]+:", "", str(version or ""))


def upstream_version(version: str | None) -> str:
    """'535.261.03' from '535.261.03-1~deb12u1', '3:580.95.05-1ubuntu1' or '580.95.05-1.el9'."""
    return split(str(version))[1] if version else ""


def branch_of(version: str | None) -> str:
    """'535' from any form of a 535.x version ('' for none)."""
    return upstream_version(version).split(".")[0] if version else ""


def on_branch(version: str | None, branch: str) -> bool:
    """Whether `version` belongs to `branch` (580 holds 580.95.05, not 5800.1)."""
    return bool(version) and branch_of(version) == str(branch).strip()


def same_version(a: str | None, b: str | None) -> bool:
    """The same package version, an epoch written on one side only included ('1:550.163.01-1'
    and '550.163.01-1'): how `status` and `upgrade` both compare installed with desired."""
    return bool(a) and bool(b) and without_epoch(a) == without_epoch(b)


def loaded_is_installed(installed: str | None, loaded: str | None) -> bool:
    """The kernel module that runs is the installed package's (no reboot or reload pending)."""
    return bool(installed) and bool(loaded) and upstream_version(installed) == str(loaded)


def nvrm_version(text: str | None) -> str:
    """Loaded driver version from /proc/driver/nvidia/version ('' when none is loaded)."""
    match = _NVRM.search(text or "")
    return match.group(1) if match else ""


def madison_versions(text: str | None, package: str | None = None) -> list[str]:
    """The versions in `apt-cache madison PKG...` output ('pkg | version | source'), each once, in
    apt's order (newest first); [] when the package lists offer none. With `package`, only that
    package's lines (one madison call may list several packages)."""
    versions: list[str] = []
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split("|")]
        if package and parts[0] != package:
            continue
        if len(parts) >= 3 and parts[1] and parts[1] not in versions:
            versions.append(parts[1])
    return versions


def _order(char: str) -> int:
    if char == "~":
        return -1
    if char.isalpha():
        return ord(char)
    return ord(char) + 256 if char else 0


def _compare_part(a: str, b: str) -> int:
    """dpkg's verrevcmp: alternate non-digit and digit runs."""
    while a or b:
        na = re.match(r"^[^0-9]*", a).group(0)  # type: ignore[union-attr]
        nb = re.match(r"^[^0-9]*", b).group(0)  # type: ignore[union-attr]
        for i in range(max(len(na), len(nb))):
            ca = _order(na[i] if i < len(na) else "")
            cb = _order(nb[i] if i < len(nb) else "")
            if ca != cb:
                return -1 if ca < cb else 1
        a, b = a[len(na) :], b[len(nb) :]
        da = re.match(r"^[0-9]*", a).group(0)  # type: ignore[union-attr]
        db = re.match(r"^[0-9]*", b).group(0)  # type: ignore[union-attr]
        if int(da or 0) != int(db or 0):
            return -1 if int(da or 0) < int(db or 0) else 1
        a, b = a[len(da) :], b[len(db) :]
    return 0


def compare(a: str, b: str) -> int:
    """-1, 0 or 1 as `dpkg --compare-versions` would say."""
    ea, ua, ra = split(a)
    eb, ub, rb = split(b)
    if ea != eb:
        return -1 if ea < eb else 1
    return _compare_part(ua, ub) or _compare_part(ra, rb)


sort_key = cmp_to_key(compare)


def resolve(available: list[str], branch: str = "", version: str = "", source: str = "") -> str:
    """The exact package version to install: `version` when offered, else the newest of
    `branch` (or of everything). Raises VersionError with a message that helps."""
    available = [v for v in (available or []) if v]
    branch = str(branch or "").strip()
    version = str(version or "").strip()
    if version and branch and branch_of(version) != branch:
        raise VersionError(
            f"nvidia_driver_version {version} is not on branch {branch}; set one or make them agree"
        )
    if not available:
        raise VersionError(
            f"no NVIDIA driver package is available from source {source!r} (repository "
            "unreachable or component not enabled?)"
        )
    listing = ", ".join(sorted(set(available), key=sort_key, reverse=True)[:8])
    if version:
        if version in available:
            return version
        raise VersionError(
            f"NVIDIA driver version {version} is not available from source {source!r}; "
            f"available: {listing}"
        )
    candidates = [v for v in available if not branch or branch_of(v) == branch]
    if not candidates:
        raise VersionError(
            f"no NVIDIA driver on branch {branch} from source {source!r}; available: {listing}"
        )
    return sorted(candidates, key=sort_key)[-1]
