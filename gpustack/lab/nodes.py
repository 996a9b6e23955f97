"""A local lab of systemd "nodes" reachable by SSH, to run gpustack against for real.

Podman nodes (the default): images from images.py (debootstrap, cached); every node bind-mounts
one shared apt archive cache. Chroot nodes (`--boot chroot`, chroot.py): one node booted from a
root filesystem (rootfs.py) in namespaces of its own, for hosts without systemd or podman, with
the host's NVIDIA devices and driver tree bound in when it has them. No GPU is faked.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from gpustack.errors import BadInput, LabError
from gpustack.lab import chroot, rootfs
from gpustack.lab.images import OS_SPECS, apt_cache_dir, ensure_image, image_name, parse_os_list
from gpustack.lab.podman import LABEL, oci_runtime, preconditions, run

BOOTS = ("podman", "chroot")
NO_GPU_VARS = [
    "# Lab nodes have no GPU and share the host machine's kernel (no headers for it).",
    "gpustack_require_gpu=false",
]
GPU_VARS = [
    "# The host's NVIDIA devices and driver tree are bound into the node.",
    "gpustack_require_gpu=true",
]

ULIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]


@dataclass
class Node:
    name: str
    os: str
    port: int
    container: str


def _home() -> Path:
    base = os.environ.get("GPUSTACK_LAB_HOME") or os.path.join(
        os.environ.get("XDG_DATA_HOME") or os.path.expanduser("~/.local/share"), "gpustack", "lab"
    )
    return Path(base)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _lab_dir(name: str) -> Path:
    return _home() / name


def _state_path(name: str) -> Path:
    return _lab_dir(name) / "state.json"


def _load_state(name: str) -> dict:
    try:
        return json.loads(_state_path(name).read_text())
    except (OSError, ValueError):
        return {}


def state_of(name: str) -> dict:
    """What `up` recorded for lab `name` (nodes, inventory; a chroot node's root and cgroup)."""
    return _load_state(name)


def _container_info(container: str) -> dict | None:
    proc = run(["podman", "container", "inspect", container], check=False)
    if proc.returncode != 0:
        return None
    data = json.loads(proc.stdout or b"[]")
    return data[0] if data else None


def _ssh_args(key: Path, port: int) -> list[str]:
    return [
        "ssh",
        "-i",
        str(key),
        "-p",
        str(port),
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "ConnectTimeout=5",
        "root@127.0.0.1",
    ]


def _wait_for_ssh(node: Node, key: Path, timeout: float = 120, hint: str = "") -> None:
    """Until `ssh true` works; where the host has no SSH client (a chroot node's host may not),
    until sshd greets on the port."""
    deadline = time.monotonic() + timeout
    last = ""
    client = shutil.which("ssh")
    while time.monotonic() < deadline:
        if client:
            proc = run([*_ssh_args(key, node.port), "true"], check=False, timeout=30)
            if proc.returncode == 0:
                return
            last = proc.stderr.decode(errors="replace").strip()
        elif chroot.sshd_answers(node.port):
            return
        time.sleep(1)
    raise LabError(
        f"node {node.name} did not answer SSH on 127.0.0.1:{node.port}: {last}",
        hint or f"inspect it: podman exec {node.container} systemctl status ssh",
    )


def _containerd_volume(container: str) -> str:
    return f"{container}-containerd"


def _start_node(node: Node, image: str, key: Path, init: str, kubernetes: bool = False) -> None:
    run(["podman", "rm", "-f", "-i", node.container])
    runtime = oci_runtime()
    # A Kubernetes node's /var/lib/containerd is a volume on the machine's own filesystem:
    # containerd's default overlayfs snapshotter cannot mount overlay on the node's overlay root.
    volumes = (
        ["-v", f"{_containerd_volume(node.container)}:/var/lib/containerd"] if kubernetes else []
    )
    # fmt: off
    run(["podman", *(["--runtime", runtime] if runtime else []),
          "run", "-d", "--name", node.container, "--hostname", node.name,
          "--label", f"{LABEL}={node.container.split('-node')[0]}",
          "--systemd=always", "--privileged", *ULIMITS,
          "-p", f"127.0.0.1:{node.port}:22",
          "-v", f"{key}.pub:/root/.ssh/authorized_keys:ro",
          "-v", f"{apt_cache_dir()}:/var/cache/apt/archives", *volumes,
          image, init])
    # fmt: on


def _start_new_node(
    name: str, spec, container: str, image: str, key: Path, kubernetes: bool = False
) -> Node:
    """Start a node on a free port; another lab starting at the same time (the lab suite runs
    files in parallel) may take that port before podman binds it: then take another."""
    tries_left = 3
    while True:
        node = Node(name, spec.key, _free_port(), container)
        try:
            _start_node(node, image, key, spec.init, kubernetes)
            return node
        except LabError as exc:
            tries_left -= 1
            if "address already in use" not in str(exc) or not tries_left:
                raise


def _reuse_node(node: Node, image: str, kubernetes: bool = False) -> bool:
    """Keep a node of an earlier `up`: running as is, or stopped and started again."""
    info = _container_info(node.container)
    if not info or image not in (info.get("ImageName"), (info.get("Config") or {}).get("Image")):
        return False
    mounts = {m.get("Destination") for m in info.get("Mounts") or []}
    if kubernetes and "/var/lib/containerd" not in mounts:
        return False  # started without Kubernetes: start it afresh
    if (info.get("State") or {}).get("Status") == "running":
        # podman still says "running" where the container's processes were killed with its conmon
        # (nothing was left to record the exit; seen after a machine's processes were cleared):
        # `podman exec` then fails with "cannot exec in a stopped container", and such a node is
        # started afresh.
        return run(["podman", "exec", node.container, "true"], check=False).returncode == 0
    # Nodes of an earlier run may be exited or in an unknown state: try a restart first.
    return run(["podman", "start", node.container], check=False).returncode == 0


# A chroot node on a cgroup v1 "hybrid" host gets the host's cgroup2 hierarchy, which carries no
# cpu controller there: a container that asks for a CPU weight fails ("openat2 .../cpu.weight: no
# such file or directory"), so the container checks ask for none.
NO_CPU_CONTROLLER_VARS = [
    "# The node's cgroup2 hierarchy has no cpu controller here (cgroup v1 hybrid host).",
    'container_runtime_verify_ctr_args=["--cpu-shares", "0"]',
    'gpu_smoke_ctr_args=["--cpu-shares", "0"]',
]


def write_inventory(
    path: Path,
    lab: str,
    nodes: list[Node],
    key: Path,
    boot: str = "podman",
    gpu: bool = False,
    cpu_controller: bool = True,
    kubeconfig: Path | None = None,
) -> None:
    if boot == "chroot":
        what = "a chroot node with systemd as PID 1" + (
            ", the host's NVIDIA devices bound in" if gpu else ", no NVIDIA device on this host"
        )
    else:
        what = "podman systemd nodes, no GPUs"
    command = f"gpustack lab up --name {lab}" + (" --boot chroot" if boot == "chroot" else "")
    lines = [f"# Written by `{command}`: {what}.", "[gpu_nodes]"]
    lines += [f"{n.name} ansible_host=127.0.0.1 ansible_port={n.port} lab_os={n.os}" for n in nodes]
    lines += [
        "",
        "[gpu_nodes:vars]",
        "ansible_user=root",
        f"ansible_ssh_private_key_file={key}",
        "ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
        " -o LogLevel=ERROR'",
        "ansible_python_interpreter=/usr/bin/python3",
        *(GPU_VARS if gpu else NO_GPU_VARS),
        "gpustack_lab=true",
        "nvidia_driver_source=distro",
        *([] if cpu_controller else NO_CPU_CONTROLLER_VARS),
        "",
    ]
    if kubeconfig:
        lines[1:1] = [f"# Kubernetes: gpustack install {path} --kubeconfig {kubeconfig}"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")


def check_name(name: str) -> None:
    """A lab name is a directory and a container name part: letters, digits and -."""
    if not name.replace("-", "").isalnum() or not name.isascii():
        raise BadInput(f"lab name {name!r} is not usable", "use letters, digits and -")


def _ensure_key(lab_dir: Path, name: str, root: Path | None = None) -> Path:
    """The lab's SSH key; made with the host's ssh-keygen, or with the node root filesystem's
    where the host has none (a GPU host may carry no SSH tools)."""
    key = lab_dir / "id_ed25519"
    if key.exists():
        return key
    args = ["-q", "-t", "ed25519", "-N", "", "-C", f"gpustack-lab-{name}"]
    if shutil.which("ssh-keygen") or root is None:
        run(["ssh-keygen", *args, "-f", str(key)])
        return key
    inside = root / "tmp" / f"gpustack-lab-key-{os.getpid()}"
    run(["chroot", str(root), "/usr/bin/ssh-keygen", *args, "-f", f"/{inside.relative_to(root)}"])
    shutil.move(inside, key)
    shutil.move(inside.with_suffix(".pub"), key.with_suffix(".pub"))
    return key


def up(
    name: str,
    count: int,
    os_list: str,
    inventory: str | None,
    log=print,
    kubernetes: bool = False,
    boot: str = "podman",
    rootfs_source: str | None = None,
    binds: list[str] | None = None,
) -> Path:
    """Bring the lab to `count` running nodes; reuse healthy ones; write the inventory.

    `kubernetes`: also a real control plane on this machine and a kubelet on every node
    (cluster.py); its admin kubeconfig is written beside the inventory. `boot="chroot"`: one
    chroot node (chroot.py) from `rootfs_source`, with `binds`."""
    if boot not in BOOTS:
        raise BadInput(f"unknown --boot {boot!r}", f"choose from {', '.join(BOOTS)}")
    if boot == "chroot":
        if kubernetes:
            raise BadInput("--kubernetes runs on podman nodes", "leave out --boot chroot")
        return _up_chroot(name, count, os_list, inventory, rootfs_source, binds or [], log)
    if rootfs_source or binds:
        raise BadInput("--rootfs and --bind are for chroot nodes", "add --boot chroot")
    specs = parse_os_list(os_list)
    check_name(name)
    preconditions()
    lab_dir = _lab_dir(name)
    lab_dir.mkdir(parents=True, exist_ok=True)
    state = _load_state(name)
    if state.get("boot") == "chroot":
        raise BadInput(f"lab {name} holds a chroot node", f"run `gpustack lab down --name {name}`")
    key = _ensure_key(lab_dir, name)
    old_nodes = {n["name"]: Node(**n) for n in state.get("nodes", [])}
    inv_path = Path(inventory or state.get("inventory") or lab_dir / "inventory.ini")
    inv_path = inv_path.expanduser().resolve()
    images = {spec.key: ensure_image(spec, log) for spec in {s.key: s for s in specs}.values()}
    nodes: list[Node] = []
    for index in range(count):
        spec = specs[index % len(specs)]
        node_name = f"{name}-node{index + 1}"
        node = old_nodes.get(node_name)
        if node and node.os == spec.key and _reuse_node(node, images[spec.key], kubernetes):
            nodes.append(node)
            continue
        container = f"gpustack-{name}-node{index + 1}"
        nodes.append(_start_new_node(node_name, spec, container, images[spec.key], key, kubernetes))
    for stale in set(old_nodes) - {n.name for n in nodes}:
        run(["podman", "rm", "-f", "-i", old_nodes[stale].container], check=False)
    for node in nodes:
        _wait_for_ssh(node, key)
    kubeconfig = None
    if kubernetes:
        from gpustack.lab import cluster

        kubeconfig = cluster.up(name, lab_dir, nodes, log)
    write_inventory(inv_path, name, nodes, key, kubeconfig=kubeconfig)
    state = {"nodes": [asdict(n) for n in nodes], "inventory": str(inv_path)}
    if kubeconfig:
        state["kubeconfig"] = str(kubeconfig)
    _state_path(name).write_text(json.dumps(state, indent=2))
    return inv_path


def _chroot_preconditions(tools: tuple[str, ...]) -> None:
    if os.geteuid() != 0:
        raise LabError("a chroot node needs root (namespaces, mounts, cgroups)",
                       "run it as root, e.g. with sudo")  # fmt: skip
    for tool in ("unshare", "chroot", "mount", *tools):
        if not shutil.which(tool):
            raise LabError(
                f"{tool} is not installed",
                "apt-get install util-linux coreutils tar xz-utils (and debootstrap to build a "
                "root filesystem)",
            )


def build_rootfs(directory: str, os_name: str, pack: str | None) -> list[str]:
    """`gpustack lab rootfs`: build a chroot node's root filesystem, pack it if asked."""
    rootfs.single_os(os_name)
    _chroot_preconditions(("debootstrap", "tar", "xz") if pack else ("debootstrap",))
    root = rootfs.build(Path(directory), os_name)
    lines = [f"Root filesystem: {root}"]
    if pack:
        size = rootfs.pack(root, Path(pack))
        lines.append(f"Packed into {pack}: {size} bytes ({rootfs.human_size(size)})")
    return lines


def _prepare_root(root: Path, os_name: str, source: str | None, log) -> None:
    if rootfs.is_built(root):
        return
    if source is None:
        _chroot_preconditions(("debootstrap",))
        rootfs.build(root, os_name, log)
        return
    path = Path(source).expanduser().resolve()
    if path.is_dir():
        rootfs.copy_root(path, root)
    else:
        rootfs.unpack(path, root)


def _up_chroot(name: str, count: int, os_list: str, inventory: str | None,
               source: str | None, bind_args: list[str], log) -> Path:  # fmt: skip
    """One chroot node: its root filesystem (built, unpacked or copied once per lab), booted
    unless it runs already, sshd on a free loopback port, the inventory."""
    check_name(name)
    if count != 1:
        raise BadInput(
            "a chroot lab has exactly one node",
            "use --nodes 1: chroot nodes share the host's network namespace, so a second node's "
            "containerd would clash with the first's sockets",
        )
    rootfs.single_os(os_list)
    extra = [chroot.parse_bind(text) for text in bind_args]
    _chroot_preconditions(())
    lab_dir = _lab_dir(name)
    state = _load_state(name)
    if state and state.get("boot") != "chroot":
        raise BadInput(f"lab {name} holds podman nodes", f"`gpustack lab down --name {name}` first")
    lab_dir.mkdir(parents=True, exist_ok=True)
    root = lab_dir / "rootfs"
    _prepare_root(root, os_list, source, log)
    key = _ensure_key(lab_dir, name, root)
    # As podman nodes do: one apt archive cache for every node of this machine.
    cache = chroot.Bind("dir", "rw", str(apt_cache_dir()), "/var/cache/apt/archives")
    binds = [*chroot.device_binds(), cache, *extra]
    gpu = chroot.has_gpu_devices(binds)
    inv_path = Path(inventory or state.get("inventory") or lab_dir / "inventory.ini")
    inv_path = inv_path.expanduser().resolve()
    old = [Node(**n) for n in state.get("nodes", [])]
    node_state = state.get("chroot") or {}
    if old and chroot.running(node_state) and chroot.sshd_answers(old[0].port):
        node = old[0]
    else:
        if node_state.get("cgroup"):
            chroot.stop(node_state)
        node = Node(f"{name}-node1", rootfs.os_of(root), _free_port(), "")
        driver = any(b.dest == chroot.DRIVER_TREE for b in binds)
        chroot.write_boot_files(root, node.name, node.port, key.with_suffix(".pub").read_text(),
                                driver)  # fmt: skip
        node_state = chroot.boot(root, name, node.name, lab_dir, binds)
    node_state["binds"] = [b.line() for b in binds]
    _state_path(name).write_text(json.dumps(
        {"boot": "chroot", "nodes": [asdict(node)], "inventory": str(inv_path),
         "chroot": node_state}, indent=2))  # fmt: skip
    _wait_for_ssh(node, key, hint=f"see {lab_dir / 'console.log'}; "
                  f"`gpustack lab down --name {name}` ends the node")  # fmt: skip
    cpu = "cpu" in node_state.get("controllers", [])
    write_inventory(inv_path, name, [node], key, boot="chroot", gpu=gpu, cpu_controller=cpu)
    return inv_path


def _down_chroot(name: str, state: dict) -> None:
    """Stop the node, check that nothing of it is mounted here, remove the lab's directory."""
    node = state.get("chroot") or {}
    if node.get("cgroup"):
        chroot.stop(node)
    lab_dir = _lab_dir(name)
    left = chroot.mounts_under(lab_dir)
    if left:
        raise LabError(f"still mounted under {lab_dir}: {', '.join(left)}",
                       "unmount them (umount -R), then run `gpustack lab down` again")  # fmt: skip
    inventory = state.get("inventory")
    if inventory:
        Path(inventory).unlink(missing_ok=True)
    # --one-file-system: never follow into anything mounted below (there should be nothing).
    subprocess.run(["rm", "-rf", "--one-file-system", str(lab_dir)], check=False)


def down(name: str, images: bool = False) -> None:
    """Remove the lab's containers (or chroot node), key, state and inventory (images stay
    unless asked)."""
    check_name(name)
    state = _load_state(name)
    if state.get("boot") == "chroot":
        _down_chroot(name, state)
        return
    check_name(name)
    preconditions()
    containers = {n["container"] for n in state.get("nodes", [])}
    listed = run(
        [
            "podman",
            "ps",
            "-a",
            "--filter",
            f"label={LABEL}=gpustack-{name}",
            "--format",
            "{{.Names}}",
        ],
        check=False,
    )
    containers |= set(listed.stdout.decode().split())
    from gpustack.lab import cluster

    cluster.down(_lab_dir(name))
    for container in sorted(containers):
        run(["podman", "rm", "-f", "-i", "-t", "5", container])
        run(["podman", "volume", "rm", "-f", _containerd_volume(container)], check=False)
    inventory = state.get("inventory")
    if inventory:
        Path(inventory).unlink(missing_ok=True)
    shutil.rmtree(_lab_dir(name), ignore_errors=True)
    if images:
        for spec in OS_SPECS.values():
            run(["podman", "rmi", "-f", "-i", image_name(spec)], check=False)


def kubeconfig_path(name: str) -> Path | None:
    """The admin kubeconfig of a lab started with --kubernetes."""
    found = _load_state(name).get("kubeconfig")
    return Path(found) if found else None


def list_labs() -> list[str]:
    rows = []
    home = _home()
    for state_file in sorted(home.glob("*/state.json")) if home.exists() else []:
        try:
            state = json.loads(state_file.read_text(encoding="utf-8"))
            nodes = ", ".join(f"{n['name']} ({n['os']}, :{n['port']})" for n in state["nodes"])
            kind = " [chroot]" if state.get("boot") == "chroot" else ""
            rows.append(f"{state_file.parent.name}{kind}: {nodes} — inventory {state['inventory']}")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            raise BadInput(
                f"lab state file {state_file} is damaged",
                f"remove that lab with `gpustack lab down --name {state_file.parent.name}`",
            ) from None
    return rows or ["no labs"]
