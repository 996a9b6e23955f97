"""gpustack's host modules loaded as Ansible ships them: the collection's module_utils
(plugins/module_utils) are registered under their collection name
(`ansible_collections.gpustack.gpustack.plugins.module_utils.<name>`) first, the way AnsiballZ
bundles them with a module. `python -m tests.unit.host_modules MODULE ARGS.json` runs a
module as a script, like Ansible's own module test harness."""

from __future__ import annotations

import importlib.util
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UTILS = ROOT / "plugins/module_utils"
PACKAGE = "ansible_collections.gpustack.gpustack.plugins.module_utils"
# Each imports only those before it.
ORDER = ("gpustack_host", "gpustack_stamps", "gpustack_containerd", "gpustack_kubelet")


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


if __name__ == "__main__":
    for util in ORDER:
        utils(util)
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
