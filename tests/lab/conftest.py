"""Lab suite order under pytest-xdist: `scripts/test.sh` runs it with `--dist loadfile
--no-loadscope-reorder`, so each lab file (which brings up nodes of its own in a module-scoped
fixture) stays on one worker, and files go out in collection order. Files known to run longest
are collected first, so that no long file starts last.

(`--dist loadgroup` would not do: with pytest 9.2 the group suffix pytest-xdist 3.8 writes into
an item's node id is ignored, and a file's tests were spread over both workers, each bringing up
its own lab.)
"""

from __future__ import annotations

from pathlib import Path

HERE = Path(__file__).parent

# Longest first: the files with the longest tests in the clean-clone CI run of 2026-11-28
# (docs/lab.md, `--durations 25`); the rest keep their order.
LONGEST_FIRST = (
    "test_runtime.py",
    "test_containerd_v1_schema.py",
    "test_real_cluster.py",
    "test_execution_environment.py",  # its image build and job; the base image is cached
    "test_molecule_default.py",
    "test_credentials.py",
    "test_driver.py",
    "test_chroot_node.py",
    "test_fastpath.py",
    "test_kill_rerun.py",
    "test_molecule_upgrade.py",
    "test_docker_engine.py",
    "test_fleet.py",
    "test_mig.py",
    "test_lab.py",
    "test_upgrade.py",
    "test_smoke.py",
)


def pytest_collection_modifyitems(config, items):
    def rank(item):
        name = item.path.name if item.path.parent == HERE else ""
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable: tests keep their order within a file
