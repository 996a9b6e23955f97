"""Text views of `gpustack status` (one row per node, drift named) and `gpustack plan`."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from gpustack.fleet import NodeStatus
from gpustack.output import stdout
from gpustack.plan_summary import HostPlan


def _k(value) -> str:
    return "—" if value in (None, "") else str(value)


def _loaded(row: NodeStatus) -> str:
    if row.driver.get("loaded") or not row.driver.get("installed"):
        return _k(row.driver.get("loaded"))
    return "not loaded" if row.gpu_count else "not loaded: no NVIDIA device"


def print_status(rows: list[NodeStatus], kubernetes: bool) -> None:
    table = Table(box=None, pad_edge=False)
    columns = ["host", "os", "kernel", "gpus", "driver installed", "loaded", "desired",
               "toolkit", "toolkit desired", "runtime", "reboot"]  # fmt: skip
    if kubernetes:
        columns += ["k8s node", "nvidia.com/gpu", "device plugin"]
    columns += ["upgrade", "drift"]
    for col in columns:
        table.add_column(col, overflow="fold")
    for row in rows:
        if not row.reachable:
            cells = [row.host, f"[red]{escape(row.error)}[/]"] + [""] * (len(columns) - 2)
            table.add_row(*cells)
            continue
        runtime = row.runtime.get("kind") or "none"
        if row.runtime.get("kind"):
            runtime += " wired" if row.runtime.get("wired") else " [red]not wired[/]"
        cells = [
            escape(row.host),
            escape(row.os),
            escape(row.kernel),
            escape(row.gpus),
            escape(_k(row.driver.get("installed"))),
            escape(_loaded(row)),
            escape(_k(row.driver.get("desired"))),
            escape(_k(row.toolkit.get("installed"))),
            escape(_k(row.toolkit.get("desired"))),
            runtime,
            "[yellow]yes[/]" if row.reboot_required else "no",
        ]
        if kubernetes:
            k8s = row.kubernetes or {}
            ready = k8s.get("device_plugin_ready")
            cells += [
                escape(_k(k8s.get("node"))),
                escape(_k(k8s.get("allocatable_gpus"))),
                "—" if ready is None else ("ready" if ready else "[red]not ready[/]"),
            ]
        cells += [
            escape(_k(row.upgrade_state)),
            f"[red]{escape('; '.join(row.drift))}[/]" if row.drift else "[green]none[/]",
        ]
        table.add_row(*cells)
    stdout.print(table)
    for note in sorted({(r.kubernetes or {}).get("note") or "" for r in rows} - {""}):
        stdout.print(f"\n[yellow]Note:[/] {escape(note)}")  # e.g. GFD labels need NFD running
    drifted = [r for r in rows if r.drift]
    if drifted:
        stdout.print(
            f"\nDrift on {len(drifted)} of {len(rows)} node(s). "
            "`gpustack plan` shows what install would change; `gpustack install` fixes it."
        )
    elif all(r.reachable for r in rows):
        stdout.print(f"\nNo drift on {len(rows)} node(s).")


def print_plan(plans: dict[str, HostPlan], verbose: int = 0) -> None:
    """Per host: packages, holds, files (diffs with -v), services, reboots; nothing changed."""
    for host, plan in plans.items():
        if plan.empty():
            stdout.print(f"[bold]{escape(host)}[/]: no changes")
            continue
        stdout.print(f"[bold]{escape(host)}[/]: would change")
        sections = (
            ("install", plan.install),
            ("upgrade/downgrade", plan.upgrade),
            ("remove", plan.remove),
            ("holds", plan.holds),
            ("restart/enable", plan.services),
            ("reboot", plan.reboots),
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
