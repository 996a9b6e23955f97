"""Fleet operations on real lab nodes: status drift, plan without change, uninstall back to before.

Two Debian 12 nodes with Debian's containerd and the stand-in toolkit repository of
tests/fixtures/lab_fixtures.py. One node gets another driver version by hand (apt-get, as an
operator would): `status` must name that node's drift and exit 5, `plan` must list the change
without making it, and `uninstall --yes` must leave both nodes as they were before install.
Timings of each command are printed at the end (run with -s) and written next to the inventory.
"""

from __future__ import annotations

import json
import os
import time
import tomllib

import pytest

from tests.conftest import lab_nodes, run_cli
from tests.fixtures import lab_fixtures
from tests.lab.test_lab import ssh

pytestmark = pytest.mark.lab

LAB = f"fleet{os.getpid()}"
NODES = (f"{LAB}-node1", f"{LAB}-node2")
OLD, NEW = "535.261.03-1", "535.309.01-0+deb12u1"
TIMINGS: dict[str, float] = {}
BEFORE: dict[str, dict] = {}
# What an operator types to move every installed driver package to another version by hand.
BY_HAND = (
    "pk=$(dpkg-query -W -f='${Package} ${source:Package} ${db:Status-Abbrev}\\n' | "
    "awk '$2==\"nvidia-graphics-drivers\" && $3 ~ /^[ih]i/ {print $1}'); "
    "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --allow-change-held-packages "
    "--allow-downgrades $(for p in $pk; do printf '%s=%s ' $p " + NEW + "; done) >/dev/null"
)


def timed(name, *args, timeout=1800):
    start = time.monotonic()
    proc = run_cli(*args, timeout=timeout)
    TIMINGS[name] = round(time.monotonic() - start, 1)
    return proc


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("fleet") / "fleet.ini"
    start = time.monotonic()
    with lab_nodes(LAB, 2, inventory):
        containers = [f"gpustack-{n}" for n in NODES]
        varsfile = lab_fixtures.prepare(containers, inventory.with_suffix(".vars.json"))
        TIMINGS["lab up + containerd + fixtures"] = round(time.monotonic() - start, 1)
        for node in NODES:
            BEFORE[node] = snapshot(inventory, node)
        yield inventory, varsfile
        inventory.with_suffix(".timings.json").write_text(json.dumps(TIMINGS, indent=2))
        print("\nfleet lab timings (s):", json.dumps(TIMINGS, indent=2))


def snapshot(inventory, node) -> dict:
    """What uninstall must give back: package selections, effective containerd config, apt."""
    selections = ssh(inventory, node, "dpkg --get-selections")
    apt = ssh(inventory, node, "find /etc/apt -type f | sort | xargs md5sum")
    dump = ssh(inventory, node, "containerd --config /etc/containerd/config.toml config dump")
    assert selections.returncode == apt.returncode == dump.returncode == 0, dump.stderr
    config = tomllib.loads(dump.stdout)
    config["imports"] = sorted(config.get("imports", []))  # printed in map order
    return {"selections": selections.stdout, "apt": apt.stdout, "containerd": config}


def installed_versions(inventory, node) -> str:
    return ssh(inventory, node, "dpkg-query -W -f='${Package}=${Version}\\n' "
                                "nvidia-kernel-dkms nvidia-smi libcuda1").stdout  # fmt: skip


def test_install_then_status_shows_no_drift(lab):
    inventory, varsfile = lab
    proc = timed("install (first)", "install", str(inventory), "-e", f"@{varsfile}",
                 "-e", f"nvidia_driver_version={OLD}")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = timed("status (no drift)", "status", str(inventory), "-e", f"@{varsfile}",
                 "-e", f"nvidia_driver_version={OLD}", "--output", "json")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["drift"] == {}
    for node in NODES:
        row = doc["nodes"][node]
        assert row["driver"]["installed"] == OLD and row["driver"]["desired"] == OLD
        assert row["driver"]["held"] is True
        assert row["toolkit"]["installed"] == lab_fixtures.BUILT_VERSION
        runtime = row["runtime"]
        assert (runtime["kind"], runtime["wired"], runtime["detail"]) == (
            "containerd",
            True,
            "effective configuration (containerd config dump)",
        )
        # the running containerd has the nvidia handler loaded, no restart owed
        assert runtime["restart_needed"] is False
        assert runtime["loaded"]["available"] is True and runtime["loaded"]["differences"] == []
        assert runtime["loaded"]["restart_pending"] is False
        assert row["reboot_required"] is False and row["gpus"] == "0"


