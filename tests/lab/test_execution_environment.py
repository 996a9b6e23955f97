"""The execution environment of execution-environment.yml, built and run as AWX runs it.

The image is built with ansible-builder and podman from a base made here (gpustack/lab/ee.py: a
debootstrapped Debian 12 with Python and pip; no registry is reachable), then the collection's
site playbook runs inside it through ansible-runner's container mode with the private data
directory AWX writes for a job (inventory/hosts, env/ssh_key for the machine credential,
env/extravars, project/) and the container options AWX adds (`--user=root`,
ansible/awx awx/main/tasks/jobs.py@e21dd0a0 build_execution_environment_params). The roles run
from the collection installed in the image, not from the checkout. The toolkit comes from the
TEST FIXTURE repository of tests/fixtures/lab_fixtures.py (NVIDIA's repository is unreachable
here); the node has no GPU; the driver is Debian's (nvidia_driver_source=distro).

CI time: the base image is built once per recipe and kept in podman's store (about 4 min under
load); the EE image is kept under a tag naming the hash of what goes into it, so it is rebuilt
only when the collection or the definition changes (about 3 min; podman's layer cache keeps the
base stage with ansible-core). The converge is one job of the site playbook on one fresh node
(a second job's changed=0 is left to tests/lab/test_collection.py and the CLI's lab tests, which
run the same roles; here it would double the time).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpustack.lab import ee
from gpustack.lab.podman import run as podman_run
from tests.conftest import ROOT, lab_nodes
from tests.fixtures import lab_fixtures

pytestmark = pytest.mark.lab

LAB = f"{os.environ.get('GPUSTACK_TEST_LAB_PREFIX', '')}ee{os.getpid()}"
NODE = f"{LAB}-node1"
BIN = Path(sys.executable).parent
IMAGE_REPOSITORY = "localhost/gpustack-ee"
COLLECTION_IN_IMAGE = "/usr/share/ansible/collections/ansible_collections/gpustack/gpustack"
# What goes into the image besides the base: the definition, its files and the collection.
IMAGE_INPUTS = ["execution-environment.yml", "ee/requirements.txt", "ee/bindep.txt",
                "ee/requirements.yml", "galaxy.yml", "meta", "roles", "playbooks", "plugins",
                "README.md", "docs", "scripts/ee-build.sh"]  # fmt: skip


def inputs_hash(base: str) -> str:
    digest = hashlib.sha256(base.encode())
    for name in IMAGE_INPUTS:
        path = ROOT / name
        for file in sorted(path.rglob("*")) if path.is_dir() else [path]:
            if file.is_file() and "__pycache__" not in file.parts:
                digest.update(str(file.relative_to(ROOT)).encode() + b"\0" + file.read_bytes())
    return digest.hexdigest()[:12]


@pytest.fixture(scope="module")
def image() -> str:
    base = ee.ensure_base_image()
    tag = f"{IMAGE_REPOSITORY}:test-{inputs_hash(base)}"
    if podman_run(["podman", "image", "exists", tag], check=False).returncode != 0:
        build = subprocess.run(
            [ROOT / "scripts/ee-build.sh", "--build", "-t", tag, "--container-runtime", "podman",
             "--build-arg", f"EE_BASE_IMAGE={base}",
             "--extra-build-cli-args", " ".join(ee.engine_options())],
            capture_output=True, text=True, cwd=ROOT, timeout=3600, env={**os.environ, "BIN": str(BIN)},
        )  # fmt: skip
        assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
        listed = podman_run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}",
                             IMAGE_REPOSITORY], check=False)  # fmt: skip
        for ref in listed.stdout.decode().split():
            if ref.startswith(f"{IMAGE_REPOSITORY}:test-") and ref != tag:
                podman_run(["podman", "rmi", ref], check=False)  # an older build of this test
    return tag


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    work = tmp_path_factory.mktemp("ee")
    inventory = work / "lab.ini"
    with lab_nodes(LAB, 1, inventory):
        varsfile = lab_fixtures.prepare([f"gpustack-{NODE}"], work / "fixture.json")
        yield work, inventory, varsfile


def job_dir(work: Path, inventory: Path, varsfile: Path, name: str) -> Path:
    """A private data directory shaped as AWX writes one for a job of a project that imports
    the collection's site playbook, with a machine credential (the lab's key)."""
    pdd = work / name
    for sub in ("inventory", "env", "project"):
        (pdd / sub).mkdir(parents=True)
    key = None
    lines = []
    for line in inventory.read_text().splitlines():
        if line.startswith("ansible_ssh_private_key_file="):
            key = Path(line.split("=", 1)[1])
        else:
            lines.append(line)
    assert key is not None
    (pdd / "inventory/hosts").write_text("\n".join(lines) + "\n")
    shutil.copy(key, pdd / "env/ssh_key")
    shutil.copy(varsfile, pdd / "env/extravars")
    (pdd / "project/site.yml").write_text(
        "- name: The GPU host stack\n  ansible.builtin.import_playbook: gpustack.gpustack.site\n"
    )
    return pdd


def run_job(pdd: Path, image: str) -> tuple[int, str, list[dict]]:
    """ansible-runner in container mode, as AWX starts a job: (rc, output, job events)."""
    options = ["--user=root", "--network=host", *ee.engine_options()]
    proc = subprocess.run(
        [BIN / "ansible-runner", "run", pdd, "-p", "site.yml", "--ident", "job",
         "--process-isolation", "--process-isolation-executable", "podman",
         "--container-image", image, *[f"--container-option={o}" for o in options]],
        capture_output=True, text=True, timeout=2400,
    )  # fmt: skip
    events_dir = pdd / "artifacts/job/job_events"
    events = [json.loads(p.read_text()) for p in sorted(events_dir.glob("*.json"))]
    return proc.returncode, proc.stdout + proc.stderr, sorted(events, key=lambda e: e["counter"])


def recap(events: list[dict]) -> dict[str, int]:
    (stats,) = [e["event_data"] for e in events if e["event"] == "playbook_on_stats"]
    return {key: stats.get(key, {}).get(NODE, 0) for key in ("ok", "changed", "failures", "dark")}


def test_image_holds_the_collection_and_its_dependencies(image):
    proc = subprocess.run(
        ["podman", "run", "--rm", *ee.engine_options(), image, "sh", "-c",
         "ansible-galaxy collection list gpustack.gpustack --format json;"
         " python3 -c 'import tomlkit'; command -v ssh ssh-agent ansible-runner"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    listed = json.loads(proc.stdout[: proc.stdout.rindex("}") + 1])
    version = (ROOT / "galaxy.yml").read_text().split("version:", 1)[1].split()[0]
    assert listed["/usr/share/ansible/collections/ansible_collections"] == {
        "gpustack.gpustack": {"version": version}
    }


def test_site_playbook_converges_a_node_from_the_image(image, lab):
    work, inventory, varsfile = lab
    rc, output, events = run_job(job_dir(work, inventory, varsfile, "job1"), image)
    assert rc == 0, output[-6000:]
    counts = recap(events)
    assert counts["failures"] == 0 and counts["dark"] == 0 and counts["changed"] > 0, counts
    # The job ran in the image: ansible-runner started it with podman, and every task came from
    # the collection installed there (not from the checkout, which the container cannot see).
    command = json.loads((work / "job1/artifacts/job/command").read_text())["command"]
    assert command[:2] == ["podman", "run"] and image in command, command
    paths = {e["event_data"]["task_path"].split(":")[0] for e in events
             if e["event"] == "runner_on_ok" and e["event_data"].get("task_path")}  # fmt: skip
    assert f"{COLLECTION_IN_IMAGE}/playbooks/site.yml" in paths, paths
    assert all(p.startswith(COLLECTION_IN_IMAGE + "/") for p in paths), paths
    ran = {e["event_data"]["role"] for e in events if e["event"] == "runner_on_ok"}
    assert {"gpu_preflight", "nvidia_driver", "nvidia_container_toolkit",
            "container_runtime"} <= ran, ran  # fmt: skip

    # The node is converged: toolkit held at the fixture's version, containerd wired and running.
    check = subprocess.run(
        ["podman", "exec", f"gpustack-{NODE}", "sh", "-c",
         "dpkg-query -W -f='${Status} ${Version}\\n' nvidia-container-toolkit;"
         " apt-mark showhold; grep -l nvidia /etc/containerd/conf.d/*.toml;"
         " systemctl is-active containerd"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert check.returncode == 0, check.stdout + check.stderr
    assert f"hold ok installed {lab_fixtures.BUILT_VERSION}" in check.stdout, check.stdout
    assert "nvidia-container-toolkit" in check.stdout.split("\n", 1)[1], check.stdout
    assert check.stdout.rstrip().endswith("active"), check.stdout
