"""A local lab of podman systemd "nodes" reachable by SSH, to run gpustack against for real.

Node images are built once with debootstrap and cached as podman images; every node
bind-mounts one shared apt archive cache. No GPU is required or faked.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from gpustack.errors import BadInput, LabError

DEBIAN_MIRROR = "http://deb.debian.org/debian"
SECURITY_MIRROR = "http://deb.debian.org/debian-security"
PACKAGES = [
    "python3",
    "python3-apt",
    "systemd",
    "systemd-sysv",
    "dbus",
    "ca-certificates",
    "gnupg",
    "kmod",
    "pciutils",
    "openssh-server",
    "sudo",
    "procps",
]
ULIMITS = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]
CGROUP_ROOT = "/sys/fs/cgroup"
LABEL = "io.gpustack.lab"
INIT_CGROUP2 = "/usr/local/sbin/gpustack-lab-init"


@dataclass(frozen=True)
class OsSpec:
    key: str
    suite: str
    security_suite: str | None
    updates: bool
    script: str | None = None  # debootstrap script when the suite name is unknown to it
    check_valid_until: bool = True
    # systemd >= 258 refuses the cgroup v1 hierarchy podman gives on a cgroup v1 host.
    cgroup2: bool = False

    @property
    def init(self) -> str:
        return INIT_CGROUP2 if self.cgroup2 else "/sbin/init"


OS_SPECS = {
    "debian12": OsSpec("debian12", "bookworm", "bookworm-security", True),
    "debian13": OsSpec("debian13", "trixie", "trixie-security", True),
    # Debian testing: bookworm's debootstrap has no `forky` script; sid's works. Its Release
    # files may be past Valid-Until on snapshot-like mirrors, so apt is told not to check.
    "forky": OsSpec(
        "forky", "forky", None, False, script="sid", check_valid_until=False, cgroup2=True
    ),
}


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


def _cache() -> Path:
    base = os.environ.get("GPUSTACK_LAB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gpustack"
    )
    return Path(base)


def apt_cache_dir() -> Path:
    path = _cache() / "apt-archives"
    (path / "partial").mkdir(parents=True, exist_ok=True)
    return path


def _mirror() -> str:
    return os.environ.get("GPUSTACK_LAB_MIRROR", DEBIAN_MIRROR).rstrip("/")


def _security_mirror() -> str:
    return os.environ.get("GPUSTACK_LAB_SECURITY_MIRROR", SECURITY_MIRROR).rstrip("/")


def parse_os_list(text: str) -> list[OsSpec]:
    names = [part.strip() for part in text.split(",") if part.strip()]
    unknown = [n for n in names if n not in OS_SPECS]
    if not names or unknown:
        raise BadInput(
            f"unknown --os {', '.join(unknown) or text!r}",
            f"choose from {', '.join(OS_SPECS)} (comma-separated to mix)",
        )
    return [OS_SPECS[n] for n in names]


def _run(
    args: list[str], check: bool = True, input_: bytes | None = None, timeout: float | None = None
) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(args, capture_output=True, input=input_, timeout=timeout)
    except FileNotFoundError:
        raise LabError(
            f"{args[0]} is not installed", "apt-get install podman debootstrap openssh-client"
        ) from None
    except subprocess.TimeoutExpired:
        raise LabError(
            f"`{' '.join(args[:3])}` timed out", "retry; check the machine's load"
        ) from None
    if check and proc.returncode != 0:
        err = (proc.stderr or proc.stdout).decode(errors="replace").strip().splitlines()
        raise LabError(
            f"`{' '.join(args[:4])} …` failed: {err[-1] if err else proc.returncode}",
            "see the command's output above; `podman ps -a` shows the nodes",
        )
    return proc


def _preconditions() -> None:
    if os.geteuid() != 0:
        raise LabError(
            "the lab needs root (privileged podman containers, debootstrap)",
            "run it as root, e.g. with sudo",
        )
    for tool in ("podman", "debootstrap", "ssh", "ssh-keygen"):
        if not shutil.which(tool):
            raise LabError(
                f"{tool} is not installed", "apt-get install podman debootstrap openssh-client"
            )


def recipe_hash(spec: OsSpec) -> str:
    """Changes whenever the image recipe changes, so a stale cached image is rebuilt."""
    text = json.dumps(
        [asdict(spec), PACKAGES, _mirror(), _security_mirror(), _configure_script(spec)]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def image_name(spec: OsSpec) -> str:
    return f"localhost/gpustack-node:{spec.key}-{recipe_hash(spec)}"


def _sources(spec: OsSpec) -> str:
    suites = [spec.suite] + ([f"{spec.suite}-updates"] if spec.updates else [])
    text = (
        f"Types: deb\nURIs: {_mirror()}\nSuites: {' '.join(suites)}\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
    if spec.security_suite:
        text += (
            f"\nTypes: deb\nURIs: {_security_mirror()}\nSuites: {spec.security_suite}\n"
            "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
        )
    return text


def _configure_script(spec: OsSpec) -> str:
    """Shell run inside the debootstrapped root: SSH host keys at boot, apt settings."""
    apt_conf = (
        'APT::Keep-Downloaded-Packages "true";\n'
        'Binary::apt::APT::Keep-Downloaded-Packages "true";\n'
    )
    if not spec.check_valid_until:
        apt_conf += 'Acquire::Check-Valid-Until "false";\n'
    return f"""set -e
