"""The per-node verification table (rich, in gpustack/terminal/output.py's style)."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from gpustack.k8s.cluster.flow import ClusterReport
from gpustack.terminal import output

CELL = {"passed": "[green]ok[/]", "failed": "[red]failed[/]", "skipped": "[yellow]skipped[/]"}


def print_cluster(report: ClusterReport, verbose: int = 0) -> None:
    out = output.stdout
    out.print(f"\nKubernetes {escape(report.version)} at {escape(report.server)}")
    if report.gpu_allocation not in ("", "device-plugin"):  # dra, hami or volcano: say which
        out.print(f"GPU allocation: {escape(report.gpu_allocation)}")
    if report.applied:
        counts: dict[str, int] = {}
        for item in report.applied:
            counts[item.action] = counts.get(item.action, 0) + 1
        summary = ", ".join(f"{n} {action}" for action, n in counts.items())
        out.print(f"Applied {len(report.applied)} object(s): {summary}")
        if verbose:
            for item in report.applied:
                out.print(f"  {escape(item.action):12} {escape(item.ref)}")
    for ref in report.removed:  # gpustack's, no longer rendered by the current settings
        verb = "would remove" if report.check_mode else "removed"
        out.print(f"{verb} {escape(ref)} (not in the current settings)")
    for node, labels in report.labels.items():
        shown = ", ".join(f"{k}={v}" if v is not None else f"-{k}" for k, v in labels.items())
        verb = "would label" if report.check_mode else "labelled"
        out.print(f"{verb} {escape(node)}: {escape(shown)}")
    for ds in report.daemonsets:
        if not ds.ready:
            out.print(f"[red]{ds.kind} {escape(ds.name)}[/] {escape(ds.message)}")
    if report.check_mode or not report.nodes:
        return
    names = []
    for node in report.nodes:
        for check in node.checks:
            if check.name not in names:
                names.append(check.name)
    table = Table(box=None, pad_edge=False)
    for col in ("host", "node", "host gpus", *names[1:], "result", "note"):
        table.add_column(col)
    for node in report.nodes:
        cells = {c.name: CELL.get(c.status, c.status) for c in node.checks}
        failed = [c for c in node.checks if c.status == "failed"]
        skipped = [c for c in node.checks if c.status == "skipped"]
        note = failed[0].message if failed else (skipped[0].message if skipped else "")
        table.add_row(
            escape(node.host),
            escape(node.node),
            str(node.gpus),
            *[cells.get(name, "-") for name in names[1:]],
            "[green]passed[/]" if node.passed else "[red]FAILED[/]",
            escape(output.one_line(note, 2000 if verbose else 160)),
        )
    out.print(table)
    bad = sum(1 for n in report.nodes if not n.passed)
    out.print(
        f"{len(report.nodes)} node(s): {len(report.nodes) - bad} passed, {bad} failed verification"
    )


def print_removed(removed: dict, verbose: int = 0) -> None:
    """What `uninstall --components k8s` deleted, and what it kept."""
    output.stdout.print(
        f"Kubernetes: deleted {len(removed['deleted'])} object(s), removed gpustack's "
        f"labels from {len(removed['unlabelled_nodes'])} node(s)"
    )
    for ref in removed["deleted"] if verbose else []:
        output.stdout.print(f"  deleted {ref}")
    for ref in removed["kept"]:
        output.stdout.print(f"  kept {ref}")
