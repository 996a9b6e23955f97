"""Everything users see: live progress, result tables, JSON documents, errors."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from gpustack import credentials, paths
from gpustack.ansible.results import RunResult, RunTracker, host_to_dict
from gpustack.errors import BadInput, GpustackError
from gpustack.fleet import doctor


def _console(stderr: bool = False) -> Console:
    probe = Console(stderr=stderr)
    # Pipes and CI logs get wide tables rather than 80 folded columns.
    return Console(stderr=stderr, highlight=False, width=None if probe.is_terminal else 200)


stdout = _console()
stderr = _console(stderr=True)


def print_error(error: GpustackError) -> None:
    # soft_wrap: one line each, however long (scripts and tests read them line by line)
    message, hint = credentials.scrub(error.message), credentials.scrub(error.hint)
    hint = paths.resolve_doc_references(hint)
    stderr.print(f"[bold red]Error:[/] {escape(message)}", soft_wrap=True)
    if hint:
        stderr.print(f"[bold]Hint:[/] {escape(hint)}", soft_wrap=True)


def confirm(question: str) -> bool:
    """A yes/no question on the terminal; anything but y/yes (or end of input) is no."""
    try:
        answer = input(f"{question} [y/N] ")
    except EOFError:
        return False
    return answer.strip().lower() in ("y", "yes")


def emit(doc: dict[str, Any], report: str | None, output: str, text=None) -> None:
    """A command's document: to --report (in text mode too), then JSON or the text view."""
    write_report(report, doc)
    if output == "json":
        print_json(doc)
    elif text:
        text()


class LiveView:
    """A live view on stderr while it is a terminal (none otherwise), as a context manager."""

    def __init__(self, **live_options):
        self.live: Live | None = None
        if stderr.is_terminal:
            self.live = Live(console=stderr, transient=True, **live_options)

    def __enter__(self):
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live:
            self.live.__exit__(*exc)


class LiveProgress(LiveView):
    """One line per host: current role/task and ok/changed/failed counts (on stderr)."""

    def __init__(self, title: str, verbose: int = 0):
        super().__init__(refresh_per_second=8)
        self.title = title
        self.verbose = verbose

    def update(self, tracker: RunTracker, event: dict) -> None:
        if self.verbose:
            self._log(event)
        if self.live:
            self.live.update(self._table(tracker))

    def _table(self, tracker: RunTracker) -> Table:
        table = Table(title=self.title, title_justify="left", box=None)
        for col in ("host", "role / task", "ok", "changed", "failed"):
            table.add_column(col)
        for host in tracker.hosts.values():
            task = (
                f"{host.current_role} : {host.current_task}"
                if host.current_role
                else (host.current_task or "waiting")
            )
            if host.unreachable:
                task = "[red]unreachable[/]"
            table.add_row(
                host.name,
                escape(task) if not host.unreachable else task,
                str(host.ok),
                str(host.changed),
                str(host.failed),
            )
        return table

    def _log(self, event: dict) -> None:
        data = event.get("event_data") or {}
        kind = event.get("event", "")
        if kind in (
            "runner_on_ok",
            "runner_on_failed",
            "runner_on_unreachable",
            "runner_on_skipped",
        ):
            state = kind.removeprefix("runner_on_")
            if state == "ok" and (data.get("res") or {}).get("changed"):
                state = "changed"
            line = f"{data.get('host', '')} | {data.get('task', '')} | {state}"
            stderr.print(escape(credentials.scrub(line)))


def run_document(
    command: str, result: RunResult, extra: dict[str, Any] | None = None
) -> dict[str, Any]:
    doc = {
        "command": command,
        "status": result.status,
        "exit_code": int(result.exit_code),
        "artifacts": result.artifacts_dir,
        "hosts": {name: host_to_dict(h) for name, h in result.hosts.items()},
        "summary": result.summary(),
    }
    doc.update(extra or {})
    return doc


def write_report(path: str | None, doc: dict[str, Any]) -> None:
    if not path:
        return
    target = Path(path).expanduser()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(_json(doc), encoding="utf-8")
    except OSError as exc:
        raise BadInput(
            f"cannot write report {path}: {exc.strerror}", "choose a writable path for --report"
        ) from None


def print_unreachable(result: RunResult) -> None:
    """The hosts a table of facts has no row for: unreachable, or failed a task."""
    for host in result.hosts.values():
        if host.unreachable:
            stdout.print(f"[red]unreachable[/] {host.name}: {host.unreachable_message}")
        for failure in host.failures:
            stdout.print(f"[red]failed[/] {host.name}: {failure.task}: {failure.message}")


def print_written(title: str, written: list[Path]) -> None:
    stdout.print(title)
    for path in sorted(written):
        stdout.print(f"  {path.name}")


