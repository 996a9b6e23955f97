"""Images of NVIDIA's operands for the lab's real cluster, built here: no registry, no Docker.

Each image is a root filesystem laid out from binaries built from source (components.py for
NVIDIA's Go modules; gcc for Kubernetes' pause.c) plus the shared libraries they load (read
with ldd), written as a `docker save` archive by Python's tarfile: one layer, fixed owners and
times, so the same inputs give the same digest. `ctr -n k8s.io images import` takes it (a
lab node's containerd; `load_into_node`). Archives are cached next to the binaries they hold
(`<component dir>/images/`), with an `image.json` (names, digests, size, build time).

Names are what gpustack renders under the lab's registry override (`lab_cluster_vars()`):
`lab.gpustack.local/nvidia/k8s-device-plugin:v0.19.3` for the device plugin, GFD and the MPS
control daemon (one image upstream), `lab.gpustack.local/gpustack/lab-verify:<tag>` for
`gpustack verify`'s pod, `registry.k8s.io/pause:<tag>` for the sandbox.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpustack.errors import LabError
from gpustack.k8s.manifests_config import ClusterConfig
from gpustack.lab import components

LAB_REGISTRY = "lab.gpustack.local"
# The verification pod's image: busybox-static and glibc (nvidia-smi, injected by the nvidia
# runtime with the driver's libraries, links glibc). Not NVIDIA's CUDA image: its own name.
VERIFY_REPOSITORY = "gpustack/lab-verify"
# A STAND-IN for NVIDIA's DRA driver image (components.DRA_STAND_IN): its own name, so nothing
# mistakes it for NVIDIA's.
DRA_STAND_IN_REPOSITORY = "gpustack/lab-dra-stand-in"
PAUSE_REPOSITORY = "registry.k8s.io/pause"
# Bumped when the layout of an image changes, so cached archives are rebuilt.
LAYOUT = 1
ARCHIVE_DIR_IN_NODE = "/var/lib/gpustack-lab/images"
# The search path of upstream's images (distroless) plus the busybox directory they carry.
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin:/busybox"
# glibc's libraries a dynamically linked NVIDIA tool needs (nvidia-smi: libpthread, libm, libdl,
# libc, librt and the loader); the runtime mounts the driver's own libraries, not these.
GLIBC = ("libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1")


@dataclass(frozen=True)
class OperandImage:
    """A built image archive and the names it carries."""

    name: str
    archive: Path
    refs: tuple[str, ...]
    info: dict


def lab_cluster_vars() -> dict[str, str]:
    """The `-e` variables that make gpustack render the lab's image names (and the device
    plugin at the version built here: v0.20.0, gpustack's default, is not served by the Go
    module proxy)."""
    return {
        "gpustack_k8s_registry": LAB_REGISTRY,
        "gpustack_k8s_device_plugin_tag": f"v{components.DEVICE_PLUGIN_VERSION}",
        "gpustack_k8s_verify_image": VERIFY_REPOSITORY,
        "gpustack_k8s_verify_tag": verify_tag(),
        "gpustack_k8s_dra_driver_image": DRA_STAND_IN_REPOSITORY,
        "gpustack_k8s_dra_driver_tag": f"k8s-test-driver-v{components.KUBERNETES_VERSION}",
    }


def lab_config() -> ClusterConfig:
    prefix = "gpustack_k8s_"
    return ClusterConfig(**{k.removeprefix(prefix): v for k, v in lab_cluster_vars().items()})


def verify_tag() -> str:
    return f"busybox-glibc-{LAYOUT}"


def pause_tag() -> str:
    """The pause image's tag in the pinned Kubernetes release (kubeadm's PauseVersion)."""
    text = (_kubernetes_source() / "build/pause/Makefile").read_text()
    match = re.search(r"^TAG \?= (\S+)$", text, re.M)
    if not match:
        raise LabError(
            "build/pause/Makefile names no TAG", "the layout of k8s.io/kubernetes changed"
        )
    return match.group(1)


# -- archives ----------------------------------------------------------------------------


def _tarinfo(name: str, kind: bytes, mode: int, size: int = 0, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.size, info.linkname = kind, mode, size, link
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    info.mtime = 0
    return info


def layer_tar(root: Path) -> bytes:
    """The directory as one image layer: sorted, owned by root, every time 0."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(root.rglob("*")):
            name = path.relative_to(root).as_posix()
            mode = path.lstat().st_mode & 0o7777
            if path.is_symlink():
                tar.addfile(_tarinfo(name, tarfile.SYMTYPE, 0o777, link=os.readlink(path)))
            elif path.is_dir():
                tar.addfile(_tarinfo(name, tarfile.DIRTYPE, mode))
            else:
                data = path.read_bytes()
                tar.addfile(_tarinfo(name, tarfile.REGTYPE, mode, len(data)), io.BytesIO(data))
    return buffer.getvalue()


