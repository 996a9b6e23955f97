"""Plugins loaded once in ansible-playbook's main process, not again in every worker.

ansible-playbook forks a worker process for each task and host; a plugin the main process never
loaded is loaded (its source read, compiled and executed) in each worker that needs it and thrown
away with it. In a `gpustack install --full` of one converged lab node (96 tasks) 34 workers loaded
ansible-core's four test plugin files (for `is skipped`, `is version` and the like: resolving one
test name loads them all) and 20 loaded the six filter files of gpustack's collection with the
module_utils they import, about 0.33 s of the workers' 4.7 s (docs/performance.md, "twentieth
session"). Loaded before the play's workers fork, they are inherited: Ansible's loader takes a
plugin module it finds in `sys.modules`.

Installed by launch.py: TaskQueueManager.run (the main process, once per play, before its
strategy forks any worker) loads them first. Each load is best effort: one this ansible-core does
not have is left to the workers, as before.
"""

from __future__ import annotations

import contextlib
import importlib

# One name per file is enough: resolving a name loads every file of its kind there.
TESTS = ("ansible.builtin.skipped",)
FILTERS = ("gpustack.gpustack.gpu_converged_redact",)
LOOKUPS = ("ansible.builtin.template", "ansible.builtin.vars")
ACTIONS = ("ansible.legacy.normal",)  # the action of every module task (as task_executor asks)
MODULES = (  # how module arguments and results travel (every module task)
    "ansible.module_utils._internal._json._profiles._module_legacy_m2c",
    "ansible.module_utils._internal._json._profiles._module_legacy_c2m",
)


def load() -> None:
    """Load the plugins above into this process (after Ansible's plugin loader is set up)."""
    from ansible.plugins import loader

    for plugins, names, options in (
        (loader.test_loader, TESTS, {}),
        (loader.filter_loader, FILTERS, {}),
        (loader.lookup_loader, LOOKUPS, {}),
        (loader.action_loader, ACTIONS, {"class_only": True}),
    ):
        for name in names:
            with contextlib.suppress(Exception):
                plugins.get(name, **options)
    for module in MODULES:
        with contextlib.suppress(ImportError):
            importlib.import_module(module)


def install() -> bool:
    """Load them at the start of every play; False where there is no TaskQueueManager.run."""
    try:
        from ansible.executor.task_queue_manager import TaskQueueManager
    except ImportError:
        return False
    original = getattr(TaskQueueManager, "run", None)
    if original is None:
        return False

    def run(self, play):
        load()
        return original(self, play)

    TaskQueueManager.run = run
    return True
