"""python3-apt, which Ansible's apt module needs, on a real Debian 12 lab node that lacks it.

Without it, that module's first run installs it by itself (an `apt-get update`, then python3-apt
with its recommends, seen on a lab node: lsb-release and iso-codes came along) and reports nothing,
and in check mode it fails. gpustack installs it first as a change of its own (roles/dpkg_ready,
tasks/python_apt.yml): `plan` lists it and changes nothing, `install` reports it, and a host whose
sources are already set plans its package steps by name instead of failing. Real apt, dpkg and
Debian's archive; the toolkit repository is the lab's stand-in (tests/fixtures/lab_fixtures.py).
"""

from __future__ import annotations

import os

import pytest

from tests.conftest import run_cli
from tests.fixtures import lab_fixtures
from tests.lab.test_lab import ssh

pytestmark = pytest.mark.lab

LAB = f"pyapt{os.getpid()}"
NODE = f"{LAB}-node1"
PURGE = "DEBIAN_FRONTEND=noninteractive apt-get purge -y -qq python3-apt >/dev/null"
# The apt-get runs that installed python3-apt, as apt's own log names them.
INSTALLS = "grep '^Commandline: .* install .*python3-apt' /var/log/apt/history.log || true"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("pyapt") / "pyapt.ini"
    proc = run_cli("lab", "up", "--name", LAB, "--nodes", "1", "--os", "debian12",
                   "--inventory", str(inventory), timeout=1800)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    varsfile = lab_fixtures.prepare([f"gpustack-{NODE}"], inventory.with_suffix(".vars.json"))
    assert ssh(inventory, NODE, PURGE).returncode == 0
    yield inventory, varsfile
    run_cli("lab", "down", "--name", LAB)


def section(stdout: str, name: str) -> list[str]:
    """The entries of one section of plan's report ("  install:", then "    entry" lines)."""
    lines = stdout.splitlines()
    start = lines.index(f"  {name}:") + 1
    entries = []
    for line in lines[start:]:
        if not line.startswith("    "):
            break
        entries.append(line.strip())
    return entries


def python_apt(inventory) -> bool:
    return ssh(inventory, NODE, "python3 -c 'import apt, apt_pkg'").returncode == 0


def test_plan_lists_python3_apt_and_changes_nothing(lab):
    inventory, varsfile = lab
    assert not python_apt(inventory)
    proc = run_cli("plan", str(inventory), "-e", f"@{varsfile}", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert section(proc.stdout, "install") == ["python3-apt 2.6.0"], proc.stdout
    assert "python3-apt would be installed first: Ansible's apt module needs it" in proc.stdout
    assert not python_apt(inventory) and ssh(inventory, NODE, INSTALLS).stdout == ""


def test_install_installs_it_first_as_a_change_of_its_own(lab):
    inventory, varsfile = lab
    proc = run_cli("install", str(inventory), "-e", f"@{varsfile}", timeout=1800)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "python3-apt was installed first" in proc.stdout
    assert python_apt(inventory)
    installs = ssh(inventory, NODE, INSTALLS).stdout.splitlines()
    # gpustack's run only, not the apt module's own (`install python3-apt -y -q`, with recommends).
    assert len(installs) == 1, installs
    assert "--no-install-recommends" in installs[0] and installs[0].endswith("install python3-apt")
    # Recorded as there before the driver's first install: uninstall leaves it, as the note says.
    before = ssh(inventory, NODE, "cat /var/lib/gpustack/nvidia_driver.packages-before")
    assert "python3-apt" in before.stdout.split()


def test_a_host_with_its_sources_set_plans_package_steps_by_name(lab):
    """Sources set, lists fresh: the apt module's check mode would run, and fail without python3-apt."""
    inventory, varsfile = lab
    assert ssh(inventory, NODE, PURGE).returncode == 0
    proc = run_cli("plan", str(inventory), "-e", f"@{varsfile}", "--full", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "not simulated: no python3-apt yet" in proc.stdout and "nvidia-smi=" in proc.stdout
    assert section(proc.stdout, "install") == ["python3-apt 2.6.0"], proc.stdout
    assert not python_apt(inventory)


def test_uninstall_removes_the_packages_without_installing_python3_apt(lab):
    """Last, python3-apt purged by the test above: apt-get removes the toolkit and the driver."""
    inventory, _ = lab
    proc = run_cli("uninstall", str(inventory), "--components", "toolkit,driver", "--yes",
                   timeout=1800)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    left = ssh(inventory, NODE, "dpkg-query -W -f='${Package} ${db:Status-Abbrev}\\n' | grep -E "
               "'^(nvidia|libnvidia|libcuda)[^ ]* [ih]i' || true")  # fmt: skip
    assert left.stdout == "", left.stdout
    assert not python_apt(inventory)
    assert len(ssh(inventory, NODE, INSTALLS).stdout.splitlines()) == 1  # gpustack's install only
