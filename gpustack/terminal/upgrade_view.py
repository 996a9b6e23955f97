"""What users see of an upgrade: a live view of batches and nodes, the summary, the JSON."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from gpustack.terminal import output
from gpustack.upgrade.state import IN_PROGRESS, Transition, UpgradeRun, UpgradeState

COLOUR = {
    UpgradeState.DONE: "green",
    UpgradeState.FAILED: "red",
    UpgradeState.REQUIRED: "white",
    "skipped": "cyan",
}
LIVE_ROWS = 20


def _colour(state: str) -> str:
    return COLOUR.get(state, "yellow")


def counts(run: UpgradeRun, targets: list[str], skipped: set[str]) -> dict[str, int]:
    out = {"nodes": len(targets), "done": 0, "failed": 0, "in_progress": 0, "pending": 0}
    out["skipped"] = 0
    for name in targets:
        state = run.nodes[name].state
        if state == UpgradeState.DONE:
            out["done"] += 1
        elif state == UpgradeState.FAILED:
            out["failed"] += 1
        elif state in IN_PROGRESS:
            out["in_progress"] += 1
        elif name in skipped:
            out["skipped"] += 1
        else:
            out["pending"] += 1
    return out


class UpgradeLive(output.LiveView):
    """A live table on stderr (terminals only); elsewhere one log line per node event."""

    def __init__(self, orchestrator, title: str, verbose: int = 0):
        self.orch = orchestrator
        self.title = title
        self.verbose = verbose
        super().__init__(get_renderable=self._render, refresh_per_second=4)

    def transition(self, t: Transition) -> None:
        """Called for every state change (under the run's lock)."""
        if self.live:
            return
        interesting = t.to_state in (
            UpgradeState.CORDON,
            UpgradeState.DONE,
            UpgradeState.FAILED,
        )
        if interesting or self.verbose:
            stamp = time.strftime("%H:%M:%S", time.localtime(t.at))
            note = f" ({t.note})" if t.note else ""
            output.stderr.print(
                f"{stamp} {escape(t.node)}: {t.from_state} → {t.to_state}{escape(note)}"
            )

    def notify(self, message: str) -> None:
        output.stderr.print(escape(message))

    def _render(self):
        try:
            return self._table()
        except RuntimeError:  # a dict changed size while a worker wrote it; next frame
            return Text("")

    def _table(self):
        run, orch = self.orch.run, self.orch
        skipped = {n for n, c in orch.conditions.items() if c.skip}
        c = counts(run, orch.targets, skipped)
        head = Text.from_markup(
            f"[bold]{escape(self.title)}[/]  batch {len(run.batches)}  "
            f"[green]{c['done']} done[/], [yellow]{c['in_progress']} in progress[/], "
            f"[red]{c['failed']} failed[/], {c['pending']} pending, {c['skipped']} skipped "
            f"of {c['nodes']}"
        )
        table = Table(box=None, pad_edge=False)
        for col in ("node", "batch", "state", "activity"):
            table.add_column(col)
        activity = dict(orch.activity)
        order = sorted(
            orch.targets,
            key=lambda n: (
                0
                if run.nodes[n].state in IN_PROGRESS
                else 1
                if run.nodes[n].state == UpgradeState.FAILED
                else 2
            ),
        )
        for name in order[:LIVE_ROWS]:
            record = run.nodes[name]
            note = activity.get(name) or record.reason
            table.add_row(
                escape(name),
                str(record.batch or ""),
                f"[{_colour(record.state)}]{record.state}[/]",
                escape(output.one_line(note, 100)),
            )
        if len(order) > LIVE_ROWS:
            table.add_row(f"… {len(order) - LIVE_ROWS} more", "", "", "")
        return Group(head, table)


def node_rows(run: UpgradeRun, targets: list[str], skipped: set[str]) -> dict[str, dict[str, Any]]:
    rows = {}
    for name in targets:
        record = run.nodes[name]
        rows[name] = {
            "state": record.state,
            "skipped": name in skipped and record.state == UpgradeState.REQUIRED,
            "reason": record.reason,
            "batch": record.batch,
            "admin_cordoned": record.admin_cordoned,
            "attempts": record.attempts,
            "started_at": record.started_at,
            "finished_at": record.finished_at,
            "driver": record.driver,
            "artifacts": record.artifacts,
        }
    return rows


def print_summary(doc: dict[str, Any]) -> None:
    table = Table(box=None, pad_edge=False)
    for col in ("node", "batch", "state", "driver", "held", "note"):
        table.add_column(col)
    for name, row in doc["nodes"].items():
        state = "skipped" if row["skipped"] else row["state"]
        note = row["reason"]
        if not note and row["admin_cordoned"]:
            note = "left cordoned (cordoned by an admin before the upgrade)"
        driver = row["driver"] or {}
        held = driver.get("held")
        table.add_row(
            escape(name),
            str(row["batch"] or ""),
            f"[{_colour(state)}]{state}[/]",
            escape(str(driver.get("installed_version") or "")),
            "" if held is None else ("yes" if held else "no"),
            escape(output.one_line(note, 160)),
        )
    output.stdout.print(table)
    s = doc["summary"]
    output.stdout.print(
        f"{s['nodes']} nodes: {s['done']} done, {s['failed']} failed, {s['pending']} pending, "
        f"{s['in_progress']} in progress, {s['skipped']} skipped "
        f"({len(doc['batches'])} batch(es) so far; state: {doc['state_file']})"
    )
    if doc.get("message"):
        output.stdout.print(escape(doc["message"]))


def print_plan(doc: dict[str, Any]) -> None:
    lim = doc["limits"]
    output.stdout.print(
        f"Upgrade plan ({doc['mode']}) to {doc['target_text']}: max-unavailable "
        f"{lim['max_unavailable']}, max-parallel {lim['max_parallel']}"
        + (f", canary {lim['canary']}" if lim["canary"] else "")
    )
    measured, total = doc.get("measured_nodes"), len(doc["nodes"])
    if measured:
        others = "" if measured == total else "; the others go first"
        output.stdout.print(
            f"  order: longest first, as measured in the last upgrade "
            f"({measured} of {total} node(s) measured{others})"
        )
    for index, batch in enumerate(doc["plan"], 1):
        output.stdout.print(f"  batch {index}: {escape(', '.join(batch))}")
    untouched = [n for n, r in doc["nodes"].items() if r["state"] == UpgradeState.DONE]
    if untouched:
        output.stdout.print(f"  already done: {escape(', '.join(untouched))}")
    skipped = [n for n, r in doc["nodes"].items() if r["skipped"]]
    if skipped:
        output.stdout.print(f"  skipped (label): {escape(', '.join(skipped))}")
    output.stdout.print("Dry run: nothing was changed.")
