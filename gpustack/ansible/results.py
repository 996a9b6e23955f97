"""Plain data for what a playbook run did, per host; built from ansible-runner events."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpustack.errors import ExitCode, canceled_exit_code

FACT_PREFIX = "gpustack_"


@dataclass
class TaskFailure:
    task: str
    role: str
    message: str


@dataclass
class TaskChange:
    task: str
    role: str
    diff: list[dict[str, Any]] = field(default_factory=list)
    action: str = ""
    details: dict[str, Any] = field(default_factory=dict)  # what `plan` summarises


@dataclass
class HostResult:
    name: str
    ok: int = 0
    changed: int = 0
    failed: int = 0
    skipped: int = 0
    unreachable: bool = False
    unreachable_message: str = ""
    current_role: str = ""
    current_task: str = ""
    facts: dict[str, Any] = field(default_factory=dict)
    failures: list[TaskFailure] = field(default_factory=list)
    changes: list[TaskChange] = field(default_factory=list)
    started: bool = False
    finished: bool = False  # the play recap counted it: its play ran to the end
    stopped: bool = False  # started, and the run ended before its play did
    converged: bool = False  # skipped by install's fast path (gpustack/fleet/converged.py)

    @property
    def status(self) -> str:
        if self.unreachable:
            return "unreachable"
        if self.failed:
            return "failed"
        if not self.started:
            return "not run"
        if self.stopped:
            return "stopped"
        return "changed" if self.changed else "ok"


@dataclass
class RunResult:
    playbook: str
    status: str  # ansible-runner's: successful, failed, canceled, timeout
    rc: int
    artifacts_dir: str
    hosts: dict[str, HostResult]

    @property
    def exit_code(self) -> ExitCode:
        if self.status == "canceled":
            return canceled_exit_code()
        if any(h.failed for h in self.hosts.values()):
            return ExitCode.HOST_FAILED
        if any(h.unreachable for h in self.hosts.values()):
            return ExitCode.UNREACHABLE
        if self.status != "successful" or self.rc != 0:
            return ExitCode.HOST_FAILED
        return ExitCode.OK

    def summary(self) -> dict[str, int]:
        hosts = list(self.hosts.values())
        return {
            "hosts": len(hosts),
            "ok": sum(1 for h in hosts if h.status in ("ok", "changed")),
            "changed": sum(h.changed for h in hosts),
            "failed": sum(1 for h in hosts if h.status == "failed"),
            "unreachable": sum(1 for h in hosts if h.unreachable),
            "stopped": sum(1 for h in hosts if h.status == "stopped"),
        }


def _message(res: dict[str, Any]) -> str:
    """The most useful one-paragraph message from a task result."""
    parts = []
    msg = res.get("msg")
    if msg:
        parts.append(str(msg))
    for key in ("stderr", "module_stderr"):
        text = (res.get(key) or "").strip()
        if text and text not in parts:
            parts.append(text)
    if not parts and res.get("rc") is not None:
        parts.append(f"exit code {res['rc']}")
    return " | ".join(parts)[:2000] or "failed"


class RunTracker:
    """Folds ansible-runner events into per-host results; the UI reads it as it fills."""

    def __init__(self, hosts: list[str]):
        self.hosts: dict[str, HostResult] = {h: HostResult(name=h) for h in hosts}

    def host(self, name: str) -> HostResult:
        if name not in self.hosts:
            self.hosts[name] = HostResult(name=name)
        return self.hosts[name]

    def handle(self, event: dict[str, Any]) -> None:
        kind = event.get("event", "")
        data = event.get("event_data") or {}
        if kind == "playbook_on_stats":
            self._stats(data)
            return
        name = data.get("host")
        if not name or not kind.startswith("runner_on_"):
            return
        host = self.host(name)
        host.started = True
        host.current_task = data.get("task", "") or host.current_task
        host.current_role = data.get("role", "") or ""
        res = data.get("res") or {}
        if kind == "runner_on_ok":
            host.ok += 1
            if res.get("changed"):
                host.changed += 1
                host.changes.append(
                    TaskChange(
                        data.get("task", ""),
                        data.get("role", ""),
                        _diffs(res),
                        data.get("resolved_action") or data.get("task_action") or "",
                        _details(res),
                    )
                )
            for key, value in (res.get("ansible_facts") or {}).items():
                if key.startswith(FACT_PREFIX):
                    host.facts[key] = value
        elif kind == "runner_on_failed":
            if data.get("ignore_errors"):
                host.ok += 1
                return
            host.failed += 1
            host.failures.append(
                TaskFailure(data.get("task", ""), data.get("role", ""), _message(res))
            )
        elif kind == "runner_on_skipped":
            host.skipped += 1
        elif kind == "runner_on_unreachable":
            host.unreachable = True
            host.unreachable_message = _message(res)

    def ended(self) -> None:
        """The run is over: a host whose play had started and is not in the play recap was
        stopped (a canceled run, or an ansible-playbook that died), not "ok"."""
        for host in self.hosts.values():
            host.stopped = host.started and not host.finished

    def _stats(self, data: dict[str, Any]) -> None:
        """The play recap is authoritative for counts."""
        for name in set().union(
            *(data.get(k) or {} for k in ("ok", "changed", "failures", "dark", "skipped"))
        ):
            host = self.host(name)
            host.started = host.finished = True
            host.ok = (data.get("ok") or {}).get(name, 0)
            host.changed = (data.get("changed") or {}).get(name, 0)
            host.failed = (data.get("failures") or {}).get(name, 0)
            host.skipped = (data.get("skipped") or {}).get(name, 0)
            host.unreachable = host.unreachable or bool((data.get("dark") or {}).get(name))


def _diffs(res: dict[str, Any]) -> list[dict[str, Any]]:
    diff = res.get("diff")
    if not diff:
        return []
    return diff if isinstance(diff, list) else [diff]


_DETAIL_KEYS = (
    *("dest", "path", "name", "state", "enabled", "stdout", "msg", "item", "before", "after"),
    "mig",  # the nvidia_mig module's document: its check mode says what would change
    "files",  # gpustack_apt_source: every file the source's change writes or removes
    "would_restart",  # gpustack_restart in check mode (uninstall's restarts)
    "changes",  # gpustack_state_files, gpustack_apt_install: each file it writes, {path, action}
    "holds",  # gpustack_apt_install: the holds its call sets, as {item, before, after}
    "recorded",  # gpustack_apt_install: it writes the record of the packages installed before
)


def _details(res: dict[str, Any]) -> dict[str, Any]:
    """The parts of a changed task's result that say what changed (packages, files, services)."""
    details = {k: res[k] for k in _DETAIL_KEYS if k in res and res[k] not in (None, "")}
    if not isinstance(details.get("files"), list):  # paths only (gpustack_reads' are contents)
        details.pop("files", None)
    if not isinstance(details.get("changes"), list):
        details.pop("changes", None)
    if isinstance(res.get("results"), list):  # a loop: keep the items that changed
        details["items"] = [
            {k: item[k] for k in _DETAIL_KEYS if k in item and item[k] not in (None, "")}
            for item in res["results"]
            if isinstance(item, dict) and item.get("changed")
        ]
    elif isinstance(res.get("items"), list):  # one call for many (gpustack_dpkg_selections)
        details["items"] = [
            {k: item[k] for k in _DETAIL_KEYS if k in item and item[k] not in (None, "")}
            for item in res["items"]
            if isinstance(item, dict)
        ]
    return details


def host_to_dict(host: HostResult) -> dict[str, Any]:
    data = asdict(host)
    data["status"] = host.status
    for key in ("current_role", "current_task", "started", "finished", "stopped"):
        data.pop(key)
    return data
