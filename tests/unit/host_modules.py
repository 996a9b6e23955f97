"""gpustack's host modules loaded as Ansible ships them: the collection's module_utils
(plugins/module_utils) are registered under their collection name
(`ansible_collections.gpustack.gpustack.plugins.module_utils.<name>`) first, the way AnsiballZ
bundles them with a module. `python -m tests.unit.host_modules MODULE ARGS.json` runs a
module as a script, like Ansible's own module test harness."""

from __future__ import annotations

import importlib.util
import json
import os
import runpy
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UTILS = ROOT / "plugins/module_utils"
PACKAGE = "ansible_collections.gpustack.gpustack.plugins.module_utils"
# Each imports only those before it.
ORDER = (
    "gpustack_host",
    "gpustack_dpkg",
    "gpustack_files",
    "gpustack_apt_commit",
    "gpustack_apt_components",
    "gpustack_keyfetch",
    "gpustack_stamps",
    "gpustack_containerd",
    "gpustack_kubelet",
    "gpustack_k3s",
)


def _exec(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def utils(name: str):
    """One of the shared module_utils, under its collection name."""
    key = f"{PACKAGE}.{name}"
    if key not in sys.modules:
        for dependency in ORDER:
            if dependency == name:
                break
            utils(dependency)
        _exec(key, UTILS / f"{name}.py")
    return sys.modules[key]


def load(path: str, name: str):
    """A module or filter file (path relative to the repository), its module_utils resolved."""
    for util in ORDER:
        utils(util)
    return _exec(name, ROOT / path)


def run_module(
    module: Path,
    args: dict,
    work: Path,
    fakes: dict[str, str] | None = None,
    env: dict[str, str] | None = None,
    path: str | None = None,
) -> dict:
    """Run a host module as Ansible runs it (a JSON args file; `_ansible_check_mode` and the like
    go in `args`) and return its JSON result. `fakes` are TEST DOUBLE executables (name -> script)
    written to work/bin, which comes first in PATH (then `path`, default the caller's PATH)."""
    bin_dir = work / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, text in (fakes or {}).items():
        # written aside and renamed into place: a background job a previous call started may be
        # executing the old script, and rewriting it in place fails that exec with ETXTBSY
        part = bin_dir / f".{name}.part"
        part.write_text(text)
        part.chmod(0o755)
        os.replace(part, bin_dir / name)
    args_file = work / "args.json"
    args_file.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": args}))
    search = f"{bin_dir}{os.pathsep}{os.environ['PATH'] if path is None else path}"
    proc = subprocess.run(
        [sys.executable, "-m", "tests.unit.host_modules", str(module), str(args_file)],
        capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {}), "PATH": search},
    )  # fmt: skip
    return json.loads(proc.stdout)


if __name__ == "__main__":
    for util in ORDER:
        utils(util)
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
