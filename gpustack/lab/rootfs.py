"""Root filesystems for chroot lab nodes: the lab image's recipe plus containerd and runc,
trimmed, with the units that would act on the host masked; built once per recipe with
debootstrap, copied for each node, packed with tar + xz to carry to a host without network.

A chroot node shares the host's kernel and network namespace (chroot.py): what the node's
systemd may do is what a container manager's init may do, never the host's sysctls, binfmt
handlers, kernel filesystems, consoles or module loading.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import asdict
from pathlib import Path

from gpustack.errors import BadInput, LabError
from gpustack.lab.images import (
    PACKAGES,
    OsSpec,
    apt_cache_dir,
    cache_dir,
    cache_lock,
    configure_script,
    mirror_url,
    parse_os_list,
)
from gpustack.lab.podman import run

# The user's container runtime comes with the node: a host without network cannot fetch it.
CHROOT_PACKAGES = [*PACKAGES, "containerd", "runc"]
BUILT_MARKER = "etc/gpustack-lab-rootfs"
# Units a chroot node must not run: they write host-global state through the shared kernel
# (sysctls, binfmt_misc, module loading, kernel filesystems) or the host's consoles.
MASKED_UNITS = [
    "systemd-sysctl.service",
    "systemd-binfmt.service",
    "proc-sys-fs-binfmt_misc.automount",
    "proc-sys-fs-binfmt_misc.mount",
    "systemd-modules-load.service",
    "sys-kernel-debug.mount",
    "sys-kernel-tracing.mount",
    "sys-kernel-config.mount",
    "sys-fs-fuse-connections.mount",
    "getty.target",
    "console-getty.service",
]
# Documentation, manual pages and translations: not needed on a throw-away node, and most of the
# packed size (as in Debian's slim container images, later installs skip them too).
DPKG_EXCLUDES = """path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
"""


def _chroot_script(spec: OsSpec) -> str:
    return f"""set -e
