"""Text views of `gpustack status` (one row per node, drift named) and `gpustack plan`."""

from __future__ import annotations

import textwrap

from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gpustack.fleet.plan_summary import HostPlan
from gpustack.fleet.status import NodeStatus
from gpustack.terminal.output import stdout


def _k(value) -> str:
    return "—" if value in (None, "") else str(value)


def _loaded(row: NodeStatus) -> str:
    if row.driver.get("loaded") or not row.driver.get("installed"):
        return _k(row.driver.get("loaded"))
    return "not loaded" if row.gpu_count else "not loaded: no NVIDIA device"


DEFAULT_WIDTH = 120  # `gpustack status` fits a 120-column terminal; -o wide shows everything


def _runtime(row: NodeStatus) -> str:
    runtime = row.runtime.get("kind") or "none"
    if row.runtime.get("kind"):
        runtime += " wired" if row.runtime.get("wired") else " [red]not wired[/]"
    if row.runtime.get("restart_needed"):
        runtime += " [red]restart[/]"
    return runtime


def _loaded_short(row: NodeStatus) -> str:
    text = _loaded(row)
    return "no NVIDIA device" if text == "not loaded: no NVIDIA device" else text


def _drift(row: NodeStatus, wide: bool) -> str:
    if not row.drift:
        return "[green]none[/]"
    if wide:
        return f"[red]{escape('; '.join(row.drift))}[/]"
    count = f"{len(row.drift)}: " if len(row.drift) > 1 else ""
    return f"[red]{escape(count + '; '.join(row.drift))}[/]"


def _wide_columns(kubernetes: bool) -> list[str]:
    columns = ["host", "os", "kernel", "gpus", "driver installed", "loaded", "desired",
               "companions", "toolkit", "toolkit desired", "runtime", "reboot"]  # fmt: skip
    if kubernetes:
        columns += ["k8s node", "nvidia.com/gpu", "device plugin"]
    return [*columns, "upgrade", "drift"]


def _wide_cells(row: NodeStatus, kubernetes: bool) -> list[str]:
    companions = row.driver.get("companions") or {}
    mismatched = [n for n, c in companions.items() if not c.get("ok")]
    cells = [
        escape(row.host), escape(row.os), escape(row.kernel), escape(row.gpus),
        escape(_k(row.driver.get("installed"))), escape(_loaded(row)),
        escape(_k(row.driver.get("desired"))),
        (f"[red]{escape(', '.join(mismatched))}[/]" if mismatched
         else ("ok" if companions else "—")),
        escape(_k(row.toolkit.get("installed"))), escape(_k(row.toolkit.get("desired"))),
        _runtime(row), "[yellow]yes[/]" if row.reboot_required else "no",
    ]  # fmt: skip
    if kubernetes:
        k8s = row.kubernetes or {}
        ready = k8s.get("device_plugin_ready")
        cells += [
            escape(_k(k8s.get("node"))),
            escape(_k(k8s.get("allocatable_gpus"))),
            "—" if ready is None else ("ready" if ready else "[red]not ready[/]"),
        ]
    return [*cells, escape(_k(row.upgrade_state)), _drift(row, wide=True)]


def _short_cells(row: NodeStatus, kubernetes: bool, upgrade: bool) -> list[str]:
    loaded = escape(_loaded_short(row))
    if row.reboot_required:
        loaded += " [yellow](reboot)[/]"
    kind = row.runtime.get("kind") or "none"
    runtime = escape(kind)
    if row.runtime.get("kind") and not row.runtime.get("wired"):
        runtime += " [red]not wired[/]"
    elif row.runtime.get("restart_needed"):
        runtime += " [red]restart[/]"
    cells = [escape(row.host), escape(_k(row.driver.get("installed"))), loaded,
             escape(_k(row.toolkit.get("installed"))), runtime]  # fmt: skip
    if kubernetes:
        cells.append(escape(_k((row.kubernetes or {}).get("allocatable_gpus"))))
    if upgrade:
        cells.append(escape(_k(row.upgrade_state)))
    return [*cells, _drift(row, wide=False)]


MIN_DRIFT = 20  # the drift column keeps at least this much; -o wide has all of it


def status_table(rows: list[NodeStatus], kubernetes: bool, wide: bool = False) -> Table:
    """The default view keeps one line per node within 120 columns (the drift cell, then long
    cells, end in …); `wide` has every column, folded rather than cut."""
    if wide:
        columns = _wide_columns(kubernetes)
        body = [
            _wide_cells(r, kubernetes) if r.reachable else _unreachable(r, len(columns))
            for r in rows
        ]
        table = Table(box=None, pad_edge=False)
        for col in columns:
            table.add_column(col, overflow="fold")
        for cells in body:
            table.add_row(*cells)
        return table
    upgrade = any(r.upgrade_state for r in rows)
    columns = ["host", "driver", "loaded", "toolkit", "runtime"]
    columns += ["gpus"] if kubernetes else []
    columns += ["upgrade"] if upgrade else []
    columns += ["drift"]
    body = [
        _short_cells(r, kubernetes, upgrade) if r.reachable else _unreachable(r, len(columns))
        for r in rows
    ]
    widths = [
        min(24, max([len(col)] + [Text.from_markup(cells[i]).cell_len for cells in body]))
        for i, col in enumerate(columns[:-1])
    ]
    padding = 2 * (len(columns) - 1)
    while sum(widths) + padding + MIN_DRIFT > DEFAULT_WIDTH and max(widths) > 8:
        widths[widths.index(max(widths))] -= 1  # the widest gives way first
    drift_width = DEFAULT_WIDTH - sum(widths) - padding
    table = Table(box=None, pad_edge=False, collapse_padding=False)
    for col, width in zip(columns, [*widths, drift_width], strict=True):
        table.add_column(col, width=width, overflow="ellipsis", no_wrap=True)
    for cells in body:
        table.add_row(
            *(_fit(cell, width) for cell, width in zip(cells, [*widths, drift_width], strict=True))
        )
    return table


