"""The one vocabulary of NVIDIA driver versions, for the CLI (status, doctor, upgrade, the
converged-host check, input checks).

Its code is the collection's `plugins/module_utils/gpustack_driver_version.py`: the roles'
filter plugins import it from there, also where this Python package is not installed (a user's
controller or an AWX execution environment with only the collection; docs/collection.md). This
module loads that one file from the content root (the checkout, or the wheel's
gpustack/_content), so the CLI and the roles cannot drift apart.
"""

from __future__ import annotations

import importlib.util
import sys

from gpustack import paths

_NAME = "gpustack._driver_version_impl"


def _load():
    path = paths.content_root() / "plugins/module_utils/gpustack_driver_version.py"
    spec = importlib.util.spec_from_file_location(_NAME, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[_NAME] = module
    spec.loader.exec_module(module)
    return module


_impl = sys.modules.get(_NAME) or _load()

VersionError = _impl.VersionError
split = _impl.split
without_epoch = _impl.without_epoch
upstream_version = _impl.upstream_version
branch_of = _impl.branch_of
on_branch = _impl.on_branch
same_version = _impl.same_version
loaded_is_installed = _impl.loaded_is_installed
nvrm_version = _impl.nvrm_version
madison_versions = _impl.madison_versions
compare = _impl.compare
resolve = _impl.resolve
