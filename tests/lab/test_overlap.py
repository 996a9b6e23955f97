"""install's driver transaction in the background with containerd wired meanwhile, on a real lab
node (Debian 12, Debian's containerd and driver packages, the stand-in toolkit repository of
tests/fixtures/lab_fixtures.py, a TEST FIXTURE).

A first install starts the transaction on the node and wires containerd while it runs; a
containerd configuration that containerd cannot read fails the host, and the host waits for its
transaction before it fails (no package run left going on after the CLI has reported it). Fixed,
the re-run installs nothing more and converges. With `-e gpustack_site_runtime_early=false` (the
documented switch, docs/driver.md) a first install runs the transaction in its call and wires
containerd after it, and converges the same way. Where containerd was wired early, the join of the
transaction runs container_runtime's check on the node (the test container through the nvidia
runtime): its result is the verdict, and a test container that fails there fails the host.
"""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import pytest

from tests.conftest import lab_nodes, run_cli
from tests.fixtures import lab_fixtures
from tests.lab.test_lab import ssh

pytestmark = pytest.mark.lab

LAB = f"overlap{os.getpid()}"
NODE = f"{LAB}-node1"
SERIAL = f"{LAB}-node2"  # first installed with the overlap switched off
JOINED = f"{LAB}-node3"  # the join's containerd check, with a test image the node does not have
LOADED_CHECK = "Ask the running containerd for its runtime handlers"
BROKEN = "version = 2\n[plugins\n"  # containerd: "(2, 2): unexpected token"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("overlap") / "overlap.ini"
    with lab_nodes(LAB, 3, inventory):
        varsfile = lab_fixtures.prepare([f"gpustack-{node}" for node in (NODE, SERIAL, JOINED)],
                                        inventory.with_suffix(".vars.json"))  # fmt: skip
        yield inventory, varsfile


def install(lab, *args: str, node: str = NODE) -> tuple[int, dict]:
    inventory, varsfile = lab
    proc = run_cli("install", str(inventory), "-l", node, "-e", f"@{varsfile}", *args,
                   "--output", "json", timeout=1800)  # fmt: skip
    return proc.returncode, json.loads(proc.stdout)


def task_results(doc: dict, host: str, task: str) -> list[str]:
    """The results of `task` on `host` in the run `doc` reports (runner_on_ok, _skipped...)."""
    events = (json.loads(path.read_text()) for path in
              Path(doc["artifacts"]).glob("job_events/*.json"))  # fmt: skip
    return [e["event"] for e in events if e["event"].startswith("runner_on_")
            and e["event"] != "runner_on_start" and e["event_data"].get("host") == host
            and e["event_data"].get("task", "").startswith(task)]  # fmt: skip


def write(inventory, path: str, text: str) -> None:
    data = base64.b64encode(text.encode()).decode()
    assert ssh(inventory, NODE, f"echo {data} | base64 -d > {path}").returncode == 0


def test_a_host_whose_wiring_fails_waits_for_its_background_transaction_before_it_fails(lab):
    inventory, _ = lab
    original = ssh(inventory, NODE, "cat /etc/containerd/config.toml").stdout
    write(inventory, "/etc/containerd/config.toml", BROKEN)
    rc, doc = install(lab)
    host = doc["hosts"][NODE]
    assert rc == 1, doc
    tasks = [c["task"] for c in host["changes"]]
    assert any(t.endswith("hold them") for t in tasks), tasks  # started in the background
    message = host["failures"][-1]["message"]
    assert "not a valid containerd configuration" in message and "(2, 2)" in message, message
    assert "the driver's package transaction, started before it, finished" in message, message
    # the host failed after its transaction: nothing runs on, the packages are in and held
    assert ssh(inventory, NODE, "pgrep -a -x 'apt-get|dpkg' || true").stdout.strip() == ""
    holds = ssh(inventory, NODE, "apt-mark showhold").stdout.split()
    assert {"nvidia-kernel-dkms", "nvidia-container-toolkit"} <= set(holds), holds
    assert ssh(inventory, NODE, "ls /var/lib/gpustack/jobs").stdout.strip() == ""
    assert (
        ssh(inventory, NODE, "systemctl is-enabled nvidia-persistenced").stdout.strip() == "enabled"
    )
    assert ssh(inventory, NODE, "cat /etc/containerd/config.toml").stdout == BROKEN  # untouched

    write(inventory, "/etc/containerd/config.toml", original)
    rc, doc = install(lab)
    assert rc == 0, doc
    host = doc["hosts"][NODE]
    tasks = [c["task"] for c in host["changes"]]
    assert not any("Install the driver packages" in t for t in tasks), tasks  # nothing to install
    assert host["facts"]["gpustack_runtime"]["container_check"] == "passed"
    rc, doc = install(lab)
    assert rc == 0 and doc["hosts"][NODE]["converged"] is True, doc


def test_the_overlap_switched_off_installs_first_and_wires_containerd_after(lab):
    inventory, _ = lab
    rc, doc = install(lab, "-e", "gpustack_site_runtime_early=false", node=SERIAL)
    assert rc == 0, doc
    host = doc["hosts"][SERIAL]
    tasks = [c["task"] for c in host["changes"]]
    transaction = next(i for i, t in enumerate(tasks) if t.endswith("hold them"))
    assert not any("wait for the background transaction" in t for t in tasks), tasks
    wired = [i for i, c in enumerate(host["changes"]) if c["role"] == "container_runtime"]
    assert wired and min(wired) > transaction, tasks  # containerd wired after the transaction
    assert host["facts"]["gpustack_runtime"]["container_check"] == "passed"
    assert ssh(inventory, SERIAL, "ls /var/lib/gpustack/jobs 2>/dev/null").stdout.strip() == ""
    rc, doc = install(lab, node=SERIAL)
    assert rc == 0 and doc["hosts"][SERIAL]["converged"] is True, doc


def test_the_join_runs_containerds_check_and_its_failing_test_container_fails_the_host(lab):
    missing = "localhost/gpustack-no-such-image:1"
    rc, doc = install(lab, "-e", f"container_runtime_verify_image={missing}", node=JOINED)
    assert rc == 1, doc
    host = doc["hosts"][JOINED]
    tasks = [c["task"] for c in host["changes"]]
    assert any("wait for the background transaction" in t for t in tasks), tasks  # joined
    message = host["failures"][-1]["message"]
    assert "containerd: the test container failed (" in message and missing in message, message
    assert "differs from its files" not in message and "effective configuration (" not in message
    # the verdict came from the join's check: container_runtime's own call was left out
    assert task_results(doc, JOINED, LOADED_CHECK) == ["runner_on_skipped"], doc["artifacts"]
    rc, doc = install(lab, node=JOINED)  # nothing to install: no join, verify's own call
    assert rc == 0, doc
    assert doc["hosts"][JOINED]["facts"]["gpustack_runtime"]["container_check"] == "passed"
    assert task_results(doc, JOINED, LOADED_CHECK) == ["runner_on_ok"]
    rc, doc = install(lab, node=JOINED)
    assert rc == 0 and doc["hosts"][JOINED]["converged"] is True, doc
