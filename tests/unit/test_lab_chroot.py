"""Chroot lab nodes without booting one: what gets bound in, where the cgroup goes, the files
written before a boot, the inventory, packing, and bad input refused before any change.
(tests/lab/test_chroot_node.py boots a real one.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from gpustack.errors import BadInput, LabError
from gpustack.lab import chroot, nodes, rootfs
from tests.conftest import ROOT, run_cli


def _dev(tmp_path: Path, gpu: bool, driver: bool) -> tuple[Path, Path]:
    dev = tmp_path / "dev"
    dev.mkdir()
    (dev / "null").touch()
    if gpu:
        for name in ("nvidia0", "nvidiactl", "nvidia-uvm"):
            (dev / name).touch()
        (dev / "nvidia-caps").mkdir()
    tree = tmp_path / "usr-local-nvidia"
    if driver:
        (tree / "bin").mkdir(parents=True)
    return dev, tree


def test_gpu_host_binds_devices_read_write_and_the_driver_tree_read_only(tmp_path):
    dev, tree = _dev(tmp_path, gpu=True, driver=True)
    binds = chroot.device_binds(dev, tree)
    assert [(b.kind, b.mode, b.dest) for b in binds] == [
        ("dir", "rw", "/dev/nvidia-caps"),
        ("file", "rw", "/dev/nvidia-uvm"),
        ("file", "rw", "/dev/nvidia0"),
        ("file", "rw", "/dev/nvidiactl"),
        ("dir", "ro", "/usr/local/nvidia"),
    ]
    assert binds[-1].source == str(tree)
    assert chroot.has_gpu_devices(binds)


def test_host_without_gpu_binds_nothing(tmp_path):
    dev, tree = _dev(tmp_path, gpu=False, driver=False)
    assert chroot.device_binds(dev, tree) == []
    assert not chroot.has_gpu_devices([])


def test_parse_bind(tmp_path):
    (tmp_path / "repo").mkdir()
    bind = chroot.parse_bind(f"{tmp_path}/repo:/opt/repo:ro")
    assert (bind.kind, bind.mode, bind.source, bind.dest) == (
        "dir", "ro", str(tmp_path / "repo"), "/opt/repo",
    )  # fmt: skip
    assert chroot.parse_bind(f"{tmp_path}/repo:/opt/repo").mode == "rw"
    for bad in (f"{tmp_path}/repo", f"{tmp_path}/repo:opt", f"{tmp_path}/nope:/opt/x", ":/x"):
        with pytest.raises(BadInput):
            chroot.parse_bind(bad)


def _cgroup_root(tmp_path: Path, layout: str) -> str:
    root = tmp_path / "cgroup"
    root.mkdir(parents=True)
    if layout == "v2":
        (root / "cgroup.controllers").write_text("cpu memory pids\n")
        (root / "cgroup.procs").write_text("")
    elif layout == "hybrid":
        (root / "memory").mkdir()
        (root / "unified").mkdir()
        (root / "unified" / "cgroup.controllers").write_text("hugetlb\n")
        (root / "unified" / "cgroup.procs").write_text("")
    else:
        (root / "memory").mkdir()
    return str(root)


def test_cgroup_base_is_the_cgroup2_hierarchy(tmp_path):
    assert chroot.cgroup_base(_cgroup_root(tmp_path / "a", "v2")) == tmp_path / "a/cgroup"
    hybrid = chroot.cgroup_base(_cgroup_root(tmp_path / "b", "hybrid"))
    assert hybrid == tmp_path / "b/cgroup/unified"
    with pytest.raises(LabError, match="no cgroup2 hierarchy"):
        chroot.cgroup_base(_cgroup_root(tmp_path / "c", "v1"))


def test_boot_files(tmp_path):
    root = tmp_path / "root"
    for sub in ("etc/ssh/sshd_config.d", "etc/ld.so.conf.d"):
        (root / sub).mkdir(parents=True)
    chroot.write_boot_files(root, "lab-node1", 40123, "ssh-ed25519 AAAA key\n", gpu=True)
    assert (root / "etc/hostname").read_text() == "lab-node1\n"
    sshd = (root / chroot.SSHD_CONF).read_text()
    assert "Port 40123\n" in sshd and "ListenAddress 127.0.0.1\n" in sshd
    keys = root / "root/.ssh/authorized_keys"
    assert keys.read_text() == "ssh-ed25519 AAAA key\n" and keys.stat().st_mode & 0o777 == 0o600
    assert "/usr/local/nvidia/lib64" in (root / chroot.LD_CONF).read_text()
    chroot.write_boot_files(root, "lab-node1", 40124, "k\n", gpu=False)
    assert not (root / chroot.LD_CONF).exists()


def test_boot_scripts_are_valid_shell():
    for script in (chroot.OUTER, chroot.INNER):
        proc = subprocess.run(["sh", "-n", "-c", script], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def test_the_node_sees_proc_sys_and_sys_read_only_and_no_host_dev():
    inner = chroot.INNER
    assert 'remount,bind,ro,nosuid,nodev,noexec "$root/proc/sys"' in inner
    assert "mount -t sysfs -o ro," in inner
    assert 'mount -t tmpfs -o mode=755,nosuid tmpfs "$root/dev"' in inner
    assert "rbind /dev" not in inner


def test_mounts_under(tmp_path):
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 0:21 / /proc rw - proc proc rw\n"
        "90 1 8:1 /x /lab/a/rootfs rw - ext4 /dev/vda rw\n"
        "91 90 0:50 / /lab/a/rootfs/proc rw - proc proc rw\n"
        "92 1 8:1 /y /lab/ab rw - ext4 /dev/vda rw\n"
    )
    assert chroot.mounts_under(Path("/lab/a"), info) == ["/lab/a/rootfs", "/lab/a/rootfs/proc"]
    assert chroot.mounts_under(Path("/lab/c"), info) == []


@pytest.mark.parametrize("gpu", [True, False])
def test_chroot_inventory(tmp_path, gpu):
    path = tmp_path / "inv.ini"
    node = nodes.Node("sn-node1", "debian12", 40123, "")
    nodes.write_inventory(path, "sn", [node], tmp_path / "key", boot="chroot", gpu=gpu)
    text = path.read_text()
    assert text.startswith("# Written by `gpustack lab up --name sn --boot chroot`: a chroot node")
    assert "sn-node1 ansible_host=127.0.0.1 ansible_port=40123 lab_os=debian12\n" in text
    assert f"gpustack_require_gpu={'true' if gpu else 'false'}\n" in text
    assert ("NVIDIA devices bound in" in text) is gpu
    assert "ctr_args" not in text


def test_chroot_inventory_without_a_cpu_controller_asks_containers_for_no_cpu_weight(tmp_path):
    path = tmp_path / "inv.ini"
    node = nodes.Node("sn-node1", "debian12", 40123, "")
    nodes.write_inventory(path, "sn", [node], tmp_path / "k", boot="chroot", cpu_controller=False)
    text = path.read_text()
    assert 'container_runtime_verify_ctr_args=["--cpu-shares", "0"]\n' in text
    assert 'gpu_smoke_ctr_args=["--cpu-shares", "0"]\n' in text


def test_pack_and_unpack_round_trip(tmp_path):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / rootfs.BUILT_MARKER).write_text("os=debian12 recipe=abc\n")
    (root / "etc/os-release").write_text("ID=debian\n")
    (root / "usr/lib/python3/__pycache__").mkdir(parents=True)
    (root / "usr/lib/python3/__pycache__/x.cpython-311.pyc").write_bytes(b"\0")
    size = rootfs.pack(root, tmp_path / "out/node.tar.xz")
    assert size == (tmp_path / "out/node.tar.xz").stat().st_size > 0
    assert not list((tmp_path / "out").glob(".*partial"))
    back = rootfs.unpack(tmp_path / "out/node.tar.xz", tmp_path / "back")
    assert (back / "etc/os-release").read_text() == "ID=debian\n"
    assert rootfs.os_of(back) == "debian12"
    assert (back / "usr/lib/python3").is_dir() and not (
        back / "usr/lib/python3/__pycache__"
    ).exists()


def test_unpack_without_xz_uses_pythons_tarfile(tmp_path, monkeypatch):
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    (root / rootfs.BUILT_MARKER).write_text("os=debian12 recipe=abc\n")
    (root / "etc/hostname").write_text("x\n")
    rootfs.pack(root, tmp_path / "node.tar.xz")
    real_which = rootfs.shutil.which
    monkeypatch.setattr(rootfs.shutil, "which", lambda n: None if n == "xz" else real_which(n))
    back = rootfs.unpack(tmp_path / "node.tar.xz", tmp_path / "back")
    assert (back / "etc/hostname").read_text() == "x\n" and rootfs.is_built(back)


def test_unpack_refuses_a_tarball_that_is_no_node(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "x/file").write_text("x")
    subprocess.run(["tar", "-C", str(tmp_path / "x"), "-cJf", str(tmp_path / "x.tar.xz"), "."],
                   check=True)  # fmt: skip
    with pytest.raises(BadInput, match="holds no chroot node root filesystem"):
        rootfs.unpack(tmp_path / "x.tar.xz", tmp_path / "dest")
    assert not (tmp_path / "dest").exists()
    with pytest.raises(BadInput, match="holds no chroot node root filesystem"):
        rootfs.pack(tmp_path / "x", tmp_path / "y.tar.xz")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--boot", "chroot", "--nodes", "2"], "a chroot lab has exactly one node"),
        (["--boot", "vm"], "unknown --boot 'vm'"),
        (["--rootfs", "/tmp/x.tar.xz"], "--rootfs and --bind are for chroot nodes"),
        (["--boot", "chroot", "--os", "debian12,debian13"], "a chroot node has one OS"),
        (["--boot", "chroot", "--bind", "/nonexistent-sn:/x"], "does not exist"),
    ],
)
def test_bad_lab_up_is_refused_before_any_change(tmp_path, monkeypatch, args, message):
    monkeypatch.setenv("GPUSTACK_LAB_HOME", str(tmp_path / "home"))
    proc = run_cli("lab", "up", "--name", "snbad", *args)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("Error: ") and message in lines[0], proc.stderr
    assert lines[1].startswith("Hint: ")
    assert not (tmp_path / "home").exists()


SCRIPT = ROOT / "scripts/gpu-host-systemd-node.sh"


@pytest.mark.skipif(os.geteuid() != 0, reason="the script refuses to run without root")
def test_gpu_host_script_is_valid_bash_and_refuses_missing_payloads(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    proc = subprocess.run([str(SCRIPT), "run", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == f"Error: no {tmp_path}/gpu-node-rootfs.tar.xz", proc.stderr
    assert lines[1].startswith("Hint: run `") and "prepare" in lines[1]
    assert not (tmp_path / "out").exists() and list(tmp_path.iterdir()) == []
    usage = subprocess.run([str(SCRIPT), "help"], capture_output=True, text=True)
    assert usage.returncode == 2 and usage.stderr.startswith("Error: usage: ")