def write_docker_archive(root: Path, config: dict, refs: Iterable[str], dest: Path) -> dict:
    """`docker save` layout (manifest.json, <config>.json, <layer>/layer.tar) of one layer."""
    layer = layer_tar(root)
    diff_id = hashlib.sha256(layer).hexdigest()
    image_config = {
        "architecture": "amd64",
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{diff_id}"]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "gpustack operand_images"}],
    }
    config_bytes = json.dumps(image_config, sort_keys=True, separators=(",", ":")).encode()
    config_id = hashlib.sha256(config_bytes).hexdigest()
    manifest = [
        {
            "Config": f"{config_id}.json",
            "RepoTags": list(refs),
            "Layers": [f"{diff_id}/layer.tar"],
        }
    ]
    files = {
        f"{diff_id}/layer.tar": layer,
        f"{config_id}.json": config_bytes,
        "manifest.json": json.dumps(manifest, separators=(",", ":")).encode(),
    }
    part = dest.with_name(dest.name + ".part")
    part.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(part, "w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(_tarinfo(diff_id, tarfile.DIRTYPE, 0o755))
        for name, data in files.items():
            tar.addfile(_tarinfo(name, tarfile.REGTYPE, 0o644, len(data)), io.BytesIO(data))
    part.rename(dest)  # complete or absent: the cache trusts what is there
    return {
        "image_id": f"sha256:{config_id}",
        "layer": f"sha256:{diff_id}",
        "layer_bytes": len(layer),
        "layer_gzip_bytes": len(gzip.compress(layer, 6, mtime=0)),
        "archive_bytes": dest.stat().st_size,
    }


# -- root filesystems --------------------------------------------------------------------


def shared_libraries(binary: Path) -> list[Path]:
    """The files the dynamic loader maps for `binary` (ldd), the loader included; [] when the
    binary is static."""
    proc = subprocess.run(["ldd", str(binary)], capture_output=True, text=True)
    text = proc.stdout + proc.stderr
    if "not a dynamic executable" in text or "statically linked" in text:
        return []
    if proc.returncode != 0:
        raise LabError(f"ldd {binary} failed: {text.strip()}", "install libc-bin (ldd)")
    found = []
    for line in proc.stdout.splitlines():
        if "not found" in line:
            raise LabError(
                f"{binary.name} needs {line.split()[0]}, which this machine does not have",
                "install the library on the build machine",
            )
        match = re.search(r"(/\S+) \(0x", line)
        if match:
            found.append(Path(match.group(1)))
    return found


def _install(root: Path, src: Path, dest: str, mode: int = 0o755) -> None:
    target = root / dest.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src.resolve(), target)  # the file a symlinked library name points to
    target.chmod(mode)


def _install_with_libraries(root: Path, binary: Path, dest: str) -> None:
    _install(root, binary, dest)
    for library in shared_libraries(binary):
        if not (root / str(library).lstrip("/")).exists():
            _install(root, library, str(library))


def _busybox(root: Path, directory: str, applets: Iterable[str]) -> None:
    _install(root, _busybox_binary(), f"{directory}/busybox")
    for applet in applets:
        (root / directory.lstrip("/") / applet).symlink_to("busybox")


def _busybox_binary() -> Path:
    """Debian's busybox-static (a static binary), downloaded once into the cache; its package
    version in `version` beside it."""
    target = components.cache_root() / "busybox-static" / "busybox"
    if target.is_file() and (target.parent / "version").is_file():
        return target
    with tempfile.TemporaryDirectory(prefix="gpustack-busybox-") as tmp:
        work = Path(tmp)
        _run(["apt-get", "download", "busybox-static"], work, "downloading busybox-static")
        deb = next(work.glob("busybox-static_*.deb"))
        version = _run(["dpkg-deb", "-f", str(deb), "Version"], work, "reading busybox-static")
        _run(["dpkg-deb", "-x", str(deb), str(work / "x")], work, "unpacking busybox-static")
        target.parent.mkdir(parents=True, exist_ok=True)
        (target.parent / "version").write_text(version.strip() + "\n")
        shutil.copy2(work / "x/bin/busybox", target.with_suffix(".part"))
        target.with_suffix(".part").rename(target)
    return target


