"""Lab node images: built once per OS with debootstrap, cached as podman images, one shared
apt archive cache for every node."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from gpustack.errors import BadInput, LabError
from gpustack.lab.podman import LABEL, run

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


def cache_dir() -> Path:
    base = os.environ.get("GPUSTACK_LAB_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "gpustack"
    )
    return Path(base)


def apt_cache_dir() -> Path:
    path = cache_dir() / "apt-archives"
    (path / "partial").mkdir(parents=True, exist_ok=True)
    return path


def mirror_url() -> str:
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


def recipe_hash(spec: OsSpec) -> str:
    """Changes whenever the image recipe changes, so a stale cached image is rebuilt."""
    text = json.dumps(
        [asdict(spec), PACKAGES, mirror_url(), _security_mirror(), configure_script(spec)]
    )
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def image_name(spec: OsSpec) -> str:
    return f"localhost/gpustack-node:{spec.key}-{recipe_hash(spec)}"


def apt_sources(spec: OsSpec) -> str:
    suites = [spec.suite] + ([f"{spec.suite}-updates"] if spec.updates else [])
    text = (
        f"Types: deb\nURIs: {mirror_url()}\nSuites: {' '.join(suites)}\nComponents: main\n"
        "Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
    )
    if spec.security_suite:
        text += (
            f"\nTypes: deb\nURIs: {_security_mirror()}\nSuites: {spec.security_suite}\n"
            "Components: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n"
        )
    return text


def configure_script(spec: OsSpec) -> str:
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
{apt_sources(spec)}EOS
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
# another node: make apt-get wait for its turn (lab only). `apt-get update` takes no archive
# lock (it writes the node's own /var/lib/apt/lists; seen on a lab node: it succeeds while another
# node holds /var/cache/apt/archives/lock) and runs without a turn, as on separate machines.
dpkg-divert --local --rename --add /usr/bin/apt-get
cat > /usr/bin/apt-get <<'EOS'
#!/bin/sh
skip=
for arg in "$@"; do
    if [ -n "$skip" ]; then skip=; continue; fi
    case "$arg" in
        -o|-c|-t|-a|--option|--config-file) skip=1 ;;
        --target-release|--default-release|--host-architecture) skip=1 ;;
        -*) ;;
        update) exec /usr/bin/apt-get.distrib "$@" ;;
        *) break ;;
    esac
done
exec flock /var/cache/apt/archives/.gpustack-lab.lock /usr/bin/apt-get.distrib "$@"
EOS
chmod 755 /usr/bin/apt-get
# Throw-away nodes: dpkg skips its fsync calls, as Docker's Debian images do (lab only).
echo force-unsafe-io > /etc/dpkg/dpkg.cfg.d/90gpustack-lab-unsafe-io
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
def cache_lock(name: str):
    path = cache_dir() / f"{name}.lock"
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
    with cache_lock(f"image-{spec.key}"):
        if run(["podman", "image", "exists", image], check=False).returncode == 0:
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
                mirror_url(),
            ]
            if spec.script:
                cmd.append(f"/usr/share/debootstrap/scripts/{spec.script}")
            run(cmd, timeout=1800)
            run(["chroot", str(root), "/bin/sh", "-c", configure_script(spec)])
            label = f"LABEL {LABEL}.recipe={recipe_hash(spec)}"
            import_rootfs(root, image, ["CMD=/sbin/init", label])
        _remove_stale_images(spec, image)
    return image


def _remove_stale_images(spec: OsSpec, keep: str) -> None:
    """Images of an older recipe for the same OS are dead weight: drop them (if unused)."""
    listed = run(["podman", "images", "--format", "{{.Repository}}:{{.Tag}}",
                   "localhost/gpustack-node"], check=False)  # fmt: skip
    for ref in listed.stdout.decode().split():
        if ref.startswith(f"localhost/gpustack-node:{spec.key}-") and ref != keep:
            run(["podman", "rmi", ref], check=False)


def import_rootfs(root: Path, image: str, changes: list[str]) -> None:
    """`tar -C root -c . | podman import --change ... - image`."""
    tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
    try:
        proc = subprocess.run(
            ["podman", "import", *(a for c in changes for a in ("--change", c)), "-", image],
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
