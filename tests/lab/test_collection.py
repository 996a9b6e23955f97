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
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, lab_nodes, run_cli
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
    with lab_nodes(LAB, 1, inventory):
        varsfile = lab_fixtures.prepare([f"gpustack-{NODE}"], work / "fixture.json")
        yield work, inventory, varsfile


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


def user_run(work: Path, collections: Path, *args: str) -> tuple[int, str, dict[str, int]]:
    """ansible-playbook ARGS as a user runs it: (rc, output, the PLAY RECAP counts of NODE)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    env.update(ANSIBLE_COLLECTIONS_PATH=str(collections), ANSIBLE_COLLECTIONS_SCAN_SYS_PATH="False",
               ANSIBLE_HOST_KEY_CHECKING="False", ANSIBLE_FORCE_COLOR="False", ANSIBLE_NOCOLOR="True",
               ANSIBLE_ROLES_PATH=str(work / "no-roles-here"))  # fmt: skip
    proc = subprocess.run([BIN / "ansible-playbook", *args], capture_output=True, text=True,
                          env=env, cwd=work, timeout=1200)  # fmt: skip
    output = proc.stdout + proc.stderr
    recap = re.search(rf"^{re.escape(NODE)}\s+:(.*)$", proc.stdout, re.MULTILINE)
    assert recap, output[-4000:]
    counts = {key: int(value) for key, value in re.findall(r"(\w+)=(\d+)", recap.group(1))}
    return proc.returncode, output, counts


def test_user_playbook_runs_the_roles_by_collection_name(lab, collection):
    work, inventory, varsfile = lab
    playbook = work / "user-playbook.yml"  # outside the checkout: no playbook-adjacent content
    shutil.copy(ROOT / "tests/collection/user-playbook.yml", playbook)
    rc, output, counts = user_run(work, collection, "-i", str(inventory), "-e", f"@{varsfile}",
                                  str(playbook))  # fmt: skip
    assert rc == 0 and counts["failed"] == 0 and counts["unreachable"] == 0, output[-4000:]
    assert counts["changed"] > 0, counts  # a fresh node: the toolkit and the wiring were added
    # The roles ran as the collection's: Ansible names their tasks after the FQCN role.
    for role in ("gpu_preflight", "nvidia_container_toolkit", "container_runtime"):
        assert f"TASK [gpustack.gpustack.{role} : " in output, role
    assert "TASK [The nvidia runtime is wired, and a container ran through it]" in output
    assert re.search(r"All assertions passed", output), output[-4000:]

    rc, output, counts = user_run(work, collection, "-i", str(inventory), "-e", f"@{varsfile}",
                                  str(playbook))  # fmt: skip
    assert rc == 0 and counts["failed"] == 0, output[-4000:]
    assert counts["changed"] == 0, [line for line in output.splitlines() if "changed:" in line]


def test_a_role_without_the_preflight_facts_stops_through_the_collections_own_include(
    lab, collection
):
    """Roles inside the collection include each other by short name (container_runtime's
    include_role of gpu_preflight's require.yml, which runs only where the facts are missing):
    it resolves to the collection's own role, whose assert stops the host before any change."""
    work, inventory, _ = lab
    playbook = work / "without-preflight.yml"
    shutil.copy(ROOT / "tests/collection/without-preflight.yml", playbook)
    rc, output, counts = user_run(work, collection, "-i", str(inventory), str(playbook))
    assert rc != 0 and counts["failed"] == 1 and counts["changed"] == 0, output[-4000:]
    assert "TASK [gpustack.gpustack.gpu_preflight : Require preflight facts]" in output
    assert "gpustack_preflight facts are missing: run the gpu_preflight role first" in output


def test_collection_playbook_runs_by_its_name(lab, collection):
    work, inventory, _ = lab
    rc, output, counts = user_run(work, collection, "-i", str(inventory), "-v",
                                  "gpustack.gpustack.preflight")  # fmt: skip
    assert rc == 0 and counts["failed"] == 0 and counts["ok"] > 0, output[-4000:]
    assert "TASK [gpustack.gpustack.gpu_preflight : Gather GPU host facts]" in output
    # -v prints the module's result: the probe saw the node's OS and the containerd it runs.
    assert '"pretty_name": "Debian GNU/Linux 12 (bookworm)"' in output, output[-4000:]
    assert '"kind": "containerd"' in output


def test_cli_runs_the_same_roles_from_the_checkout(lab, tmp_path):
    """gpustack's own runs reach plugins/ through the collection path it sets (paths.py)."""
    _, inventory, varsfile = lab
    proc = run_cli("install", str(inventory), "--skip-tags", "nvidia_driver", "-e", f"@{varsfile}",
                   "--output", "json", env={"GPUSTACK_STATE_DIR": str(tmp_path / "state")})  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    assert doc["hosts"][NODE]["status"] != "failed", doc["hosts"][NODE]