def test_status_names_the_drift_of_a_node_changed_by_hand(lab):
    inventory, varsfile = lab
    proc = ssh(inventory, NODES[1], BY_HAND)
    assert proc.returncode == 0, proc.stderr
    assert f"nvidia-smi={NEW}" in installed_versions(inventory, NODES[1])
    proc = timed("status (drift)", "status", str(inventory), "-e", f"@{varsfile}",
                 "-e", f"nvidia_driver_version={OLD}", "--output", "json")  # fmt: skip
    assert proc.returncode == 5, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["exit_code"] == 5
    assert NODES[0] not in doc["drift"]
    assert doc["drift"][NODES[1]][0] == f"driver installed {NEW}, desired {OLD}"
    # apt-get install --allow-change-held-packages also dropped the hold
    assert "driver package nvidia-kernel-dkms not held" in doc["drift"][NODES[1]]
    text = run_cli(
        "status", str(inventory), "-e", f"@{varsfile}", "-e", f"nvidia_driver_version={OLD}"
    )
    assert text.returncode == 5 and "Drift on 1 of 2 node(s)" in text.stdout


def test_plan_lists_the_change_and_makes_none(lab):
    inventory, varsfile = lab
    before = {n: installed_versions(inventory, n) for n in NODES}
    proc = timed("plan", "plan", str(inventory), "-e", f"@{varsfile}",
                 "-e", f"nvidia_driver_version={OLD}", "--output", "json")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads(proc.stdout)["plan"]
    assert plan[NODES[0]]["upgrade"] == [] and plan[NODES[0]]["holds"] == []
    assert f"nvidia-kernel-dkms {NEW} -> {OLD}" in plan[NODES[1]]["upgrade"]
    assert f"nvidia-smi {NEW} -> {OLD}" in plan[NODES[1]]["upgrade"]
    assert "nvidia-kernel-dkms: install -> hold" in plan[NODES[1]]["holds"]
    assert {n: installed_versions(inventory, n) for n in NODES} == before
    text = run_cli(
        "plan", str(inventory), "-e", f"@{varsfile}", "-e", f"nvidia_driver_version={OLD}"
    )
    assert f"{NODES[0]}: no changes" in text.stdout
    assert f"{NODES[1]}: would change" in text.stdout and "Nothing was changed" in text.stdout
    assert {n: installed_versions(inventory, n) for n in NODES} == before


def _names(selections: str) -> set[str]:
    """Installed packages in `dpkg --get-selections` output (architecture suffix dropped)."""
    rows = [line.split() for line in selections.splitlines()]
    return {row[0].split(":")[0] for row in rows if len(row) == 2 and row[1] in ("install", "hold")}


def test_uninstall_leaves_the_nodes_as_they_were(lab):
    inventory, _ = lab
    installed = {node: snapshot(inventory, node) for node in NODES}
    # --check first: changes nothing, and names the packages the real uninstall then removes
    checked = timed("uninstall --check", "uninstall", str(inventory), "--components",
                    "driver,toolkit,runtime", "--check", "--output", "json")  # fmt: skip
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-2000:]
    doc = json.loads(checked.stdout)
    assert doc["check_mode"] is True and doc["command"] == "uninstall"
    assert {node: snapshot(inventory, node) for node in NODES} == installed, (
        "--check changed a node"
    )
    planned = {n: {item.split()[0] for item in doc["plan"][n]["remove"]} for n in NODES}
    for node in NODES:
        assert "nvidia-container-toolkit" in planned[node] and "nvidia-smi" in planned[node]
        assert "containerd: would restart" in doc["plan"][node]["services"], doc["plan"][node]
        files = [f["path"] for f in doc["plan"][node]["files"]]
        assert "/etc/apt/sources.list.d/gpustack-nvidia-container-toolkit.sources" in files, files
    proc = timed("uninstall", "uninstall", str(inventory), "--components",
                 "driver,toolkit,runtime", "--yes")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for node in NODES:
        removed = _names(installed[node]["selections"]) - _names(
            snapshot(inventory, node)["selections"]
        )
        assert removed == planned[node], (node, removed ^ planned[node])
    for node in NODES:
        after = snapshot(inventory, node)
        assert after["selections"] == BEFORE[node]["selections"], node
        assert after["apt"] == BEFORE[node]["apt"], node
        assert after["containerd"] == BEFORE[node]["containerd"], node
        assert ssh(inventory, node, "apt-mark showhold").stdout.strip() == ""
        assert ssh(inventory, node, "systemctl is-active containerd").stdout.strip() == "active"
