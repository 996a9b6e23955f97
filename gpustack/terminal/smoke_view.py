"""The smoke suite's text output: one table of checks per host, the GPUs, the verdict."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

from gpustack.smoke.model import HostSmoke
from gpustack.terminal import output

STYLE = {
    "pass": "green",
    "warn": "yellow",
    "fail": "red",
    "absent": "magenta",
    "skipped": "dim",
    "info": "cyan",
}
VERDICT = {"pass": "green", "fail": "red", "no NVIDIA device": "magenta", "not run": "red"}


def _mib(value) -> str:
    return f"{value} MiB" if value is not None else "?"


def print_smoke(hosts: list[HostSmoke], verbose: int = 0) -> None:
    console = output.stdout
    for host in hosts:
        if not host.checks:
            console.print(f"{escape(host.host)}: [red]{host.verdict}[/] - {escape(host.summary)}")
            continue
        table = Table(title=f"{host.host}", title_justify="left", box=None, pad_edge=False)
        for col in ("check", "status", "result"):
            table.add_column(col)
        for check in host.checks:
            table.add_row(
                check.name,
                f"[{STYLE.get(check.status, 'white')}]{check.status}[/]",
                escape(check.summary),
            )
        console.print(table)
        if host.gpus:
            gpus = Table(box=None, pad_edge=False)
            for col in ("gpu", "name", "uuid", "pci", "memory", "persistence", "mig", "ecc"):
                gpus.add_column(col)
            for gpu in host.gpus:
                mig = f"{gpu['mig_current']}"
                if gpu["mig_change_pending"]:
                    mig += f" → {gpu['mig_pending']}"
                if gpu["mig_devices"]:
                    mig += f" ({len(gpu['mig_devices'])} devices)"
                ecc = f"{gpu['ecc_current']}"
                if gpu["ecc_change_pending"]:
                    ecc += f" → {gpu['ecc_pending']}"
                gpus.add_row(
                    str(gpu["index"]),
                    escape(str(gpu["name"])),
                    escape(str(gpu["uuid"])),
                    escape(gpu["pci_bus_id"]),
                    _mib(gpu["memory_total_mib"]),
                    str(gpu["persistence_mode"]),
                    escape(mig),
                    escape(ecc),
                )
            console.print(gpus)
        colour = VERDICT.get(host.verdict, "white")
        console.print(
            f"{escape(host.host)}: [{colour}]{host.verdict}[/] - {escape(host.summary)}\n"
        )
