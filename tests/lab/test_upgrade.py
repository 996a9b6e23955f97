"""`gpustack upgrade` on a real 3-node Debian 12 lab (host-only fleet): the real driver role,
real apt, Debian's 535.261.03-1 -> 535.309.01-0+deb12u1.

One lab for the module: install the old driver, roll the new one out one node at a time,
stop the run with SIGTERM after the first node, resume it, then make a node fail.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from gpustack.upgrade.state import FileStateStore, UpgradeRun, state_path_for
from tests.conftest import GPUSTACK, ROOT, lab_nodes, run_cli
from tests.lab.test_lab import ssh
from tests.upgrade_doubles import in_progress_intervals

pytestmark = pytest.mark.lab

LAB = f"upg{os.getpid()}"
OLD, NEW = "535.261.03-1", "535.309.01-0+deb12u1"
NODES = [f"{LAB}-node{i}" for i in (1, 2, 3)]
VERSIONS = "dpkg-query -W -f='${Version} ' nvidia-smi libnvidia-ml1 nvidia-kernel-dkms"
BROKEN = "/etc/apt/sources.list.d/gpustack-test-broken.list"
GONE = "/etc/apt/sources.list.d/gpustack-test-gone.list"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    root = tmp_path_factory.mktemp("upg")
    inventory = root / "upg.ini"
    env = {"GPUSTACK_STATE_DIR": str(root / "state")}
    with lab_nodes(LAB, 3, inventory):
        proc = run_cli("install", str(inventory), "--tags", "nvidia_driver", "-e",
                       f"nvidia_driver_version={OLD}", env=env, timeout=1200)  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield inventory, env


def load_state(inventory: Path, env: dict) -> UpgradeRun:
    path = state_path_for(inventory)
    path = Path(env["GPUSTACK_STATE_DIR"]) / "upgrades" / path.name
    return FileStateStore(path).load()


def upgrade(inventory, env, *args, timeout=1200) -> tuple[int, dict]:
    proc = run_cli("upgrade", str(inventory), *args, "--output", "json", env=env, timeout=timeout)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.returncode, json.loads(proc.stdout)


def assert_one_at_a_time(run: UpgradeRun) -> None:
    spans = sorted(s for spans in in_progress_intervals(run.history).values() for s in spans)
    assert spans
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert end <= start, f"overlapping upgrades: {spans}"


def test_a_version_no_source_offers_is_refused_before_any_node_is_touched(lab):
    """Until 2026-11-29 the first node was taken out of service (cordoned and drained, with a
    kubeconfig) and only then found that the archive does not carry the version."""
    inventory, env = lab
    snapshot = VERSIONS + "; apt-mark showhold | sort; ls /etc/apt/sources.list.d"
    before = {node: ssh(inventory, node, snapshot).stdout for node in NODES}
    proc = run_cli("upgrade", str(inventory), "--driver-version", "999.1-1", env=env, timeout=600)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    error, hint = proc.stderr.strip().splitlines()[-2:]
    assert error.startswith(f"Error: {NODES[0]}: Resolve the exact version to install: NVIDIA "
                            "driver version 999.1-1 is not available from source 'distro'"), error  # fmt: skip
    assert error.endswith("(and 2 more node(s)). No node was taken out of service"), error
    assert hint.startswith("Hint: the distribution archive must offer nvidia-kernel-dkms"), hint
    assert load_state(inventory, env) is None
    assert {node: ssh(inventory, node, snapshot).stdout for node in NODES} == before


def test_rolling_upgrade_stops_on_sigterm_and_resumes(lab):
    inventory, env = lab
    for node in NODES:
        assert ssh(inventory, node, VERSIONS).stdout.split() == [OLD] * 3
    args = ["upgrade", str(inventory), "--driver-version", NEW, "--max-unavailable", "1"]
    proc = subprocess.Popen([*GPUSTACK, *args], cwd=ROOT, env={**os.environ, **env},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
    state_file = Path(env["GPUSTACK_STATE_DIR"]) / "upgrades" / state_path_for(inventory).name
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        run = FileStateStore(state_file).load()  # the snapshot and its journal, read live
        if run is not None and run.nodes[NODES[0]].state == "upgrade-done":
            break
        time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 130, out + err
    assert "Stopping: no new node starts" in err
    assert "Rollout interrupted; continue with --resume." in out

    stopped = load_state(inventory, env)
    states = {n: r.state for n, r in stopped.nodes.items()}
    assert states[NODES[0]] == "upgrade-done"
    # The node that was in flight when the signal came finished; no other node started.
    assert states[NODES[2]] == "upgrade-required", states
    assert states[NODES[1]] in ("upgrade-done", "upgrade-required"), states
    done_before = [n for n, s in states.items() if s == "upgrade-done"]
    history_before = len(stopped.history)

    code, doc = upgrade(inventory, env, "--driver-version", NEW, "--max-unavailable", "1",
                        "--resume")  # fmt: skip
    assert code == 0, doc
    assert doc["status"] == "done" and doc["summary"]["done"] == 3
    run = load_state(inventory, env)
    resumed = run.history[history_before:]
    assert {t.node for t in resumed}.isdisjoint(done_before), "done nodes were redone"
    assert all(n.attempts == 1 for n in run.nodes.values())
    assert_one_at_a_time(run)
    for node in NODES:
        assert [t.to_state for t in run.history if t.node == node][-1] == "upgrade-done"
        driver = doc["nodes"][node]["driver"]
        assert {k: driver[k] for k in ("installed_version", "held", "state")} == {
            "installed_version": NEW, "held": True,
            "state": "installed, not loaded: no NVIDIA device",
        }  # fmt: skip
        # what the role's nvidia-smi read, kept for validation's UUID check: no GPU, and it failed
        assert driver["gpus"] == [] and driver["nvidia_smi"]["rc"] == 9, driver
        assert ssh(inventory, node, VERSIONS).stdout.split() == [NEW] * 3
        holds = ssh(inventory, node, "apt-mark showhold").stdout.split()
        # nvidia-modprobe: a companion the upgrade moves after the driver's transaction (its own
        # apt call, which drops the hold); left unheld until 2026-12-02
        assert {"nvidia-smi", "nvidia-kernel-dkms", "libcuda1", "nvidia-modprobe"} <= set(holds)
        pin = ssh(inventory, node, "cat /etc/apt/preferences.d/gpustack-nvidia-driver.pref")
        assert f"Pin: version {NEW}" in pin.stdout


def test_a_failing_node_stops_the_rollout(lab):
    inventory, env = lab
    # This upgrade starts the node that took longest in the last one (the state file measured
    # them): break the node the plan starts first.
    code, plan = upgrade(inventory, env, "--driver-version", OLD, "--max-unavailable", "1",
                         "--dry-run")  # fmt: skip
    assert code == 0 and plan["measured_nodes"] == 3, plan
    first = plan["plan"][0][0]
    finished = load_state(inventory, env)

    # A broken source on that node: found by the target check, before any node is touched.
    ssh(inventory, first, f"echo 'deb broken-on-purpose' > {BROKEN}")
    try:
        proc = run_cli("upgrade", str(inventory), "--driver-version", OLD, "--max-unavailable",
                       "1", env=env, timeout=600)  # fmt: skip
    finally:
        ssh(inventory, first, f"rm -f {BROKEN}")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    error, hint = proc.stderr.strip().splitlines()[-2:]
    assert error.startswith(f"Error: {first}: "), error
    assert "Malformed" in error or "broken-on-purpose" in error, error
    assert error.endswith("No node was taken out of service") and hint.startswith("Hint: "), hint
    assert load_state(inventory, env) == finished  # no new run recorded
    for node in NODES:
        assert ssh(inventory, node, VERSIONS).stdout.split() == [NEW] * 3

    # A source that cannot be fetched (apt-get update exits 0 on it) on the archive's suite: the
    # check enables the driver's components on it too, fails, and rolls back that line only.
    # The components the installs enabled (committed) stay: the rollback once took them away,
    # leaving Debian's archive at `main` under the installed driver.
    sources = "cat /etc/apt/sources.list.d/*.sources /etc/apt/sources.list 2>/dev/null"
    before = ssh(inventory, first, sources).stdout
    assert "non-free" in before
    gone = "deb [trusted=yes] http://127.0.0.1:9/mirror bookworm main"
    ssh(inventory, first, f"echo '{gone}' > {GONE}; touch -d '2 hours ago' /var/lib/apt/lists")
    try:
        proc = run_cli("upgrade", str(inventory), "--driver-version", OLD, "--max-unavailable",
                       "1", env=env, timeout=600)  # fmt: skip
        assert proc.returncode == 1, proc.stdout + proc.stderr
        error = proc.stderr.strip().splitlines()[-2]
        assert "http://127.0.0.1:9/mirror" in error and "No node was taken out of service" in error
        assert ssh(inventory, first, f"cat {GONE}").stdout.strip() == gone
        assert ssh(inventory, first, sources).stdout == before
    finally:
        ssh(inventory, first, f"rm -f {GONE}")
    assert load_state(inventory, env) == finished

    # dpkg refusing on that node (the sources are fine, the check passes): its upgrade fails,
    # and the rollout stops there.
    refuse = ("echo 'DPkg::Pre-Invoke { \"echo gpustack-test: dpkg refused on purpose >&2; "
              "false\"; };' > /etc/apt/apt.conf.d/99gpustack-test-refuse")  # fmt: skip
    ssh(inventory, first, refuse)
    try:
        code, doc = upgrade(inventory, env, "--driver-version", OLD, "--max-unavailable", "1")
    finally:
        ssh(inventory, first, "rm -f /etc/apt/apt.conf.d/99gpustack-test-refuse")
    assert code == 1, doc
    assert doc["status"] == "failed" and doc["exit_code"] == 1
    assert doc["message"].startswith(f"Rollout stopped: 1 node(s) failed (max-failures 0); last: {first}")  # fmt: skip
    node = doc["nodes"][first]
    assert node["state"] == "upgrade-failed"
    assert node["reason"].startswith("driver role: Install the driver packages"), node
    assert "dpkg refused on purpose" in node["reason"], node
    assert node["artifacts"] and Path(node["artifacts"]).is_dir()
    for other in [n for n in NODES if n != first]:
        assert doc["nodes"][other]["state"] == "upgrade-required"
        assert ssh(inventory, other, VERSIONS).stdout.split() == [NEW] * 3, "rollout went on"
    run = load_state(inventory, env)
    assert run.nodes[first].reason == node["reason"]
    assert {t.node for t in run.history} == {first}
