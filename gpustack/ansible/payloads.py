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
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

KEEP_KEYS = 4  # key directories kept (one per gpustack and ansible-core version in use)


def cache_root(name: str = "ansiballz", environ: Mapping[str, str] = os.environ) -> Path:
    """~/.cache/gpustack/NAME ($XDG_CACHE_HOME/gpustack/NAME): this module's, jinja_cache.py's."""
    base = environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return Path(base) / "gpustack" / name


def key(content_root: Path, ansible_version: str) -> str:
    """Hash of what a gpustack module's payload is made of (see the module's docstring)."""
    digest = hashlib.sha256()
    for part in (ansible_version, sys.version, str(content_root)):
        digest.update(part.encode() + b"\0")
    plugins = content_root / "plugins"
    for sub in ("modules", "module_utils"):
        for path in sorted((plugins / sub).rglob("*.py")):
            digest.update(str(path.relative_to(plugins)).encode() + b"\0")
            digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:24]


def _copy(src: Path, dst: Path) -> None:
    """src to dst atomically: a reader sees no file or the whole file."""
    part = dst.with_name(f".{dst.name}.{os.getpid()}.part")
    shutil.copyfile(src, part)
    os.replace(part, dst)


def prune(root: Path, keep: Path) -> None:
    """Key directories beyond the KEEP_KEYS most recently used go (keep is marked used)."""
    with contextlib.suppress(OSError):
        keep.touch()
        dirs = sorted((p for p in root.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
        for stale in dirs[:-KEEP_KEYS]:
            if stale != keep:
                shutil.rmtree(stale, ignore_errors=True)


def install(content_root: Path, root: Path | None = None) -> Path | None:
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
    kept = (root or cache_root()) / key(content_root, ansible_version)
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
        with contextlib.suppress(OSError):
            for entry in local.glob(f"{prefix}*"):
                done = entry.suffix != ".lock" and not entry.name.endswith("-part")
                if done and not (kept / entry.name).exists():
                    _copy(entry, kept / entry.name)
        return result

    module_common._find_module_utils = wrapped
    return kept
