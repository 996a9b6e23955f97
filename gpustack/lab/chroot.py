"""Chroot lab nodes: a root filesystem booted with systemd as PID 1 in new PID, mount, UTS, IPC
and cgroup namespaces, for hosts that systemd did not boot (a GPU VM whose PID 1 is an agent).

The node shares the host's kernel and network namespace: sshd listens on a loopback port of the
host. It gets its own /proc (with /proc/sys read-only), a read-only /sys, a cgroup2 hierarchy
rooted at a cgroup of its own, its own /dev (a tmpfs with the basic device nodes and a private
devpts) and, when the host has them, the NVIDIA device nodes and the driver tree
/usr/local/nvidia (read-only). Nothing is mounted in the host's mount namespace: the mounts live
and die with the node's namespace. Teardown: poweroff to the node's systemd, then cgroup.kill.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from gpustack.errors import BadInput, LabError
from gpustack.lab.podman import CGROUP_ROOT, cgroup_layout

DRIVER_TREE = "/usr/local/nvidia"
LD_CONF = "etc/ld.so.conf.d/000-gpustack-lab-nvidia.conf"
SSHD_CONF = "etc/ssh/sshd_config.d/10-gpustack-lab.conf"

# Run as `sh -c OUTER sh ROOT NAME CGROUP RELEASE BINDS`, INNER in the environment. The outer
# shell enters the node's cgroup and becomes unshare; unshare's child (PID 1 of the new PID
# namespace) mounts the node's filesystems in its private mount namespace, waits until the host
# side has moved unshare out of the node's cgroup (cgroup v2 allows no process in a cgroup whose
# children get controllers), then executes systemd in the chroot.
OUTER = 'echo $$ > "$3/node/cgroup.procs" && exec unshare --fork --pid --mount --uts --ipc --cgroup /bin/sh -euc "$INNER" sh "$@"'  # noqa: E501
INNER = r"""
root=$1 name=$2 release=$4 binds=$5
mount --make-rprivate /
mount --bind "$root" "$root"
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
mount --bind "$root/proc/sys" "$root/proc/sys"
mount -o remount,bind,ro,nosuid,nodev,noexec "$root/proc/sys"
mount -t sysfs -o ro,nosuid,nodev,noexec sysfs "$root/sys"
mount -t cgroup2 -o nosuid,nodev,noexec cgroup2 "$root/sys/fs/cgroup"
mount -t tmpfs -o mode=755,nosuid,nodev tmpfs "$root/run"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/tmp"
mount -t tmpfs -o mode=755,nosuid tmpfs "$root/dev"
for spec in null:1:3 zero:1:5 full:1:7 random:1:8 urandom:1:9 tty:5:0; do
    n=${spec%%:*} mm=${spec#*:}
    mknod -m 666 "$root/dev/$n" c "${mm%:*}" "${mm#*:}"
done
mkdir -p "$root/dev/pts" "$root/dev/shm" "$root/dev/mqueue"
mount -t devpts -o newinstance,ptmxmode=0666,mode=620,gid=5 devpts "$root/dev/pts"
ln -s pts/ptmx "$root/dev/ptmx"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
mount -t mqueue -o nosuid,nodev,noexec mqueue "$root/dev/mqueue"
ln -s /proc/self/fd "$root/dev/fd"
for i in 0:stdin 1:stdout 2:stderr; do ln -s "/proc/self/fd/${i%%:*}" "$root/dev/${i#*:}"; done
while IFS=' ' read -r kind mode src dest; do
    [ -n "$kind" ] || continue
    if [ "$kind" = dir ]; then
        mkdir -p "$root$dest"
    else
        mkdir -p "$(dirname "$root$dest")"; [ -e "$root$dest" ] || : > "$root$dest"
    fi
    mount --rbind "$src" "$root$dest"
    [ "$mode" = rw ] || mount -o remount,bind,ro "$root$dest"
done < "$binds"
echo "$name" > /proc/sys/kernel/hostname
[ ! -e "$root/etc/ld.so.conf.d/000-gpustack-lab-nvidia.conf" ] || chroot "$root" /sbin/ldconfig
i=0
while [ ! -e "$release" ]; do
    i=$((i + 1)); [ "$i" -lt 600 ] || { echo "gpustack lab: not released" >&2; exit 1; }
    sleep 0.1
done
exec chroot "$root" /usr/bin/env -i container=other PATH=/usr/sbin:/usr/bin:/sbin:/bin \
    /lib/systemd/systemd --system
"""


@dataclass(frozen=True)
class Bind:
    kind: str  # "dir" or "file" (what the mount point in the node is)
    mode: str  # "ro" or "rw"
    source: str
    dest: str

    def line(self) -> str:
        if any(" " in part or "\n" in part for part in (self.source, self.dest)):
            raise BadInput(f"cannot bind {self.source!r}: spaces in a path", "use another path")
        return f"{self.kind} {self.mode} {self.source} {self.dest}"


def parse_bind(text: str) -> Bind:
    """`SRC:DEST[:ro|rw]` (--bind) as a Bind; SRC must exist on the host."""
    parts = text.split(":")
    mode = parts.pop() if len(parts) == 3 and parts[-1] in ("ro", "rw") else "rw"
    if len(parts) != 2 or not parts[0] or not parts[1].startswith("/"):
        raise BadInput(f"--bind {text!r} is not SRC:DEST[:ro|rw]",
                       "for example --bind /srv/repo:/opt/repo:ro (DEST is absolute)")  # fmt: skip
    source = Path(parts[0]).expanduser().resolve()
    if not source.exists():
        raise BadInput(f"--bind {text!r}: {source} does not exist", "give an existing path")
    return Bind("dir" if source.is_dir() else "file", mode, str(source), parts[1])


def device_binds(dev: Path = Path("/dev"), driver_tree: Path = Path(DRIVER_TREE)) -> list[Bind]:
    """The host's NVIDIA device nodes (read-write, as a container gets them) and its driver
    tree (read-only: the node must never change the host's driver)."""
    binds = []
    for path in sorted(dev.glob("nvidia*")) if dev.is_dir() else []:
        kind = "dir" if path.is_dir() else "file"
        binds.append(Bind(kind, "rw", str(path), f"/dev/{path.name}"))
    if driver_tree.is_dir():
        binds.append(Bind("dir", "ro", str(driver_tree), DRIVER_TREE))
    return binds


def has_gpu_devices(binds: list[Bind]) -> bool:
    return any(b.dest == "/dev/nvidiactl" for b in binds)


def cgroup_base(root: str = CGROUP_ROOT) -> Path:
    """Where the node's cgroup goes: the cgroup2 hierarchy (on a hybrid host, its `unified`
    mount, which carries no controller the node could use)."""
    if cgroup_layout(root) == "v2":
        return Path(root)
    if (Path(root) / "unified" / "cgroup.procs").exists():  # hybrid, with or without controllers
        return Path(root) / "unified"
    raise LabError(
        "this host mounts no cgroup2 hierarchy, which a chroot node's systemd needs",
        "boot the host with cgroup v2 or the hybrid layout (systemd.unified_cgroup_hierarchy)",
    )


def cgroup_name(lab: str) -> str:
    return f"gpustack-lab-{lab}"


def write_boot_files(root: Path, hostname: str, port: int, public_key: str, gpu: bool) -> None:
    """What a node needs before each boot: its name, sshd on the host's loopback, the lab's
    key, and the loader path of a driver tree bound in."""
    (root / "etc/hostname").write_text(hostname + "\n")
    (root / SSHD_CONF).write_text(
        "# gpustack lab: the node shares the host's network namespace.\n"
        f"Port {port}\nListenAddress 127.0.0.1\n"
    )
    ssh_dir = root / "root/.ssh"
    ssh_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    keys = ssh_dir / "authorized_keys"
    keys.write_text(public_key)
    keys.chmod(0o600)
    ld_conf = root / LD_CONF
    if gpu:
        ld_conf.write_text(f"# gpustack lab: the host's driver tree\n{DRIVER_TREE}/lib64\n")
    else:
        ld_conf.unlink(missing_ok=True)


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(p) for p in text.split()]


def boot(root: Path, lab: str, hostname: str, state_dir: Path, binds: list[Bind]) -> dict:
    """Start the node; returns what `stop` needs: the cgroup, unshare's and systemd's PIDs."""
    base = cgroup_base()
    cgroup = base / cgroup_name(lab)
    if (cgroup / "node").exists():
        stop({"cgroup": str(cgroup)})
    for sub in ("", "node", "supervisor"):
        (cgroup / sub).mkdir(exist_ok=True)
    _delegate_controllers(cgroup)
    binds_file = state_dir / "binds"
    binds_file.write_text("".join(b.line() + "\n" for b in binds))
    release = state_dir / "released"
    release.unlink(missing_ok=True)
    console = (state_dir / "console.log").open("ab")
    env = {"INNER": INNER, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    try:
        proc = subprocess.Popen(
            ["/bin/sh", "-c", OUTER, "sh", str(root), hostname, str(cgroup), str(release),
             str(binds_file)],
            env=env, stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    except OSError as exc:
        raise LabError(f"could not start the node: {exc}", "is unshare installed?") from None
    finally:
        console.close()
    deadline = time.monotonic() + 30
    while not (init := _children(proc.pid)):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise LabError(
                f"the node did not start (exit {proc.poll()}): {_tail(state_dir / 'console.log')}",
                "it needs root, unshare and chroot; see the console log in the lab's directory",
            )
        time.sleep(0.05)
    (cgroup / "supervisor" / "cgroup.procs").write_text(str(proc.pid))
    release.touch()
    controllers = (cgroup / "node" / "cgroup.controllers").read_text().split()
    return {"cgroup": str(cgroup), "pid": proc.pid, "init_pid": init[0], "root": str(root),
            "controllers": controllers}  # fmt: skip


def _delegate_controllers(cgroup: Path) -> None:
    """Give the node every controller its parent offers it (none on a hybrid host)."""
    controllers = (cgroup / "cgroup.controllers").read_text().split()
    if controllers:
        (cgroup / "cgroup.subtree_control").write_text(" ".join(f"+{c}" for c in controllers))


def _tail(path: Path) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[-1] if lines else ""


def _procs(cgroup: Path) -> list[int]:
    pids = []
    for procs in cgroup.rglob("cgroup.procs") if cgroup.is_dir() else []:
        with contextlib.suppress(OSError):
            pids += [int(p) for p in procs.read_text().split()]
    return pids


def running(node: dict) -> bool:
    """Whether the node's systemd still runs (in the node's cgroup: PIDs get reused)."""
    pid = node.get("init_pid")
    if not pid:
        return False
    try:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
    except OSError:
        return False
    name = Path(node["cgroup"]).name
    return any(line.startswith("0::") and f"/{name}/node" in line for line in lines)


def stop(node: dict, timeout: float = 30) -> None:
    """Power the node off (SIGRTMIN+4 to its systemd), kill what is left in its cgroup, remove
    the cgroup. The node's mounts end with its namespace."""
    cgroup = Path(node["cgroup"])
    if running(node):
        with contextlib.suppress(ProcessLookupError):
            os.kill(node["init_pid"], signal.SIGRTMIN + 4)
        deadline = time.monotonic() + timeout
        while running(node) and time.monotonic() < deadline:
            time.sleep(0.2)
    deadline = time.monotonic() + timeout
    while _procs(cgroup):
        kill = cgroup / "cgroup.kill"
        if kill.exists():
            kill.write_text("1")
        else:
            for pid in _procs(cgroup):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise LabError(f"processes left in {cgroup}: {_procs(cgroup)}",
                           "look at them with `ps` and end them by PID")  # fmt: skip
        time.sleep(0.1)
    for sub in sorted((p for p in cgroup.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
        with contextlib.suppress(OSError):
            sub.rmdir()
    with contextlib.suppress(FileNotFoundError):
        cgroup.rmdir()


def mounts_under(root: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> list[str]:
    """Mount points at or below `root` in this mount namespace (none once a node is down)."""
    prefix = str(root).rstrip("/")
    found = []
    for line in mountinfo.read_text().splitlines():
        point = line.split()[4].replace("\\040", " ")
        if point == prefix or point.startswith(prefix + "/"):
            found.append(point)
    return found


def sshd_answers(port: int, timeout: float = 2) -> bool:
    """Whether an SSH server greets on 127.0.0.1:port (no SSH client needed on the host)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
            sock.settimeout(timeout)
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False
