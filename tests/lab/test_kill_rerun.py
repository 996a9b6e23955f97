"""What real operators do, on real lab nodes (issue 16): a SIGKILL between writing containerd's
files and restarting it (the lost restart), SIGTERM, two concurrent installs, and hostile start
states (dpkg lock held, interrupted dpkg, a broken config.toml, a node that disappears).

Kept small for CI (the toolkit and runtime layers: `--skip-tags nvidia_driver`); the campaign of
20+ kills over the whole install, uninstall and upgrade is benchmarks/kill_rerun.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from benchmarks import kill_rerun
from tests.conftest import ROOT, lab_nodes, run_cli
from tests.fixtures import lab_fixtures
from tests.lab.test_lab import ssh

pytestmark = pytest.mark.lab

LAB = os.environ.get("GPUSTACK_TEST_LAB_PREFIX", "") + f"kr{os.getpid()}"  # unique per run
NODES = [f"{LAB}-node1", f"{LAB}-node2"]
SKIP = ("--skip-tags", "nvidia_driver")  # toolkit and runtime
RUNTIME = ("--skip-tags", "nvidia_driver,nvidia_container_toolkit")  # the runtime layer alone


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("kr") / "kr.ini"
    with lab_nodes(LAB, 2, inventory):
        varsfile = lab_fixtures.prepare(
            [f"gpustack-{n}" for n in NODES], inventory.with_suffix(".vars.json")
        )
        proc = run_cli("install", str(inventory), *SKIP, "-e", f"@{varsfile}", timeout=900)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield inventory, varsfile


def install(inventory, varsfile, *args, state=None, timeout=900, skip=RUNTIME):
    env = {"GPUSTACK_STATE_DIR": str(state)} if state else None
    proc = run_cli("install", str(inventory), *skip, "-e", f"@{varsfile}", *args, "--output", "json",
                   env=env, timeout=timeout)  # fmt: skip
    try:
        return proc.returncode, json.loads(proc.stdout), proc.stderr
    except ValueError:
        return proc.returncode, {}, proc.stdout + proc.stderr


def start(inventory, varsfile, state, *args, skip=RUNTIME) -> subprocess.Popen:
    env = {**os.environ, "GPUSTACK_STATE_DIR": str(state)}
    return subprocess.Popen(
        [sys.executable, "-m", "gpustack", "install", str(inventory), *skip, "-e", f"@{varsfile}",
         *args, "--output", "json"],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def test_lost_restart_shows_as_drift_and_the_rerun_repairs_it(lab, tmp_path):
    inventory, varsfile = lab
    harness = kill_rerun.Lab(inventory, varsfile, tmp_path, list(RUNTIME), ("toolkit", "runtime"))
    args = type("A", (), {"upgrade_from": "", "upgrade_to": ""})()
    point = "Check the new effective configuration"  # files written, restart not yet
    trial = kill_rerun.trial(harness, "install", point, "runtime", 0.0, args)
    assert trial.killed and trial.orphans == 0, trial
    lost = [d for d in trial.status_before if "restart pending" in d or "not loaded" in d]
    assert len(lost) >= len(NODES), trial.status_before  # the lost restart is drift ...
    assert trial.converged, trial  # ... and the re-run repaired it: containerd runs its files
    for node in NODES:
        log = ssh(inventory, node, f"cat {lab_fixtures.RUNTIME_LOG}").stdout
        assert "gpustack-verify" in log  # the check container went through the nvidia handler


def test_sigterm_stops_the_run_reports_and_leaves_no_child(lab, tmp_path):
    inventory, varsfile = lab
    proc = start(inventory, varsfile, tmp_path)
    assert kill_rerun.wait_for_task(
        tmp_path, "Read containerd's version, files and loaded configuration", proc, timeout=300
    )
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert json.loads(out)["status"] == "canceled"  # the report still comes
    deadline = time.monotonic() + 10
    while kill_rerun.children_of(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert kill_rerun.children_of(tmp_path) == []


def test_a_second_install_refuses_or_waits_naming_the_first(lab, tmp_path):
    inventory, varsfile = lab
    first = start(inventory, varsfile, tmp_path)
    try:
        locks = (
            list((tmp_path / "locks").glob("*.lock.json")) if (tmp_path / "locks").exists() else []
        )
        deadline = time.monotonic() + 60
        while len(locks) < len(NODES) and time.monotonic() < deadline:
            time.sleep(0.2)
            locks = (
                list((tmp_path / "locks").glob("*.lock.json"))
                if (tmp_path / "locks").exists()
                else []
            )
        rc, _, err = install(inventory, varsfile, state=tmp_path)
        assert rc == 6, err
        assert f"pid {first.pid}" in err and "gpustack install" in err and "--wait" in err
        rc, _doc, err = install(inventory, varsfile, "--wait", state=tmp_path)
        assert first.poll() is not None  # it started only once the first had ended
        assert rc == 0 and "Waiting: another gpustack run" in err
    finally:
        first.wait(timeout=900)
    assert first.returncode == 0


def test_hostile_start_states_get_clear_results_and_spare_the_other_host(lab, tmp_path):
    inventory, varsfile = lab
    good, bad = NODES
    # interrupted dpkg on `good` (a package unpacked, never configured): recovered and said
    deb = (
        f"{lab_fixtures.REPO_IN_NODE}/stable/deb/amd64/"
        f"libnvidia-container1_{lab_fixtures.BUILT_VERSION}_amd64.deb"  # the version installed
    )
    assert (
        ssh(
            inventory, good, f"apt-mark unhold libnvidia-container1; dpkg --unpack {deb}"
        ).returncode
        == 0
    )
    assert ssh(inventory, good, "dpkg --audit").stdout.strip()
    # a broken config.toml on `bad`: refused, the syntax error located, the file untouched
    broken = 'version = 2\n[plugins."io.containerd.grpc.v1.cri"\n  x = 1\n'
    ssh(inventory, bad, "cp /etc/containerd/config.toml /root/config.toml.keep; "
                        f"printf '%s' '{broken}' > /etc/containerd/config.toml")  # fmt: skip
    rc, doc, err = install(inventory, varsfile, skip=SKIP)
    assert rc == 1, err
    assert doc["hosts"][good]["status"] in ("ok", "changed")
    recovery = doc["hosts"][good]["facts"]["gpustack_dpkg_recovery"]
    assert recovery["recovered"] is True and "dpkg --configure -a" in recovery["message"]
    assert ssh(inventory, good, "dpkg --audit").stdout.strip() == ""
    message = doc["hosts"][bad]["failures"][-1]["message"]
    assert "not a valid containerd configuration" in message and "(2, 2)" in message
    assert ssh(inventory, bad, "cat /etc/containerd/config.toml").stdout == broken
    ssh(inventory, bad, "cp /root/config.toml.keep /etc/containerd/config.toml")

    # the dpkg lock held by another process on `bad`: a bounded wait, then the holder named
    holder = subprocess.Popen(["podman", "exec", f"gpustack-{bad}", "python3", "-c",
        "import fcntl,time; f=open('/var/lib/dpkg/lock-frontend','w'); fcntl.lockf(f, fcntl.LOCK_EX); time.sleep(90)"])  # fmt: skip
    try:
        time.sleep(2)
        rc, doc, err = install(inventory, varsfile, "-e", "dpkg_ready_lock_timeout=6", skip=SKIP)
    finally:
        holder.kill()
        holder.wait()
        ssh(
            inventory,
            bad,
            "kill $(lslocks -n -o PID,PATH | awk '/lock-frontend/ {print $1}') 2>/dev/null; true",
        )
    assert rc == 1, err
    assert doc["hosts"][good]["status"] in ("ok", "changed")
    message = doc["hosts"][bad]["failures"][-1]["message"]
    assert "still held after 6 s" in message and "python3" in message and "pid" in message

    # `bad` disappears mid-run: `good` is done, `bad` reported unreachable; back, it converges
    proc = start(inventory, varsfile, tmp_path, skip=SKIP)
    assert kill_rerun.wait_for_task(
        tmp_path, "Install the toolkit packages at exactly that version", proc, 300
    )
    subprocess.run(
        ["podman", "stop", "-t", "0", f"gpustack-{bad}"], check=True, capture_output=True
    )
    out, err = proc.communicate(timeout=600)
    doc = json.loads(out)
    assert proc.returncode == 4, err
    assert doc["hosts"][good]["status"] in ("ok", "changed") and doc["hosts"][bad]["unreachable"]
    subprocess.run(["podman", "start", f"gpustack-{bad}"], check=True, capture_output=True)
    deadline = time.monotonic() + 120
    while ssh(inventory, bad, "systemctl is-active containerd").stdout.strip() != "active":
        assert time.monotonic() < deadline
        time.sleep(2)
    rc, doc, err = install(inventory, varsfile, skip=SKIP)
    assert rc == 0, err
    assert {h: v["status"] for h, v in doc["hosts"].items()} == {
        good: "ok",
        bad: doc["hosts"][bad]["status"],
    }
    assert ssh(inventory, bad, "dpkg --audit").stdout.strip() == ""
