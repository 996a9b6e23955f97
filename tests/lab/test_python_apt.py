"""python3-apt, which Ansible's apt module needs, on a real Debian 12 lab node that lacks it.

Without it, that module's first run installs it by itself (an `apt-get update`, then python3-apt
with its recommends, seen on a lab node: lsb-release and iso-codes came along) and reports nothing,
and in check mode it fails. gpustack installs it first as a change of its own (roles/dpkg_ready,
tasks/python_apt.yml): `plan` lists it and changes nothing, `install` reports it, and a host whose
sources are already set plans its transaction from apt-get's simulation instead of failing. Real apt, dpkg and
Debian's archive; the toolkit repository is the lab's stand-in (tests/fixtures/lab_fixtures.py).
"""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import lab_nodes, run_cli
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
    with lab_nodes(LAB, 1, inventory):
        varsfile = lab_fixtures.prepare([f"gpustack-{NODE}"], inventory.with_suffix(".vars.json"))
        assert ssh(inventory, NODE, PURGE).returncode == 0
        yield inventory, varsfile


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


def test_a_host_with_its_sources_set_plans_its_transaction_without_python3_apt(lab):
    """Sources set, lists fresh, the driver installed by the test above: the apt module's check
    mode would run, and fail without python3-apt. The driver's transaction is gpustack_apt_install
    (dpkg-query and apt-get alone): it finds every package at its version, so plan lists
    python3-apt alone. Until 2026-11-29 plan named the transaction's packages at their versions
    ("not simulated: no python3-apt yet"), installed or not."""
    inventory, varsfile = lab
    assert ssh(inventory, NODE, PURGE).returncode == 0
    proc = run_cli("plan", str(inventory), "-e", f"@{varsfile}", "--full", timeout=900)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert section(proc.stdout, "install") == ["python3-apt 2.6.0"], proc.stdout
    assert "not simulated" not in proc.stdout and "nvidia-smi" not in proc.stdout, proc.stdout
    # another version: apt-get --simulate moves the driver's packages, python3-apt still absent
    older = "535.261.03-1"
    proc = run_cli("plan", str(inventory), "-e", f"@{varsfile}", "-e",
                   f"nvidia_driver_version={older}", timeout=900)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    moved = section(proc.stdout, "upgrade/downgrade")
    assert [e for e in moved if e.startswith("nvidia-smi ") and e.endswith(older)], proc.stdout
    assert "not simulated" not in proc.stdout
    assert not python_apt(inventory)


# A maintainer script that fails, as a broken or half-upgraded package's can: dpkg stops the purge
# with packages still installed. The original script (if any) is kept beside it and put back.
BREAK_PRERM = (
    "f=/var/lib/dpkg/info/{0}.prerm; [ -e $f ] && cp -a $f $f.gpustack-test; "
    "printf '#!/bin/sh\\necho gpustack test: prerm fails >&2\\nexit 1\\n' > $f; chmod 755 $f"
)
MEND_PRERM = "f=/var/lib/dpkg/info/{0}.prerm; rm -f $f; [ -e $f.gpustack-test ] && mv $f.gpustack-test $f; true"
STATES = "dpkg-query -W -f='${{Package}} ${{db:Status-Abbrev}}\\n' {0} 2>/dev/null || true"


def dpkg_states(inventory, packages: list[str]) -> dict[str, str]:
    """dpkg's status abbreviation ('hi', 'rc', ...) of each package dpkg knows."""
    if not packages:
        return {}
    lines = ssh(inventory, NODE, STATES.format(" ".join(packages))).stdout.splitlines()
    return dict(line.split()[:2] for line in lines if len(line.split()) >= 2)


@pytest.mark.parametrize(("component", "broken", "packages"), [
    ("toolkit", "libnvidia-container-tools", sorted(lab_fixtures.PACKAGES)),
    ("driver", "nvidia-smi", ["nvidia-smi", "libcuda1", "nvidia-persistenced", "nvidia-kernel-dkms"]),
])  # fmt: skip
def test_a_failed_purge_puts_back_the_marks_apt_took(lab, component, broken, packages):
    """apt releases holds and automatic marks before dpkg runs: put back on what a failure leaves."""
    inventory, _ = lab
    held = ssh(inventory, NODE, "apt-mark showhold").stdout.split()
    auto = set(ssh(inventory, NODE, "apt-mark showauto").stdout.split())
    assert broken in held, held  # held by gpustack's install, as are the others checked below
    assert ssh(inventory, NODE, BREAK_PRERM.format(broken)).returncode == 0
    try:
        proc = run_cli("uninstall", str(inventory), "--components", component, "--yes",
                       "-o", "json", timeout=1800)  # fmt: skip
    finally:
        ssh(inventory, NODE, MEND_PRERM.format(broken))
    assert proc.returncode != 0, proc.stdout + proc.stderr
    rescued, final = json.loads(proc.stdout)["hosts"][NODE]["failures"]  # apt-get's, then ours
    assert rescued["task"] == f"Remove the {component} packages", rescued
    message = " ".join(final["message"].split())
    assert message.startswith(f"Removing the {component} packages on {NODE} failed:"), message
    assert "pre-removal script subprocess returned error exit status 1" in message, message
    assert "The ones still installed are held" in message, message
    assert "Hint: run `apt-get purge" in message, message
    states = dpkg_states(inventory, packages)
    left = {name: state for name, state in states.items() if state[1] not in "nc" and name in held}
    assert broken in left, states  # the purge really stopped with it installed
    assert all(state.startswith("h") for state in left.values()), states  # and held again
    # apt drops the "automatic" marks of what it means to remove before dpkg runs: put back, or a
    # later driver uninstall would keep those packages as installed by hand.
    lost = sorted(auto - set(ssh(inventory, NODE, "apt-mark showauto").stdout.split()))
    assert not [
        name for name, state in dpkg_states(inventory, lost).items() if state[1] not in "nc"
    ]


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
