"""A local lab of podman systemd "nodes" reachable by SSH, to run gpustack against for real.

Node images come from images.py (debootstrap, cached); every node bind-mounts one shared apt
archive cache. No GPU is required or faked.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from gpustack.errors import BadInput, LabError
from gpustack.lab.images import OS_SPECS, apt_cache_dir, ensure_image, image_name, parse_os_list
from gpustack.lab.podman import LABEL, oci_runtime, preconditions, run

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


def _wait_for_ssh(node: Node, key: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        proc = run([*_ssh_args(key, node.port), "true"], check=False, timeout=30)
        if proc.returncode == 0:
            return
        last = proc.stderr.decode(errors="replace").strip()
        time.sleep(1)
    raise LabError(
        f"node {node.name} did not answer SSH on 127.0.0.1:{node.port}: {last}",
        f"inspect it: podman exec {node.container} systemctl status ssh",
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


def write_inventory(
    path: Path, lab: str, nodes: list[Node], key: Path, kubeconfig: Path | None = None
) -> None:
    lines = [
        f"# Written by `gpustack lab up --name {lab}`: podman systemd nodes, no GPUs.",
        "[gpu_nodes]",
    ]
    lines += [f"{n.name} ansible_host=127.0.0.1 ansible_port={n.port} lab_os={n.os}" for n in nodes]
    lines += [
        "",
        "[gpu_nodes:vars]",
        "ansible_user=root",
        f"ansible_ssh_private_key_file={key}",
        "ansible_ssh_common_args='-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null"
        " -o LogLevel=ERROR'",
        "ansible_python_interpreter=/usr/bin/python3",
        "# Lab nodes have no GPU and share the host machine's kernel (no headers for it).",
        "gpustack_require_gpu=false",
        "gpustack_lab=true",
        "nvidia_driver_source=distro",
        "",
    ]
    if kubeconfig:
        lines[1:1] = [f"# Kubernetes: gpustack install {path} --kubeconfig {kubeconfig}"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")


def up(
    name: str,
    count: int,
    os_list: str,
    inventory: str | None,
    log=print,
    kubernetes: bool = False,
) -> Path:
    """Bring the lab to `count` running nodes; reuse healthy ones; write the inventory.

    `kubernetes`: also a real control plane on this machine and a kubelet on every node
    (cluster.py); its admin kubeconfig is written beside the inventory."""
    specs = parse_os_list(os_list)
    if not name.replace("-", "").isalnum():
        raise BadInput(f"lab name {name!r} is not usable", "use letters, digits and -")
    preconditions()
    lab_dir = _lab_dir(name)
    lab_dir.mkdir(parents=True, exist_ok=True)
    key = lab_dir / "id_ed25519"
    if not key.exists():
        run(
            [
                "ssh-keygen",
                "-q",
                "-t",
                "ed25519",
                "-N",
                "",
                "-C",
                f"gpustack-lab-{name}",
                "-f",
                str(key),
            ]
        )
    state = _load_state(name)
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
    write_inventory(inv_path, name, nodes, key, kubeconfig)
    state = {"nodes": [asdict(n) for n in nodes], "inventory": str(inv_path)}
    if kubeconfig:
        state["kubeconfig"] = str(kubeconfig)
    _state_path(name).write_text(json.dumps(state, indent=2))
    return inv_path


def down(name: str, images: bool = False) -> None:
    """Remove the lab's containers, key, state and inventory (images stay unless asked)."""
    preconditions()
    state = _load_state(name)
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
        state = json.loads(state_file.read_text())
        nodes = ", ".join(f"{n['name']} ({n['os']}, :{n['port']})" for n in state["nodes"])
        rows.append(f"{state_file.parent.name}: {nodes} — inventory {state['inventory']}")
    return rows or ["no labs"]
