"""gpustack's module payloads kept between ansible-playbook runs.

Before Ansible sends a module to a host it builds the module's AnsiballZ payload (the module and
every module_utils file it imports, zipped): about 0.15 s of the controller's CPU per module on
the build machine, once per module and `ansible-playbook` process, because Ansible keeps that
cache in the process's own temporary directory and removes it at exit
(`ansible/executor/module_common.py`, `_find_module_utils`; `C.DEFAULT_LOCAL_TMP` is a
`mkdtemp` per process). A first install uses nine distinct modules, four of them on the way to
the driver's package transaction: every run paid about 0.6 s of wall time there and the CPU of
the rest while the host's dpkg needed it (docs/performance.md).

Installed by launch.py (the ansible-playbook runner.py starts under childguard.py): payloads of
gpustack's own modules (the `gpustack.gpustack` collection, `plugins/modules`) are kept under the
user's cache directory, in a directory named after a hash of everything that
goes into them: ansible-core's version, Python's, the content root's path and every file under
its `plugins/modules` and `plugins/module_utils` (gpustack's modules import nothing else but
ansible-core's module_utils; tests/unit/test_payloads.py holds them to that). A changed module
or module_utils file makes a new key, so a payload is never older than its source. Ansible still
builds and loads each payload itself: before its build, a kept one is put where it looks
(atomically); after it, a new one is kept (atomically). Any other module (ansible.builtin, a
user's own) is left to Ansible as before.

Kept payloads also carry bytecode. The host runs a payload from its zip (zipimport), which can
write no `__pycache__`: every module call compiled ansible-core's module_utils and gpustack's
again, about 50 ms of the host's CPU for `ansible.module_utils.basic` and its imports alone (a
ping's module run on a lab node: 125 ms, 78 ms with bytecode). A new payload gets a checked
hash-based .pyc (PEP 552) beside each .py, compiled by the controller's Python, and Ansible is
asked again for the call at hand. A host whose Python has another magic number ignores them
(zipimport falls back to the .py), and one whose .py differs from the hash would too; a traceback
names the files by their path inside the zip. The payload grows about threefold (a gpustack module's
from about 200 KB of base64 to about 590 KB); GPUSTACK_PAYLOAD_BYTECODE=0 keeps them as Ansible
builds them (another key).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import importlib.util
import io
import marshal
import os
import pickle
import shutil
import sys
import zipfile
from collections.abc import Mapping
from pathlib import Path

KEEP_KEYS = 4  # key directories kept (one per gpustack and ansible-core version in use)
# What a kept payload holds besides Ansible's own build, part of the key (a payload an earlier
# gpustack kept without bytecode is not taken). GPUSTACK_PAYLOAD_BYTECODE=0 keeps them plain.
BYTECODE, PLAIN = "bytecode-1", "plain"


def cache_root(name: str = "ansiballz", environ: Mapping[str, str] = os.environ) -> Path:
    """~/.cache/gpustack/NAME ($XDG_CACHE_HOME/gpustack/NAME): this module's, jinja_cache.py's."""
    base = environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "gpustack" / name


def key(content_root: Path, ansible_version: str, form: str = BYTECODE) -> str:
    """Hash of what a gpustack module's payload is made of (see the module's docstring)."""
    digest = hashlib.sha256()
    for part in (form, ansible_version, sys.version, str(content_root)):
        digest.update(part.encode() + b"\0")
    plugins = content_root / "plugins"
    for sub in ("modules", "module_utils"):
        for path in sorted((plugins / sub).rglob("*.py")):
            digest.update(str(path.relative_to(plugins)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:24]


def _replace(dst: Path, write) -> None:
    """dst written by write(part) atomically: a reader sees the old file (or none) or the new."""
    part = dst.with_name(f".{dst.name}.{os.getpid()}.part")
    write(part)
    os.replace(part, dst)


def _copy(src: Path, dst: Path) -> None:
    _replace(dst, lambda part: shutil.copyfile(src, part))


def pyc(source: bytes, name: str) -> bytes:
    """`source` compiled by this Python, as a checked hash-based .pyc (PEP 552): the importer
    uses it only where its own magic number matches and the hash matches the .py beside it."""
    code = compile(source, name, "exec", dont_inherit=True, optimize=0)
    flags = (0b11).to_bytes(4, "little")  # hash-based, checked against the source
    header = importlib.util.MAGIC_NUMBER + flags + importlib.util.source_hash(source)
    return header + marshal.dumps(code)


def add_bytecode(zip_data: bytes) -> bytes | None:
    """The payload's zip (base64, as Ansible keeps it) with a .pyc beside each .py, or None where
    it has bytecode already."""
    with zipfile.ZipFile(io.BytesIO(base64.b64decode(zip_data))) as src:
        infos = src.infolist()
        if any(info.filename.endswith(".pyc") for info in infos):
            return None
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w") as dst:
            for info in infos:
                data = src.read(info)
                dst.writestr(info, data)
                if info.filename.endswith(".py"):
                    compiled = zipfile.ZipInfo(info.filename + "c", info.date_time)
                    compiled.compress_type = info.compress_type
                    compiled.external_attr = info.external_attr
                    dst.writestr(compiled, pyc(data, info.filename))
    return base64.b64encode(out.getvalue())


def _with_bytecode(path: Path) -> bool:
    """Add bytecode to the payload Ansible kept at `path` (atomically); True if it did."""
    with path.open("rb") as fh:
        cached = pickle.load(fh)  # Ansible's own _CachedModule, written by this process's build
    zip_data = add_bytecode(cached.zip_data)
    if zip_data is None:
        return False
    cached = dataclasses.replace(cached, zip_data=zip_data)
    _replace(path, lambda part: part.write_bytes(pickle.dumps(cached)))
    return True


def prune(root: Path, keep: Path) -> None:
    """Key directories beyond the KEEP_KEYS most recently used go (keep is marked used)."""
    with contextlib.suppress(OSError):
        keep.touch()
        dirs = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
        for stale in dirs[:-KEEP_KEYS]:
            if stale != keep:
                shutil.rmtree(stale, ignore_errors=True)


def install(
    content_root: Path, root: Path | None = None, environ: Mapping[str, str] = os.environ
) -> Path | None:
    """Wrap Ansible's payload build; returns the key directory, or None where this ansible-core
    has no build step of the known shape (then Ansible runs as it is)."""
    try:
        from ansible import constants as C
        from ansible.executor import module_common
        from ansible.release import __version__ as ansible_version
    except ImportError:
        return None
    build = getattr(module_common, "_find_module_utils", None)
    fqn_of = getattr(module_common, "_get_ansible_module_fqn", None)
    if build is None or fqn_of is None:
        return None
    content_root = Path(os.path.realpath(content_root))
    modules = str(content_root / "plugins" / "modules") + os.sep
    bytecode = environ.get("GPUSTACK_PAYLOAD_BYTECODE", "1") != "0"
    kept = (root or cache_root(environ=environ)) / key(
        content_root, ansible_version, BYTECODE if bytecode else PLAIN
    )
    try:
        kept.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError:
        return None
    prune(kept.parent, kept)

    def wrapped(*args, **kwargs):
        path = kwargs.get("module_path", args[2] if len(args) > 2 else None)
        if not path or not os.path.realpath(path).startswith(modules):
            return build(*args, **kwargs)
        try:
            prefix = f"{fqn_of(path)}-"
            local = Path(C.DEFAULT_LOCAL_TMP) / "ansiballz_cache"
            local.mkdir(parents=True, exist_ok=True)
            for entry in kept.glob(f"{prefix}*"):
                if not (local / entry.name).exists():
                    _copy(entry, local / entry.name)
        except (OSError, ValueError):
            return build(*args, **kwargs)
        result = build(*args, **kwargs)
        again = False
        with contextlib.suppress(OSError):
            for entry in local.glob(f"{prefix}*"):
                done = entry.suffix != ".lock" and not entry.name.endswith("-part")
                if done and not (kept / entry.name).exists():
                    if bytecode:
                        with contextlib.suppress(Exception):  # then kept as Ansible built it
                            again = _with_bytecode(entry) or again
                    _copy(entry, kept / entry.name)
        return build(*args, **kwargs) if again else result

    module_common._find_module_utils = wrapped
    return kept
