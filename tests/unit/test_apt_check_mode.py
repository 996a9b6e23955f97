"""Every task of the roles that calls Ansible's apt module can be planned on a host without
python3-apt, which that module's check mode needs (docs/fleet.md, "python3-apt").

Install paths skip on `dpkg_ready_apt_unavailable` (set by roles/dpkg_ready in check mode where
python3-apt is missing; the plan names the packages instead); uninstall's removals never run in
check mode (apt-get's own simulation is the plan). A new apt task without either fails here.
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
    assert len(found) >= 11, found  # the driver's, the toolkit's, their uninstalls
    for path, task in found:
        when = conditions(task)
        if path.name == "uninstall.yml":
            assert any("not ansible_check_mode" in c for c in when), (path, task["name"])
        else:
            assert GATE in when, (path, task["name"])
