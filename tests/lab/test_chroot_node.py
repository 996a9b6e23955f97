"""A chroot node (`gpustack lab up --boot chroot`): a Debian 12 root filesystem booted with
systemd as PID 1 in namespaces of its own, as on a GPU host that systemd did not boot. On this
machine there is no GPU: install converges with the toolkit built from NVIDIA's Go module (and
the labelled libnvidia-container stand-ins), and smoke says
"no NVIDIA device". Run with `pytest -m lab`; needs root and debootstrap (no podman).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from gpustack.lab import chroot, nodes
from tests.conftest import run_cli
from tests.fixtures import lab_fixtures

pytestmark = pytest.mark.lab

LAB = os.environ.get("GPUSTACK_TEST_LAB_PREFIX", "") + f"ch{os.getpid()}"
NODE = f"{LAB}-node1"


def ssh(inventory: Path, command: str) -> subprocess.CompletedProcess:
    text = inventory.read_text()
    port = text.split("ansible_port=")[1].split()[0]
    key = text.split("ansible_ssh_private_key_file=")[1].split()[0]
    return subprocess.run(
        ["ssh", "-i", key, "-p", port, "-o", "StrictHostKeyChecking=no",
         "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR", "root@127.0.0.1", command],
        capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL,
    )  # fmt: skip


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("chroot") / "chroot.ini"
    varsfile = inventory.with_suffix(".vars.json")
    try:
        proc = run_cli("lab", "up", "--boot", "chroot", "--name", LAB,
                       "--inventory", str(inventory), timeout=1800)  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        state = nodes.state_of(LAB)
        # NVIDIA's toolkit repository is unreachable here: the labelled fixture repository.
        repo = lab_fixtures.publish_to_root(Path(state["chroot"]["root"]))
        imported = ssh(inventory, lab_fixtures.IMPORT_IMAGE)
        assert imported.returncode == 0, imported.stderr
        varsfile.write_text(json.dumps(lab_fixtures.extra_vars(repo)))
        yield inventory, varsfile
    finally:
        run_cli("lab", "down", "--name", LAB)


def test_systemd_is_pid_1_in_the_nodes_own_namespaces(node):
    inventory, _ = node
    proc = ssh(inventory, "cat /proc/1/comm; hostname; systemctl is-system-running --wait; "
                          "systemctl is-active containerd ssh; stat -f -c %T /sys/fs/cgroup; "
                          "findmnt -n -o OPTIONS /proc/sys; findmnt -n -o OPTIONS /sys")  # fmt: skip
    lines = proc.stdout.split()
    assert lines[:6] == ["systemd", NODE, "running", "active", "active", "cgroup2fs"], proc
    assert lines[6].startswith("ro,") and lines[7].startswith("ro,"), lines
    # The host's hostname and mounts are its own: the node's live in its namespaces.
    assert socket.gethostname() != NODE
    root = Path(nodes.state_of(LAB)["chroot"]["root"])
    assert chroot.mounts_under(root) == []
    # The node cannot write the host's sysctls (the value written back is the current one).
    write = ssh(
        inventory,
        "v=$(cat /proc/sys/vm/overcommit_memory); echo $v > /proc/sys/vm/overcommit_memory",
    )
    assert write.returncode != 0 and "Read-only file system" in write.stderr, write
    # The units that would act on the host through the shared kernel are masked.
    masked = ssh(inventory, "systemctl is-enabled systemd-sysctl systemd-binfmt getty.target")
    assert masked.stdout.split() == ["masked"] * 3, masked


def test_lab_up_again_reuses_the_running_node(node):
    inventory, _ = node
    before = inventory.read_text(), nodes.state_of(LAB)["chroot"]["init_pid"]
    proc = run_cli("lab", "up", "--boot", "chroot", "--name", LAB, "--inventory", str(inventory))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (inventory.read_text(), nodes.state_of(LAB)["chroot"]["init_pid"]) == before


def test_install_converges_and_the_container_check_runs_through_the_nvidia_runtime(node):
    inventory, varsfile = node
    for attempt in range(2):
        proc = run_cli("install", str(inventory), "-e", f"@{varsfile}", "--output", "json",
                       timeout=1800)  # fmt: skip
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
        host = json.loads(proc.stdout)["hosts"][NODE]
        assert host["status"] == ("changed" if attempt == 0 else "ok"), host
        if attempt:
            assert host["changed"] == 0, host["changes"]
    # containerd was restarted by the node's systemd and runs with gpustack's nvidia runtime.
    dump = ssh(inventory, "containerd config dump")
    assert 'BinaryName = "/usr/bin/nvidia-container-runtime"' in dump.stdout, dump.stderr
    # install's own container check went through NVIDIA's runtime (built from its Go module),
    # which passed the spec to runc unchanged: no GPU was asked for (internal/modifier/cdi.go).
    log = ssh(inventory, f"cat {lab_fixtures.RUNTIME_LOG}")
    assert "gpustack-verify" in log.stdout, log
    assert "No devices requested; no modification required." in log.stdout, log.stdout[-2000:]


def test_smoke_says_no_nvidia_device(node):
    inventory, _ = node
    proc = run_cli("smoke", str(inventory), "-o", "json", "-e", "gpu_smoke_snapshotter=native",
                   "--image", lab_fixtures.IMAGE_REF)  # fmt: skip
    assert proc.returncode == 3, proc.stdout[-3000:] + proc.stderr
    smoke = json.loads(proc.stdout)["smoke"][NODE]
    assert smoke["verdict"] == "no NVIDIA device", smoke
    checks = {c["name"]: c for c in smoke["checks"]}
    assert checks["gpu_pci"]["status"] == "absent"
    assert checks["runtime_config"]["status"] == "pass", checks["runtime_config"]
    # The smoke container asks for every GPU: NVIDIA's runtime (auto mode, jit-cdi) needs NVML to
    # generate their CDI spec and refuses the container without a loaded driver.
    container = checks["container"]
    assert container["status"] == "absent" and container["detail"]["started"] is False, container
    assert "failed to create the automatic CDI modifier" in container["summary"], container


def test_down_ends_every_process_and_mount_and_removes_the_node(node):
    inventory, _ = node
    state = nodes.state_of(LAB)
    cgroup, root = Path(state["chroot"]["cgroup"]), Path(state["chroot"]["root"])
    proc = run_cli("lab", "down", "--name", LAB)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not cgroup.exists(), "the node's cgroup is gone, so no process of it is left"
    assert not Path(f"/proc/{state['chroot']['init_pid']}").exists()
    assert chroot.mounts_under(root) == [] and not root.exists()
    assert not inventory.exists()