def _fit(cell: str, width: int) -> Text:
    text = Text.from_markup(cell)
    text.truncate(width, overflow="ellipsis")
    return text


def _unreachable(row: NodeStatus, count: int) -> list[str]:
    return [escape(row.host), f"[red]{escape(row.error)}[/]", *[""] * (count - 2)]


def print_status(rows: list[NodeStatus], kubernetes: bool, wide: bool = False) -> None:
    stdout.print(status_table(rows, kubernetes, wide))
    for note in sorted({(r.kubernetes or {}).get("note") or "" for r in rows} - {""}):
        # e.g. GFD labels need NFD running; wrapped so the default view stays within 120 columns
        lines = textwrap.wrap(f"Note: {note}", DEFAULT_WIDTH)
        stdout.print("\n[yellow]Note:[/]" + escape("\n".join(lines))[len("Note:") :])
    for r in rows:
        for note in r.notes:  # wrapped as the note above: the default view fits 120 columns
            text = "\n".join(textwrap.wrap(f"Note: {r.host}: {note}", DEFAULT_WIDTH))
            stdout.print("[cyan]Note:[/]" + escape(text)[len("Note:") :], soft_wrap=True)
    mig = [r for r in rows if r.mig]
    if mig:
        stdout.print("\nMIG layouts:")
        for r in mig:
            held = "; ".join(r.mig["layout"]) or "no GPU"
            drift = r.mig["drift"]
            state = f"[red]{escape(drift)}[/]" if drift else "[green]as desired[/]"
            name, config = escape(r.host), escape(str(r.mig["config"]))
            stdout.print(f"  {name}: {config} — {escape(held)} — {state}", soft_wrap=True)
    drifted = [r for r in rows if r.drift]
    if drifted:
        more = "" if wide else " `-o wide` names every difference;"
        stdout.print(
            f"\nDrift on {len(drifted)} of {len(rows)} node(s).{more} `gpustack install` fixes it."
        )
    elif all(r.reachable for r in rows):
        stdout.print(f"\nNo drift on {len(rows)} node(s).")


def print_plan(
    plans: dict[str, HostPlan], verbose: int = 0, stopped: dict[str, str] | None = None
) -> None:
    """Per host: packages, holds, files (diffs with -v), services, reboots; nothing changed.
    `stopped`: hosts whose plan did not run to its end (failed, unreachable, stopped), with that
    status: what they show is the plan up to there, never "no changes"."""
    stopped = stopped or {}
    for host, plan in plans.items():
        if host in stopped:
            what = "the plan up to there" if not plan.empty() else "nothing planned before it"
            stdout.print(f"[bold]{escape(host)}[/]: [red]{stopped[host]}[/] (see below); {what}")
            if plan.empty():
                continue
        elif plan.empty():
            stdout.print(f"[bold]{escape(host)}[/]: no changes")
            continue
        else:
            stdout.print(f"[bold]{escape(host)}[/]: would change")
        sections = (
            ("install", plan.install),
            ("upgrade/downgrade", plan.upgrade),
            ("remove", plan.remove),
            ("holds", plan.holds),
            ("restart/enable", plan.services),
            ("reboot", plan.reboots),
            ("MIG layout", plan.mig),
            ("other", plan.other),
        )
        for title, items in sections:
            if items:
                stdout.print(f"  {title}:")
                for item in items:
                    stdout.print(f"    {escape(item)}")
        if plan.files:
            stdout.print("  files:")
            for entry in plan.files:
                stdout.print(f"    {escape(str(entry['path']))}")
                if verbose:
                    for diff in entry["diff"]:
                        text = diff.get("prepared") or _unified(diff)
                        if text:
                            stdout.print(escape(text), highlight=False)
    stdout.print("Nothing was changed (check mode).")


def _unified(diff: dict) -> str:
    import difflib

    before, after = diff.get("before"), diff.get("after")
    if not isinstance(before, str) or not isinstance(after, str):
        return f"      {diff.get('before', '')!s} -> {diff.get('after', '')!s}" if diff else ""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True),
        after.splitlines(keepends=True),
        diff.get("before_header", "before"),
        diff.get("after_header", "after"),
    )
    return "".join("      " + line for line in lines).rstrip()