rm -f /etc/apt/sources.list /etc/ssh/ssh_host_*
cat > /etc/apt/sources.list.d/debian.sources <<'EOS'
{_sources(spec)}EOS
cat > /etc/apt/apt.conf.d/90gpustack-lab <<'EOS'
{apt_conf}EOS
cat > {INIT_CGROUP2} <<'EOS'
#!/bin/sh
# Lab nodes only: give systemd a cgroup2 hierarchy when the host offers cgroup v1.
if [ "$(stat -f -c %T /sys/fs/cgroup)" != cgroup2fs ]; then
    umount -R /sys/fs/cgroup && mount -t cgroup2 cgroup2 /sys/fs/cgroup
fi
exec /sbin/init "$@"
EOS
chmod 755 {INIT_CGROUP2}
# Nodes share one apt archive cache, and apt-get gives up at once on an archive lock held by
# another node: make apt-get wait for its turn (lab only).
dpkg-divert --local --rename --add /usr/bin/apt-get
cat > /usr/bin/apt-get <<'EOS'
#!/bin/sh
exec flock /var/cache/apt/archives/.gpustack-lab.lock /usr/bin/apt-get.distrib "$@"
EOS
chmod 755 /usr/bin/apt-get
mkdir -p /etc/systemd/system/ssh.service.d /root/.ssh
chmod 700 /root/.ssh
cat > /etc/systemd/system/ssh.service.d/10-hostkeys.conf <<'EOS'
[Service]
ExecStartPre=
ExecStartPre=/usr/bin/ssh-keygen -A
ExecStartPre=/usr/sbin/sshd -t
EOS
: > /etc/machine-id
rm -f /etc/hostname
apt-get clean
rm -rf /var/lib/apt/lists/*
"""


@contextlib.contextmanager
def _lock(name: str):
    path = _cache() / f"{name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def ensure_image(spec: OsSpec, log=print) -> str:
    """Build the node image for `spec` once; later calls find it in podman's store."""
    image = image_name(spec)
    with _lock(f"image-{spec.key}"):
        if _run(["podman", "image", "exists", image], check=False).returncode == 0:
            return image
        log(f"Building node image {image} with debootstrap (about a minute)…")
        with tempfile.TemporaryDirectory(
            prefix=f"gpustack-{spec.key}-", dir=os.environ.get("GPUSTACK_LAB_BUILD_DIR")
        ) as tmp:
            root = Path(tmp) / "rootfs"
            cmd = [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                f"--cache-dir={apt_cache_dir()}",
                spec.suite,
                str(root),
                _mirror(),
            ]
            if spec.script:
                cmd.append(f"/usr/share/debootstrap/scripts/{spec.script}")
            _run(cmd, timeout=1800)
            _run(["chroot", str(root), "/bin/sh", "-c", _configure_script(spec)])
            tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
            try:
                proc = subprocess.run(
                    [
                        "podman",
                        "import",
                        "--change",
                        "CMD=/sbin/init",
                        "--change",
                        f"LABEL {LABEL}.recipe={recipe_hash(spec)}",
                        "-",
                        image,
                    ],
                    stdin=tar.stdout,
                    capture_output=True,
                )
            finally:
                tar.stdout.close()
                tar.wait()
            if proc.returncode != 0:
                raise LabError(
                    f"podman import failed: {proc.stderr.decode().strip()}",
                    "check podman's storage (`podman info`)",
                )
        _remove_stale_images(spec, image)
    return image


def _remove_stale_images(spec: OsSpec, keep: str) -> None:
    """Images of an older recipe for the same OS are dead weight: drop them (if unused)."""
    listed = _run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}",
                   "localhost/gpustack-node"], check=False)  # fmt: skip
    for ref in listed.stdout.decode().split():
        if ref.startswith(f"localhost/gpustack-node:{spec.key}-") and ref != keep:
            _run(["podman", "rmi", ref], check=False)


def cgroup_layout(root: str = CGROUP_ROOT) -> str:
    """'v2' (unified), 'hybrid' (v1 with controllers also on cgroup2) or 'v1'."""
    base = Path(root)
    if (base / "cgroup.controllers").exists():
        return "v2"
    try:
        unified = (base / "unified" / "cgroup.controllers").read_text().split()
    except OSError:
        return "v1"
    return "hybrid" if unified else "v1"


def oci_runtime(root: str = CGROUP_ROOT) -> str | None:
    """The OCI runtime lab nodes need here, or None for podman's default.

    crun (podman's default on Debian 12) refuses every container on a hybrid hierarchy
    ("cgroups in hybrid mode not supported, drop all controllers from cgroupv2"); runc starts
    systemd nodes there. GPUSTACK_LAB_OCI_RUNTIME overrides the choice.
    """
    chosen = os.environ.get("GPUSTACK_LAB_OCI_RUNTIME") or (
        "runc" if cgroup_layout(root) == "hybrid" else None
    )
    if chosen and not shutil.which(chosen):
        raise LabError(
            f"this machine's cgroup layout needs the {chosen} OCI runtime, which is not installed",
            f"apt-get install {chosen} (./scripts/setup.sh installs it)",
        )
    return chosen


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
    proc = _run(["podman", "container", "inspect", container], check=False)
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
        proc = _run([*_ssh_args(key, node.port), "true"], check=False, timeout=30)
        if proc.returncode == 0:
            return
        last = proc.stderr.decode(errors="replace").strip()
        time.sleep(1)
    raise LabError(
        f"node {node.name} did not answer SSH on 127.0.0.1:{node.port}: {last}",
        f"inspect it: podman exec {node.container} systemctl status ssh",
    )


def _start_node(node: Node, image: str, key: Path, init: str) -> None:
    _run(["podman", "rm", "-f", "-i", node.container])
    runtime = oci_runtime()
    # fmt: off
    _run(["podman", *(["--runtime", runtime] if runtime else []),
          "run", "-d", "--name", node.container, "--hostname", node.name,
          "--label", f"{LABEL}={node.container.split('-node')[0]}",
          "--systemd=always", "--privileged", *ULIMITS,
          "-p", f"127.0.0.1:{node.port}:22",
          "-v", f"{key}.pub:/root/.ssh/authorized_keys:ro",
          "-v", f"{apt_cache_dir()}:/var/cache/apt/archives",
          image, init])
    # fmt: on


def _reuse_node(node: Node, image: str) -> bool:
    """Keep a node of an earlier `up`: running as is, or stopped and started again."""
    info = _container_info(node.container)
    if not info or image not in (info.get("ImageName"), (info.get("Config") or {}).get("Image")):
        return False
    if (info.get("State") or {}).get("Status") == "running":
        return True
    # Nodes of an earlier run may be exited or in an unknown state: try a restart first.
    return _run(["podman", "start", node.container], check=False).returncode == 0


def write_inventory(path: Path, lab: str, nodes: list[Node], key: Path) -> None:
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
        "# Lab nodes have no GPU and share the build machine's kernel (no headers for it).",
        "gpustack_require_gpu=false",
        "gpustack_lab=true",
        "nvidia_driver_source=distro",
        "",
    ]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")


def up(name: str, count: int, os_list: str, inventory: str | None, log=print) -> Path:
    """Bring the lab to `count` running nodes; reuse healthy ones; write the inventory."""
    specs = parse_os_list(os_list)
    if not name.replace("-", "").isalnum():
        raise BadInput(f"lab name {name!r} is not usable", "use letters, digits and -")
    _preconditions()
    lab_dir = _lab_dir(name)
    lab_dir.mkdir(parents=True, exist_ok=True)
    key = lab_dir / "id_ed25519"
    if not key.exists():
        _run(
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
        if node and node.os == spec.key and _reuse_node(node, images[spec.key]):
            nodes.append(node)
            continue
        node = Node(node_name, spec.key, _free_port(), f"gpustack-{name}-node{index + 1}")
        _start_node(node, images[spec.key], key, spec.init)
        nodes.append(node)
    for stale in set(old_nodes) - {n.name for n in nodes}:
        _run(["podman", "rm", "-f", "-i", old_nodes[stale].container], check=False)
    for node in nodes:
        _wait_for_ssh(node, key)
    write_inventory(inv_path, name, nodes, key)
    _state_path(name).write_text(
        json.dumps({"nodes": [asdict(n) for n in nodes], "inventory": str(inv_path)}, indent=2)
    )
    return inv_path


def down(name: str, images: bool = False) -> None:
    """Remove the lab's containers, key, state and inventory (images stay unless asked)."""
    _preconditions()
    state = _load_state(name)
    containers = {n["container"] for n in state.get("nodes", [])}
    listed = _run(
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
    for container in sorted(containers):
        _run(["podman", "rm", "-f", "-i", "-t", "5", container])
    inventory = state.get("inventory")
    if inventory:
        Path(inventory).unlink(missing_ok=True)
    shutil.rmtree(_lab_dir(name), ignore_errors=True)
    if images:
        for spec in OS_SPECS.values():
            _run(["podman", "rmi", "-f", "-i", image_name(spec)], check=False)


def list_labs() -> list[str]:
    rows = []
    home = _home()
    for state_file in sorted(home.glob("*/state.json")) if home.exists() else []:
        state = json.loads(state_file.read_text())
        nodes = ", ".join(f"{n['name']} ({n['os']}, :{n['port']})" for n in state["nodes"])
        rows.append(f"{state_file.parent.name}: {nodes} — inventory {state['inventory']}")
    return rows or ["no labs"]