def print_json(doc: dict[str, Any]) -> None:
    sys.stdout.write(_json(doc))


def _json(doc: dict[str, Any]) -> str:
    """Reports and --output json never carry a secret (gpustack/credentials.py)."""
    return json.dumps(credentials.scrub_data(doc), indent=2, sort_keys=True, default=str) + "\n"


def print_run(result: RunResult, verbose: int = 0) -> None:
    table = Table(box=None, pad_edge=False)
    for col in ("host", "status", "ok", "changed", "failed", "skipped", "note"):
        table.add_column(col)
    colour = {
        "ok": "green",
        "changed": "yellow",
        "failed": "red",
        "unreachable": "red",
        "stopped": "red",
    }
    for host in result.hosts.values():
        note = ""
        if host.unreachable:
            note = host.unreachable_message
        elif host.failures:
            first = host.failures[-1]  # the final one; earlier ones may have been rescued
            note = f"{first.task}: {first.message}"
        elif host.stopped:
            note = f"stopped during: {host.current_task}" if host.current_task else "stopped"
        elif host.converged:
            note = "converged (fast path)"
        status = host.status
        table.add_row(
            host.name,
            f"[{colour.get(status, 'white')}]{status}[/]",
            str(host.ok),
            str(host.changed),
            str(host.failed),
            str(host.skipped),
            escape(one_line(credentials.scrub(note), 160 if not verbose else 2000)),
        )
    stdout.print(table)
    for host in result.hosts.values():  # said plainly: gpustack repaired the host's dpkg
        recovery = host.facts.get("gpustack_dpkg_recovery") or {}
        if recovery.get("message"):
            colour = "yellow" if recovery.get("recovered") else "red"
            stdout.print(f"[{colour}]{escape(host.name)}: {escape(str(recovery['message']))}[/]")
    for host in result.hosts.values():  # what a role left undone on purpose, said plainly
        for note in host.facts.get("gpustack_notes") or []:
            stdout.print(f"[yellow]{escape(host.name)}: {escape(credentials.scrub(str(note)))}[/]")
    if verbose:
        for host in result.hosts.values():
            for failure in host.failures:
                text = f"{failure.role} : {failure.task}\n  {failure.message}"
                stdout.print(f"[red]{escape(host.name)}[/] {escape(credentials.scrub(text))}")
    summary = result.summary()
    stdout.print(
        f"{summary['hosts']} hosts: {summary['ok']} ok, {summary['failed']} failed, "
        f"{summary['unreachable']} unreachable, {summary['changed']} changes"
        + (f", {summary['stopped']} stopped before the end" if summary["stopped"] else "")
    )


def print_fleet(result: RunResult, problems: list[doctor.Problem] | None) -> None:
    table = Table(box=None, pad_edge=False)
    for col in (
        "host",
        "os",
        "kernel",
        "arch",
        "gpus",
        "nvswitch",
        "secure boot",
        "nouveau",
        "headers",
        "driver",
        "runtime",
        "kubelet",
    ):
        table.add_column(col)
    for host in result.hosts.values():
        pf = doctor.preflight(host.facts)
        if not pf:
            table.add_row(host.name, f"[red]{host.status}[/]", *[""] * 10)
            continue
        headers = pf.get("kernel_headers") or {}
        table.add_row(
            host.name,
            _os_label(pf.get("os") or {}),
            pf.get("kernel", "?"),
            pf.get("arch", "?"),
            doctor.gpu_summary(pf),
            "yes" if (pf.get("nvswitch") or {}).get("present") else "no",
            pf.get("secure_boot", "?"),
            "loaded" if pf.get("nouveau_loaded") else "no",
            _headers_label(headers),
            doctor.driver_state(pf),
            doctor.runtime_summary(pf),
            "yes" if (pf.get("kubelet") or {}).get("present") else "no",
        )
    stdout.print(table)
    if problems is None:
        return
    if problems:
        stdout.print("\nProblems:")
        style = {"error": "red", "warning": "yellow", "info": "cyan"}
        for p in problems:
            hint = paths.resolve_doc_references(p.hint)
            stdout.print(
                f"  [{style[p.severity]}]{p.severity:7}[/] {escape(p.host)}: "
                f"{escape(p.message)}\n          Hint: {escape(hint)}"
            )
    else:
        stdout.print("\nNo problems found.")


def _headers_label(headers: dict[str, Any]) -> str:
    if headers.get("installed"):
        return "installed"
    return {True: "available", None: "not installed"}.get(headers.get("available"), "missing")


def _os_label(osinfo: dict[str, Any]) -> str:
    return f"{osinfo.get('id', '?')} {osinfo.get('version_id') or osinfo.get('codename', '')}"


def one_line(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
