"""`gpustack plan`: fold a check-mode run's changed tasks into packages, files, services, reboots.

Pure: input is a HostResult's `changes` (task, action, diff, details from the task result).
Roles announce what check mode cannot do by itself with a `debug` task whose `msg` is a mapping
with the key `gpustack_plan` (`restart` + `service`, `reboot` + `reason`, or `packages` +
`simulation`: an `apt-get --simulate` run's output, and `what` when that is empty).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from gpustack.ansible.results import TaskChange

_INST = re.compile(r"^Inst (\S+)(?: \[([^\]]+)\])? \((\S+)")
_REMV = re.compile(r"^(?:Remv|Purg) (\S+)(?: \[([^\]]+)\])?")
_FILE_ACTIONS = ("copy", "template", "file", "lineinfile", "blockinfile", "replace", "get_url")
_SERVICE_ACTIONS = ("systemd", "systemd_service", "service")


@dataclass
class HostPlan:
    install: list[str] = field(default_factory=list)  # "pkg version"
    upgrade: list[str] = field(default_factory=list)  # "pkg old -> new" (or downgrade)
    remove: list[str] = field(default_factory=list)
    holds: list[str] = field(default_factory=list)  # "pkg: install -> hold"
    files: list[dict[str, Any]] = field(default_factory=list)  # path, task, diff
    services: list[str] = field(default_factory=list)
    reboots: list[str] = field(default_factory=list)
    mig: list[str] = field(default_factory=list)  # "layout: what would change" (nvidia_mig)
    other: list[str] = field(default_factory=list)  # changed tasks none of the above explains

    def empty(self) -> bool:
        return not any(asdict(self).values())

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _short(action: str) -> str:
    return action.rsplit(".", 1)[-1]


def parse_apt_simulation(text: str) -> tuple[list[str], list[str], list[str]]:
    """`apt-get --simulate` lines -> (install, upgrade, remove)."""
    install, upgrade, remove = [], [], []
    for line in (text or "").splitlines():
        if m := _INST.match(line):
            name, old, new = m.groups()
            if old:
                upgrade.append(f"{name} {old} -> {new}")
            else:
                install.append(f"{name} {new}")
        elif m := _REMV.match(line):
            remove.append(f"{m.group(1)} {m.group(2)}" if m.group(2) else m.group(1))
    return install, upgrade, remove


def _add(target: list, value: str) -> None:
    if value not in target:
        target.append(value)


def _add_simulation(plan: HostPlan, text: str) -> bool:
    """The packages an `apt-get --simulate` output installs, upgrades and removes; False: none."""
    install, upgrade, remove = parse_apt_simulation(text)
    for target, values in ((plan.install, install), (plan.upgrade, upgrade), (plan.remove, remove)):
        for value in values:
            _add(target, value)
    return bool(install or upgrade or remove)


def _add_files(plan: HostPlan, paths: list[str], task: str, diff: list[dict]) -> None:
    """One entry per file a task changes, each with its own part of the task's diff."""
    for path in paths:
        own = [d for d in diff if d.get("after_header") == path]
        plan.files.append({"path": path, "task": task, "diff": own})


def summarize(changes: list[TaskChange]) -> HostPlan:
    plan = HostPlan()
    for change in changes:
        action, details = _short(change.action), change.details or {}
        label = f"{change.role} : {change.task}" if change.role else change.task
        msg = details.get("msg")
        if isinstance(msg, dict) and "gpustack_plan" in msg:
            if msg["gpustack_plan"] == "restart":
                _add(plan.services, f"{msg.get('service')}: would {msg.get('verb') or 'restart'}")
            elif msg["gpustack_plan"] == "reboot":
                _add(plan.reboots, str(msg.get("reason") or label))
            elif msg["gpustack_plan"] != "packages" or not _add_simulation(
                plan, msg.get("simulation") or ""
            ):  # named packages, or a simulation that found none: said in words
                _add(plan.other, str(msg.get("what") or label))
            continue
        if action in ("apt", "gpustack_apt_install", "dnf", "yum", "package"):
            found = _add_simulation(plan, details.get("stdout", ""))
            for item in details.get("holds") or []:  # gpustack_apt_install holds in its call
                before, after = item.get("before", "?"), item.get("after", "?")
                _add(plan.holds, f"{item.get('item', '?')}: {before} -> {after}")
            if details.get("recorded"):
                _add(plan.other, "would record the packages installed before gpustack's first "
                     "driver install (uninstall restores that set)")  # fmt: skip
            files = [item.get("path", "?") for item in details.get("changes") or []]
            _add_files(plan, files, label, change.diff)  # its pins, written in the call
            if not (found or details.get("holds") or details.get("recorded") or files):
                _add(plan.other, label)  # e.g. a package list refresh, or dnf
        elif action in ("dpkg_selections", "gpustack_dpkg_selections"):  # one package, or many
            for item in details.get("items") or [details]:
                name = item.get("item") or item.get("name") or "?"
                _add(plan.holds, f"{name}: {item.get('before', '?')} -> {item.get('after', '?')}")
        elif action in _FILE_ACTIONS and details.get("items"):  # a loop: one entry per file
            paths = [item.get("dest") or item.get("path") or label for item in details["items"]]
            _add_files(plan, paths, label, change.diff)
        elif action in _FILE_ACTIONS:
            headers = [d.get("after_header") for d in change.diff if d.get("after_header")]
            path = details.get("dest") or details.get("path") or (headers or [label])[0]
            plan.files.append({"path": path, "task": label, "diff": change.diff})
        elif action == "gpustack_state_files":  # gpustack's own records, backups and markers
            paths = [item.get("path", "?") for item in details.get("changes") or []]
            _add_files(plan, paths, label, change.diff)
        elif action == "gpustack_apt_lists" and details.get("files"):  # archive components
            _add_files(plan, details["files"], label, change.diff)  # (the refresh: plan's debug)
        elif action == "gpustack_apt_source":  # source, credentials, keyring, key: one change
            headers = [d.get("after_header") for d in change.diff if d.get("after_header")]
            _add_files(plan, details.get("files") or headers or [label], label, change.diff)
        elif action == "gpustack_restart":
            if details.get("would_restart"):  # check mode (a marker to clear is no restart)
                _add(plan.services, f"{details.get('name', '?')}: would restart")
        elif action in _SERVICE_ACTIONS:
            state = details.get("state") or ("enabled" if details.get("enabled") else "changed")
            _add(plan.services, f"{details.get('name', '?')}: would be {state}")
        elif action == "reboot":
            _add(plan.reboots, label)
        elif action == "gpustack_mig":
            mig = details.get("mig") or {}
            _add(plan.mig, f"{mig.get('config', '?')}: {mig.get('reason') or label}")
        else:
            _add(plan.other, label)
    return plan
