"""Container images for the lab written as Docker image archives (`docker save`'s format, which
`ctr images import` and `podman load` read), built from files on this machine: no registry and
no Docker engine are needed.

The pause image is Kubernetes' own pause program (build/pause/linux/pause.c of the
k8s.io/kubernetes module at the pinned version), compiled statically here as upstream's
Makefile does (`-Os -Wall -Werror -static`).
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import tarfile
import tempfile
from pathlib import Path

from gpustack.errors import LabError
from gpustack.lab import components

PAUSE_TAG = "3.10.2"  # build/pause/Makefile's TAG in Kubernetes 1.36
PAUSE_REF = f"gpustack.local/pause:{PAUSE_TAG}"


def _layer(files: dict[str, tuple[bytes, int]]) -> bytes:
    """A tar layer of `path -> (content, mode)`, with parent directories, reproducible."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(p).parent) for p in files} - {".", "/"})
        for directory in dirs:
            parts = Path(directory.lstrip("/")).parts
            for i in range(1, len(parts) + 1):
                name = "/".join(parts[:i])
                if name in tar.getnames():
                    continue
                info = tarfile.TarInfo(name)
                info.type, info.mode, info.mtime = tarfile.DIRTYPE, 0o755, 0
                tar.addfile(info)
        for path in sorted(files):
            content, mode = files[path]
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(content), mode, 0
            tar.addfile(info, io.BytesIO(content))
    return buf.getvalue()


def write_archive(
    dest: Path,
    ref: str,
    files: dict[str, tuple[bytes, int]],
    entrypoint: list[str],
    env: list[str] | None = None,
) -> Path:
    """One-layer image `ref` as a Docker archive at `dest` (written atomically)."""
    layer = _layer(files)
    diff_id = "sha256:" + hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Entrypoint": entrypoint,
            "Env": env or ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created_by": "gpustack lab (gpustack/lab/image_archive.py)"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = hashlib.sha256(config_bytes).hexdigest() + ".json"
    layer_name = diff_id.split(":")[1] + "/layer.tar"
    manifest = [{"Config": config_name, "RepoTags": [ref], "Layers": [layer_name]}]
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    with tarfile.open(part, "w") as tar:
        for name, data in (
            (config_name, config_bytes),
            (layer_name, layer),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    part.replace(dest)
    return dest


def pause_archive() -> Path:
    """The pause image archive, compiled from the pinned Kubernetes module once and cached."""
    name = f"pause-{PAUSE_TAG}-k8s{components.KUBERNETES_VERSION}.tar"
    dest = components.cache_root() / "images" / name
    if dest.is_file():
        return dest
    source = _pause_source()
    with tempfile.TemporaryDirectory(prefix="gpustack-pause-") as tmp:
        binary = Path(tmp) / "pause"
        proc = subprocess.run(
            ["gcc", "-Os", "-Wall", "-Werror", "-static",
             f"-DVERSION=v{PAUSE_TAG}-gpustack-lab", "-o", str(binary), str(source)],
            capture_output=True, text=True,
        )  # fmt: skip
        if proc.returncode != 0:
            raise LabError(
                f"compiling Kubernetes' pause.c failed: {proc.stderr.strip()[-300:]}",
                "install gcc and libc6-dev (static libc): apt-get install gcc libc6-dev",
            )
        subprocess.run(["strip", str(binary)], check=False)
        return write_archive(dest, PAUSE_REF, {"/pause": (binary.read_bytes(), 0o755)}, ["/pause"])


def _pause_source() -> Path:
    proc = subprocess.run(
        ["go", "mod", "download", "-json", f"k8s.io/kubernetes@v{components.KUBERNETES_VERSION}"],
        capture_output=True,
        text=True,
        cwd=tempfile.gettempdir(),
    )
    info = json.loads(proc.stdout or "{}")
    source = Path(info.get("Dir") or "/nonexistent") / "build" / "pause" / "linux" / "pause.c"
    if not source.is_file():
        raise LabError(
            f"Kubernetes' pause.c is not in the module cache ({info.get('Error') or source})",
            "the Go module proxy must be reachable",
        )
    return source