def _inputs() -> dict[str, str]:
    """What the images take from this machine besides the built binaries: busybox-static and
    the glibc (Debian's libc6) the binaries link; a change rebuilds the archives."""
    libc = _run(["dpkg-query", "-W", "-f", "${Version}", "libc6"], Path("/"), "reading libc6")
    version = (_busybox_binary().parent / "version").read_text().strip()
    return {"busybox-static": version, "libc6": libc.strip()}


def _run(args: list[str], cwd: Path, what: str) -> str:
    proc = subprocess.run(args, cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LabError(
            f"{what} failed (`{' '.join(args[:3])}` exited {proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()[-500:]}",
            "the build machine needs apt (Debian's archive reachable), gcc and binutils",
        )
    return proc.stdout


def _base_dirs(root: Path) -> None:
    for directory in ("etc", "tmp", "usr/bin", "var/run"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    (root / "tmp").chmod(0o1777)
    (root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/sh\n")
    (root / "etc/group").write_text("root:x:0:\n")


# -- the images --------------------------------------------------------------------------


def _cached(directory: Path, refs: tuple[str, ...], inputs: dict) -> OperandImage | None:
    try:
        info = json.loads((directory / "image.json").read_text())
    except (OSError, ValueError):
        return None
    archive = directory / info.get("archive", "")
    if (
        info.get("layout") != LAYOUT
        or tuple(info.get("refs", ())) != refs
        or info.get("inputs") != inputs
        or not archive.is_file()
    ):
        return None
    return OperandImage(info["name"], archive, refs, info)


def _build_image(
    name: str,
    directory: Path,
    refs: tuple[str, ...],
    layout: Callable[[Path], dict],
    log: Callable[[str], None],
) -> OperandImage:
    """Lay out the root filesystem with `layout` (which returns the image's run config), write
    the archive into `directory`, cache it there."""
    with components.locked(directory.parent / f".{directory.name}-{name}.lock"):
        inputs = _inputs()
        found = _cached(directory, refs, inputs)
        if found:
            return found
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix=f"gpustack-image-{name}-") as tmp:
            root = Path(tmp) / "rootfs"
            root.mkdir()
            config = layout(root)
            archive = directory / f"{name}.tar"
            info = write_docker_archive(root, config, refs, archive)
        info.update(
            name=name,
            archive=archive.name,
            refs=list(refs),
            layout=LAYOUT,
            inputs=inputs,
            build_seconds=round(time.monotonic() - started, 1),
        )
        (directory / "image.json").write_text(json.dumps(info, indent=2) + "\n")
        log(f"image {refs[0]}: {info['layer_bytes'] / 2**20:.1f} MiB -> {archive}")
        return OperandImage(name, archive, refs, info)


def device_plugin_image(log: Callable[[str], None] = lambda _: None) -> OperandImage:
    """NVIDIA's device plugin image as upstream's deployments/container/Dockerfile lays it out:
    /usr/bin/{nvidia-device-plugin, gpu-feature-discovery, mps-control-daemon, config-manager},
    busybox under /busybox with /bin/sh (its distroless -dev base), its ENV and ENTRYPOINT; the
    glibc the binaries link (they dlopen the driver's libnvidia-ml.so.1, which the nvidia
    runtime mounts)."""
    component = components.DEVICE_PLUGIN
    bindir = components.build(component, log)
    config = lab_config()
    refs = (config.image("device_plugin"),)  # also config.image("gfd"): one image since v0.15

    def layout(root: Path) -> dict:
        _base_dirs(root)
        for binary in component.binaries:
            _install_with_libraries(root, bindir / binary, f"/usr/bin/{binary}")
        _busybox(root, "/busybox", ("sh", "ls", "cat", "mount", "umount", "sleep"))
        (root / "bin").mkdir(exist_ok=True)
        (root / "bin/sh").symlink_to("/busybox/sh")
        license_text = module_source(component.module, component.version) / "LICENSE"
        _install(root, license_text, "/licenses/LICENSE", 0o644)
        return {
            "Env": [
                PATH_ENV,
                "NVIDIA_DISABLE_REQUIRE=true",
                "NVIDIA_VISIBLE_DEVICES=all",
                "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
            ],
            "Entrypoint": ["nvidia-device-plugin"],
            "User": "0:0",
            "Labels": {
                "name": "NVIDIA Device Plugin",
                "version": f"v{component.version}",
                "io.gpustack.lab.built-from": f"{component.module}@v{component.version}",
                "io.gpustack.lab.note": "built by gpustack's lab from NVIDIA's source; "
                "not NVIDIA's published image",
            },
        }

    return _build_image(
        "k8s-device-plugin", components.component_dir(component) / "images", refs, layout, log
    )


def verify_image(log: Callable[[str], None] = lambda _: None) -> OperandImage:
    """`gpustack verify`'s pod image for the lab: busybox-static and glibc. `nvidia-smi` is not
    in it: the nvidia runtime injects it with the driver when the pod gets a GPU; without a GPU
    there is none (and verify says "no NVIDIA device")."""
    refs = (lab_config().image("verify"),)
    inputs = _inputs()
    version = inputs["busybox-static"].rpartition(":")[2]  # without the epoch
    directory = components.cache_root() / f"lab-verify-busybox-{version}-libc6-{inputs['libc6']}"

    def layout(root: Path) -> dict:
        _base_dirs(root)
        (root / "bin").mkdir(exist_ok=True)
        _busybox(root, "/bin", ("sh", "ls", "cat", "echo", "env", "true", "sleep"))
        loader = Path("/lib64/ld-linux-x86-64.so.2")
        _install(root, loader, str(loader))
        for library in GLIBC:
            _install(
                root, Path("/lib/x86_64-linux-gnu") / library, f"/lib/x86_64-linux-gnu/{library}"
            )
        (root / "etc/ld.so.conf.d").mkdir()
        (root / "etc/ld.so.conf").write_text("include /etc/ld.so.conf.d/*.conf\n")
        (root / "etc/ld.so.conf.d/x86_64-linux-gnu.conf").write_text(
            "/usr/local/lib/x86_64-linux-gnu\n/lib/x86_64-linux-gnu\n/usr/lib/x86_64-linux-gnu\n"
        )
        return {
            # No NVIDIA_VISIBLE_DEVICES: the pod gets a GPU only from the device plugin or DRA.
            "Env": [PATH_ENV, "NVIDIA_DRIVER_CAPABILITIES=compute,utility"],
            "Cmd": ["sh"],
            "Labels": {
                "io.gpustack.lab.built-from": (
                    f"Debian's busybox-static {inputs['busybox-static']}, libc6 {inputs['libc6']}"
                ),
                "io.gpustack.lab.note": "nvidia-smi comes from the nvidia runtime with a GPU",
            },
        }

    return _build_image("lab-verify", directory, refs, layout, log)


def dra_stand_in_image(log: Callable[[str], None] = lambda _: None) -> OperandImage:
    """A STAND-IN for NVIDIA's DRA driver image, under the name gpustack renders with the lab's
    variables: Kubernetes' DRA test driver as /usr/bin/gpu-kubelet-plugin (simulated GPUs; see
    components.DRA_STAND_IN), and /usr/bin/kubelet-plugin-prestart.sh, which upstream's init
    container runs with bash to wait for the driver: here it only says that there is none to
    wait for. bash is this machine's (the init container's command names it)."""
    component = components.DRA_STAND_IN
    bindir = components.build(component, log)
    refs = (lab_config().image("dra_driver"),)

    def layout(root: Path) -> dict:
        _base_dirs(root)
        _install_with_libraries(root, bindir / "gpu-kubelet-plugin", "/usr/bin/gpu-kubelet-plugin")
        _install_with_libraries(root, Path("/bin/bash"), "/usr/bin/bash")
        (root / "usr/bin/kubelet-plugin-prestart.sh").write_text(
            "echo \"gpustack lab stand-in for NVIDIA's DRA driver: its GPUs are simulated, "
            'there is no driver to wait for"\n'
        )
        _busybox(root, "/busybox", ("sh", "ls", "cat", "sleep"))
        (root / "bin").mkdir(exist_ok=True)
        (root / "bin/sh").symlink_to("/busybox/sh")
        return {
            "Env": [PATH_ENV],
            "Entrypoint": ["gpu-kubelet-plugin"],
            "Labels": {
                "io.gpustack.lab.built-from": (
                    f"k8s.io/kubernetes@v{components.KUBERNETES_VERSION} "
                    "test/e2e/dra/test-driver/app and gpustack/lab/go/gpu-kubelet-plugin"
                ),
                "io.gpustack.lab.note": "STAND-IN for NVIDIA's DRA kubelet plugin: simulated "
                "GPUs, no device given to containers; not NVIDIA's image",
            },
        }

    return _build_image(
        "lab-dra-stand-in", components.component_dir(component) / "images", refs, layout, log
    )


def pause_image(log: Callable[[str], None] = lambda _: None) -> OperandImage:
    """Kubernetes' pause image from the pinned release's build/pause/linux/pause.c, compiled as
    its Makefile does (gcc -Os -Wall -Werror -static, stripped) into its Dockerfile's layout
    (/pause, user 65535:65535)."""
    tag = pause_tag()
    refs = (f"{PAUSE_REPOSITORY}:{tag}",)
    gcc = _run(["gcc", "-dumpfullversion"], Path("/"), "gcc").strip()
    directory = (
        components.cache_root() / f"pause-{tag}-kubernetes-{components.KUBERNETES_VERSION}-gcc{gcc}"
    )

    def layout(root: Path) -> dict:
        binary = directory / "bin/pause"
        if not binary.is_file():
            source = _kubernetes_source() / "build/pause/linux/pause.c"
            binary.parent.mkdir(parents=True, exist_ok=True)
            version = f"-DVERSION=v{tag}-v{components.KUBERNETES_VERSION}"
            part = binary.with_suffix(".part")
            _run(["gcc", "-Os", "-Wall", "-Werror", "-static", version, "-o", str(part),
                  str(source)], directory, "compiling pause.c")  # fmt: skip
            _run(["strip", str(part)], directory, "stripping pause")
            part.rename(binary)
        _install(root, binary, "/pause")
        return {"Entrypoint": ["/pause"], "User": "65535:65535"}

    return _build_image("pause", directory, refs, layout, log)


def build_all(log: Callable[[str], None] = lambda _: None) -> dict[str, OperandImage]:
    """Every lab image, built (with its binaries) where missing."""
    return {
        "device_plugin": device_plugin_image(log),
        "verify": verify_image(log),
        "dra_driver": dra_stand_in_image(log),
        "pause": pause_image(log),
    }


def module_source(module: str, version: str) -> Path:
    """The module's source in the Go module cache (downloaded when missing)."""
    with tempfile.TemporaryDirectory(prefix="gpustack-modsrc-") as tmp:
        proc = subprocess.run(
            ["go", "mod", "download", "-json", f"{module}@v{version}"],
            cwd=tmp,
            capture_output=True,
            text=True,
            env=dict(os.environ, GOFLAGS="-mod=mod"),
        )
    try:
        info = json.loads(proc.stdout or "{}")
    except ValueError:
        info = {}
    if proc.returncode != 0 or not info.get("Dir"):
        raise LabError(
            f"{module}@v{version} could not be downloaded: {info.get('Error') or proc.stderr}",
            "the Go module proxy must be reachable and serve this version",
        )
    return Path(info["Dir"])


def _kubernetes_source() -> Path:
    return module_source("k8s.io/kubernetes", components.KUBERNETES_VERSION)


# -- into a lab node ---------------------------------------------------------------------


def load_into_node(
    container: str,
    images: Iterable[OperandImage],
    namespace: str = "k8s.io",
    snapshotter: str = "native",
) -> list[str]:
    """Import the archives into a lab node's containerd (`podman cp`, then `ctr images import`
    in the node), unpacked for `snapshotter` (overlay on the node's overlay fails: native).
    Returns the names containerd then lists; raises LabError when one is missing."""
    wanted: list[str] = []
    for image in images:
        target = f"{ARCHIVE_DIR_IN_NODE}/{image.archive.name}"
        _podman(["exec", container, "mkdir", "-p", ARCHIVE_DIR_IN_NODE], container)
        _podman(["cp", str(image.archive), f"{container}:{target}"], container)
        base = ["exec", container, "ctr", "-n", namespace, "images", "import"]
        # containerd 2.x's transfer service wants --local for an archive without an index; 1.x
        # has no such flag.
        proc = _podman([*base, "--local", "--snapshotter", snapshotter, target], container, False)
        if proc.returncode != 0 and "flag provided but not defined" in proc.stderr:
            proc = _podman([*base, "--snapshotter", snapshotter, target], container, False)
        if proc.returncode != 0:
            raise LabError(
                f"{container}: ctr could not import {image.refs[0]}: {proc.stderr.strip()[-400:]}",
                "is containerd running in the node? (`podman exec NODE ctr version`)",
            )
        _podman(["exec", container, "rm", "-f", target], container)
        wanted.extend(image.refs)
    listed = _podman(["exec", container, "ctr", "-n", namespace, "images", "ls", "-q"], container)
    missing = [ref for ref in wanted if ref not in listed.stdout.split()]
    if missing:
        raise LabError(
            f"{container}: containerd does not list {', '.join(missing)} after the import",
            f"`podman exec {container} ctr -n {namespace} images ls` shows what it has",
        )
    return wanted


def _podman(args: list[str], container: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(["podman", *args], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise LabError(
            f"{container}: `podman {' '.join(args[:3])} …` failed: {proc.stderr.strip()[-400:]}",
            "`podman ps -a` shows the lab's nodes",
        )
    return proc
