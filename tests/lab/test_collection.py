"""The collection gpustack.gpustack as a user gets it: built with `ansible-galaxy collection
build`, installed from the tarball into a temporary path (offline, no Galaxy server), and used
from a user's own playbook (tests/collection/user-playbook.yml) that names the roles by their
collection names, on a real lab node (Debian 12: real apt, systemd, containerd).

The run sees only the installed collection: ANSIBLE_COLLECTIONS_PATH is the temporary path
alone, no roles path, no sys.path scan, and it starts outside the checkout (whose ansible.cfg
would point at the checkout). Toolkit packages come from the TEST FIXTURE repository of
tests/fixtures/lab_fixtures.py (NVIDIA's repository is unreachable here); the node has no GPU.
Then the gpustack CLI runs the same roles from the checkout, proving its own collection path.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli
from tests.fixtures import lab_fixtures

pytestmark = pytest.mark.lab

# GPUSTACK_TEST_LAB_PREFIX keeps parallel runs on one machine apart (it prefixes the lab name).
LAB = f"{os.environ.get('GPUSTACK_TEST_LAB_PREFIX', '')}col{os.getpid()}"
NODE = f"{LAB}-node1"
BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    work = tmp_path_factory.mktemp("collection")
    inventory = work / "lab.ini"
    proc = run_cli("lab", "up", "--name", LAB, "--nodes", "1", "--os", "debian12",
                   "--inventory", str(inventory), timeout=1800)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    try:
        varsfile = lab_fixtures.prepare([f"gpustack-{NODE}"], work / "fixture.json")
        yield work, inventory, varsfile
    finally:
        run_cli("lab", "down", "--name", LAB)


@pytest.fixture(scope="module")
def collection(lab):
    """gpustack.gpustack built from the checkout and installed from its tarball."""
    work = lab[0]
    build = subprocess.run(
        [BIN / "ansible-galaxy", "collection", "build", "--output-path", work / "dist", ROOT],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert build.returncode == 0, build.stdout + build.stderr
    (tarball,) = (work / "dist").glob("gpustack-gpustack-*.tar.gz")
    path = work / "collections"
    install = subprocess.run(
        [BIN / "ansible-galaxy", "collection", "install", "--offline", "-p", path, tarball],
        capture_output=True, text=True, timeout=300, cwd=work,
    )  # fmt: skip
    assert install.returncode == 0, install.stdout + install.stderr
    assert (
        path / "ansible_collections/gpustack/gpustack/plugins/modules/gpustack_host_probe.py"
    ).is_file()
    return path


def user_run(work: Path, collections: Path, *args: str) -> dict:
    """ansible-playbook ARGS as a user runs it, with the json callback; its parsed output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="False",
               ANSIBLE_STDOUT_CALLBACK="ansible.builtin.json", ANSIBLE_HOST_KEY_CHECKING="False",
               ANSIBLE_ROLES_PATH=str(work / "no-roles-here"))  # fmt: skip
    proc = subprocess.run([BIN / "ansible-playbook", *args], capture_output=True, text=True,
                          env=env, cwd=work, timeout=1200)  # fmt: skip
    assert proc.stdout.startswith("{"), proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    doc["rc"] = proc.returncode
    return doc


def failures(doc: dict) -> list:
    return [
        (task["task"]["name"], host, result.get("msg"))
        for play in doc["plays"]
        for task in play["tasks"]
        for host, result in task["hosts"].items()
        if result.get("failed") or result.get("unreachable")
    ]


def test_user_playbook_runs_the_roles_by_collection_name(lab, collection):
    work, inventory, varsfile = lab
    playbook = work / "user-playbook.yml"  # outside the checkout: no playbook-adjacent content
    shutil.copy(ROOT / "tests/collection/user-playbook.yml", playbook)
    first = user_run(work, collection, "-i", str(inventory), "-e", f"@{varsfile}", str(playbook))
    assert first["rc"] == 0, failures(first)
    stats = first["stats"][NODE]
    assert stats["failures"] == 0 and stats["changed"] > 0, stats
    ran = {task["task"]["name"] for play in first["plays"] for task in play["tasks"]}
    # The roles ran as the collection's (their tasks are named after the FQCN role).
    assert any(name.startswith("gpustack.gpustack.container_runtime : ") for name in ran), ran
    assert "The nvidia runtime is wired, and a container ran through it" in ran

    second = user_run(work, collection, "-i", str(inventory), "-e", f"@{varsfile}", str(playbook))
    assert second["rc"] == 0, failures(second)
    assert second["stats"][NODE]["changed"] == 0, [
        (t["task"]["name"], h)
        for p in second["plays"] for t in p["tasks"]
        for h, r in t["hosts"].items() if r.get("changed")
    ]  # fmt: skip


def test_collection_playbook_runs_by_its_name(lab, collection):
    work, inventory, _ = lab
    doc = user_run(work, collection, "-i", str(inventory), "gpustack.gpustack.preflight")
    assert doc["rc"] == 0, failures(doc)
    probe = next(
        task["hosts"][NODE]
        for play in doc["plays"]
        for task in play["tasks"]
        if task["task"]["name"] == "gpustack.gpustack.gpu_preflight : Gather GPU host facts"
    )
    facts = probe["ansible_facts"]["gpustack_preflight"]
    assert facts["os"]["id"] == "debian" and facts["os"]["version_id"] == "12"
    containerd = [r for r in facts["runtimes"] if r["kind"] == "containerd"]
    assert containerd and containerd[0]["active"], facts["runtimes"]


def test_cli_runs_the_same_roles_from_the_checkout(lab, tmp_path):
    """gpustack's own runs reach plugins/ through the collection path it sets (paths.py)."""
    _, inventory, varsfile = lab
    proc = run_cli("install", str(inventory), "--skip-tags", "nvidia_driver", "-e", f"@{varsfile}",
                   "--output", "json", env={"GPUSTACK_STATE_DIR": str(tmp_path / "state")})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["hosts"][NODE]["status"] != "failed", doc["hosts"][NODE]
