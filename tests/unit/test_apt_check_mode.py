"""Every task of the roles that calls Ansible's apt module can be planned on a host without
python3-apt, which that module's check mode needs (docs/fleet.md, "python3-apt").

Install paths skip on `dpkg_ready_apt_unavailable` (set by roles/dpkg_ready in check mode where
python3-apt is missing; the plan names the packages instead). A new apt task without it fails here.
Uninstall calls apt-get itself, in both modes: Ansible's apt module would install python3-apt by
itself where it is missing, and the uninstall play installs nothing.
"""

from __future__ import annotations

import yaml

from tests.conftest import ROOT

GATE = "not (ansible_check_mode and dpkg_ready_apt_unavailable | default(false))"


def apt_tasks():
    """(file, task) for every ansible.builtin.apt task in the roles, blocks included."""

    def walk(tasks):
        for task in tasks or []:
            for key in ("block", "rescue", "always"):
                yield from walk(task.get(key))
            if "ansible.builtin.apt" in task:
                yield task

    for path in sorted((ROOT / "roles").glob("*/tasks/*.yml")):
        for task in walk(yaml.safe_load(path.read_text())):
            yield path.relative_to(ROOT), task


def conditions(task) -> list[str]:
    when = task.get("when", [])
    return [when] if isinstance(when, str) else list(when)


def test_every_apt_task_is_planned_without_python3_apt():
    found = list(apt_tasks())
    # the toolkit's local .deb files; every other package step is gpustack_apt_lists or
    # gpustack_apt_install (apt-get and apt-cache, no python3-apt), which plan without it
    assert len(found) >= 1, found
    for path, task in found:
        assert path.name != "uninstall.yml", (path, task["name"])
        assert GATE in conditions(task), (path, task["name"])


def test_uninstall_removes_packages_with_apt_get_itself():
    """The driver's and the toolkit's removals: apt-get purge, which needs no python3-apt."""
    for role in ("nvidia_driver", "nvidia_container_toolkit"):
        text = (ROOT / "roles" / role / "tasks" / "uninstall.yml").read_text()
        assert "ansible.builtin.apt:" not in text, role
        assert "'--allow-change-held-packages', 'purge']" in text, role
