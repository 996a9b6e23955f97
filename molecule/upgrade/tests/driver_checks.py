"""Checks shared by tests/old and tests/new: the driver is exactly at one version, pinned, held."""

from __future__ import annotations

import re

DRIVER_PACKAGES = ("nvidia-kernel-dkms", "nvidia-smi", "libcuda1", "nvidia-kernel-support")
HELD = ("nvidia-kernel-dkms", "nvidia-smi", "libcuda1")


def run_ok(host, command: str) -> str:
    result = host.run(command)
    assert result.rc == 0, f"{command}: rc={result.rc} {result.stderr}"
    return result.stdout


def assert_driver_at(host, version: str, other: str) -> None:
    for package in DRIVER_PACKAGES:
        pkg = host.package(package)
        assert pkg.is_installed, package
        assert pkg.version == version, f"{package} {pkg.version}, expected {version}"
    # Every installed package built from the driver's source is at that version and fully
    # installed (no half-configured leftovers of the other version).
    fields = "${Package} ${Version} ${source:Package} ${db:Status-Abbrev}"
    rows = run_ok(host, f"dpkg-query -W -f='{fields}\\n'")
    driver_rows = [row.split() for row in rows.splitlines() if " nvidia-graphics-drivers " in row]
    assert len(driver_rows) >= len(DRIVER_PACKAGES), rows
    for package, installed, _source, status in driver_rows:
        assert installed == version, f"{package} {installed}, expected {version}"
        assert status in ("ii", "hi"), f"{package} is in dpkg state {status}"
    pin = host.file("/etc/apt/preferences.d/gpustack-nvidia-driver.pref").content_string
    assert f"Pin: version {version}" in pin and "Pin-Priority: 1001" in pin
    holds = set(run_ok(host, "apt-mark showhold").split())
    assert set(HELD) <= holds, holds
    policy = run_ok(host, "apt-cache policy nvidia-smi")
    assert re.search(rf"Installed: {re.escape(version)}$", policy, re.M), policy
    assert re.search(rf"Candidate: {re.escape(version)}$", policy, re.M), policy
    # The other version is really offered by the archive: the pin, not its absence, decides.
    assert other in policy, policy