cat > /etc/dpkg/dpkg.cfg.d/90gpustack-lab-excludes <<'EOS'
{DPKG_EXCLUDES}EOS
find /usr/share/doc -mindepth 1 ! -name copyright ! -type d -delete
find /usr/share/doc -mindepth 1 -type d -empty -delete
rm -rf /usr/share/man/* /usr/share/info/*
find /usr/share/locale -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {{}} +
systemctl mask {" ".join(MASKED_UNITS)}
echo 'os={spec.key} recipe={recipe_hash(spec)}' > /{BUILT_MARKER}
"""


def recipe_hash(spec: OsSpec) -> str:
    parts = [asdict(spec), CHROOT_PACKAGES, mirror_url(), configure_script(spec)]
    text = json.dumps([*parts, DPKG_EXCLUDES, MASKED_UNITS])
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def single_os(os_name: str) -> OsSpec:
    specs = parse_os_list(os_name)
    if len(specs) != 1:
        raise BadInput(
            f"a chroot node has one OS, not {os_name!r}", "give one --os (debian12, debian13)"
        )
    return specs[0]


def _cached_root(spec: OsSpec, log=print) -> Path:
    """The built root filesystem for `spec`, in the lab cache (built on first use)."""
    base = cache_dir() / "rootfs"
    root = base / f"{spec.key}-{recipe_hash(spec)}"
    with cache_lock(f"rootfs-{spec.key}"):
        if (root / BUILT_MARKER).exists():
            return root
        log(f"Building the chroot node's root filesystem {root.name} with debootstrap…")
        base.mkdir(parents=True, exist_ok=True)
        for stale in base.glob(f"{spec.key}-*"):
            subprocess.run(["rm", "-rf", "--one-file-system", str(stale)], check=False)
        work = Path(tempfile.mkdtemp(prefix=f".{spec.key}-", dir=base))
        try:
            cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(CHROOT_PACKAGES)}",
                   f"--cache-dir={apt_cache_dir()}", spec.suite, str(work / "r"),
                   mirror_url()]  # fmt: skip
            if spec.script:
                cmd.append(f"/usr/share/debootstrap/scripts/{spec.script}")
            run(cmd, timeout=1800)
            run(["chroot", str(work / "r"), "/bin/sh", "-c", configure_script(spec)])
            run(["chroot", str(work / "r"), "/bin/sh", "-c", _chroot_script(spec)])
            (work / "r").rename(root)
        finally:
            subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=False)
    return root


def is_built(root: Path) -> bool:
    return (root / BUILT_MARKER).exists()


def os_of(root: Path) -> str:
    """The lab OS key a built root filesystem was made for (its marker file)."""
    fields = dict(
        part.split("=", 1) for part in (root / BUILT_MARKER).read_text().split() if "=" in part
    )
    return fields.get("os", "unknown")


def build(dest: Path, os_name: str = "debian12", log=print) -> Path:
    """A node root filesystem at `dest` (a copy of the cached build); kept when already there."""
    dest = dest.expanduser().resolve()
    if is_built(dest):
        return dest
    if dest.exists() and any(dest.iterdir()):
        raise BadInput(
            f"{dest} is not empty and holds no chroot node root filesystem",
            "give a new or empty directory",
        )
    source = _cached_root(single_os(os_name), log)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.partial")
    subprocess.run(["rm", "-rf", "--one-file-system", str(tmp)], check=False)
    run(["cp", "-a", "--reflink=auto", str(source), str(tmp)], timeout=1800)
    if dest.exists():
        dest.rmdir()
    tmp.rename(dest)
    return dest


def pack(root: Path, output: Path) -> int:
    """tar + xz of `root` into `output` (written whole or not at all); returns its size."""
    if not is_built(root):
        raise BadInput(f"{root} holds no chroot node root filesystem", "build it first")
    output = output.expanduser().resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(f".{output.name}.partial")
    with partial.open("wb") as fh:
        tar = subprocess.Popen(
            # Python's bytecode is left out (about 3 MB packed): written again on first import.
            [
                "tar",
                "-C",
                str(root),
                "--numeric-owner",
                "--xattrs",
                "--exclude=__pycache__",
                "-c",
                ".",
            ],
            stdout=subprocess.PIPE,
        )
        xz = subprocess.run(["xz", "-T0", "-6"], stdin=tar.stdout, stdout=fh, check=False)
        tar.stdout.close()
        if tar.wait() != 0 or xz.returncode != 0:
            partial.unlink(missing_ok=True)
            raise LabError(f"packing {root} failed", "check free space where the output goes")
    partial.rename(output)
    return output.stat().st_size


def unpack(tarball: Path, dest: Path) -> Path:
    """The packed root filesystem `tarball` unpacked at `dest` (which must not exist)."""
    if not tarball.is_file():
        raise BadInput(
            f"no root filesystem at {tarball}", "give the file `gpustack lab rootfs --pack` wrote"
        )
    tmp = dest.with_name(f".{dest.name}.partial")
    subprocess.run(["rm", "-rf", "--one-file-system", str(tmp)], check=False)
    tmp.mkdir(parents=True)
    if shutil.which("tar") and shutil.which("xz"):
        run(["tar", "-C", str(tmp), "--numeric-owner", "--xattrs", "-xJf", str(tarball)],
            timeout=1800)  # fmt: skip
    else:  # a GPU host may lack xz-utils: Python's own tar and lzma modules
        with tarfile.open(tarball, "r:xz") as archive:
            try:  # our own archive: device nodes, owners and links as they were packed
                archive.extractall(tmp, numeric_owner=True, filter="fully_trusted")
            except TypeError:  # Python before 3.11.4 has no filters and trusts the archive
                archive.extractall(tmp, numeric_owner=True)
    if not is_built(tmp):
        subprocess.run(["rm", "-rf", "--one-file-system", str(tmp)], check=False)
        raise BadInput(f"{tarball} holds no chroot node root filesystem",
                       "give the file `gpustack lab rootfs --pack` wrote")  # fmt: skip
    tmp.rename(dest)
    return dest


def copy_root(source: Path, dest: Path) -> Path:
    """A node's own copy of a built root filesystem directory."""
    if not is_built(source):
        raise BadInput(f"{source} holds no chroot node root filesystem",
                       "build one with `gpustack lab rootfs DIR`")  # fmt: skip
    tmp = dest.with_name(f".{dest.name}.partial")
    subprocess.run(["rm", "-rf", "--one-file-system", str(tmp)], check=False)
    run(["cp", "-a", "--reflink=auto", str(source), str(tmp)], timeout=1800)
    tmp.rename(dest)
    return dest


def human_size(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"
