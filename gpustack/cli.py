"""Command definitions only: parse, call one function, leave through one error path."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from gpustack import __version__, commands, output
from gpustack.errors import ExitCode, GpustackError, NotImplementedYet

try:  # typer >= 0.26 vendors click; older releases use the click package
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions as click_exceptions

app = typer.Typer(
    help="Bring NVIDIA GPU nodes up and keep them current (driver, toolkit, runtime, k8s).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)
lab_app = typer.Typer(
    help="A local lab of podman systemd nodes (no GPUs) to try gpustack on.", no_args_is_help=True
)
app.add_typer(lab_app, name="lab")

Inventory = Annotated[
    str, typer.Argument(help="Ansible inventory (INI or YAML).", show_default=False)
]
Limit = Annotated[str | None, typer.Option("--limit", "-l", help="Ansible host pattern.")]
ExtraVars = Annotated[
    list[str] | None,
    typer.Option("--extra-vars", "-e", help="KEY=VALUE, @file.yml or a YAML mapping; repeatable."),
]
Tags = Annotated[str, typer.Option("--tags", "-t", help="Only tasks with these tags.")]
SkipTags = Annotated[str, typer.Option("--skip-tags", help="Skip tasks with these tags.")]
Kubeconfig = Annotated[
    str | None,
    typer.Option("--kubeconfig", help="Kubeconfig for the Kubernetes side (default: $KUBECONFIG)."),
]
Output = Annotated[str, typer.Option("--output", "-o", help="text or json.")]
Report = Annotated[
    str | None, typer.Option("--report", help="Write a JSON report to FILE.", metavar="FILE")
]
Verbose = Annotated[int, typer.Option("--verbose", "-v", count=True, help="More detail.")]
Junit = Annotated[
    str | None,
    typer.Option(
        "--junit", help="Write JUnit XML (one testcase per host per check).", metavar="FILE"
    ),
]


def _opts(inventory, limit, extra_vars, tags, skip_tags, kubeconfig, output_, report, verbose):
    return commands.HostOptions(
        inventory=inventory,
        limit=limit,
        extra_vars=extra_vars or [],
        tags=tags,
        skip_tags=skip_tags,
        kubeconfig=kubeconfig,
        output=output_,
        report=report,
        verbose=verbose,
    )


def _exit(code: int) -> None:
    raise typer.Exit(code)


@app.command()
def install(
    inventory: Inventory,
    check: Annotated[
        bool, typer.Option("--check", help="Change nothing; report what would change.")
    ] = False,
    diff: Annotated[bool, typer.Option("--diff", help="Show file differences.")] = False,
    limit: Limit = None,
    extra_vars: ExtraVars = None,
    tags: Tags = "",
    skip_tags: SkipTags = "",
    kubeconfig: Kubeconfig = None,
    output_: Output = "text",
    report: Report = None,
    verbose: Verbose = 0,
    junit: Junit = None,
) -> None:
    """Install the GPU host stack on every target host; with a kubeconfig, the Kubernetes side."""
    _exit(
        commands.install(
            _opts(
                inventory, limit, extra_vars, tags, skip_tags, kubeconfig, output_, report, verbose
            ),
            check=check,
            diff=diff,
            junit=junit,
        )
    )


@app.command()
def plan(
    inventory: Inventory,
    limit: Limit = None,
    extra_vars: ExtraVars = None,
    tags: Tags = "",
    skip_tags: SkipTags = "",
    kubeconfig: Kubeconfig = None,
    output_: Output = "text",
    report: Report = None,
    verbose: Verbose = 0,
) -> None:
    """Show what install would change (check + diff); change nothing."""
    _exit(
        commands.plan(
            _opts(
                inventory, limit, extra_vars, tags, skip_tags, kubeconfig, output_, report, verbose
            )
        )
    )


@app.command()
def doctor(
    inventory: Inventory,
    limit: Limit = None,
    extra_vars: ExtraVars = None,
    output_: Output = "text",
    report: Report = None,
    verbose: Verbose = 0,
) -> None:
    """Read every host (read-only) and list problems with hints."""
    _exit(
        commands.doctor_cmd(
            _opts(inventory, limit, extra_vars, "", "", None, output_, report, verbose)
        )
    )


@app.command()
def status(
    inventory: Inventory,
    limit: Limit = None,
    extra_vars: ExtraVars = None,
    kubeconfig: Kubeconfig = None,
    output_: Output = "text",
    report: Report = None,
    verbose: Verbose = 0,
) -> None:
    """One row per node: OS, GPUs, driver, runtime (read-only)."""
    _exit(
        commands.status(
            _opts(inventory, limit, extra_vars, "", "", kubeconfig, output_, report, verbose)
        )
    )


@app.command()
def verify(
    inventory: Inventory,
    limit: Limit = None,
    extra_vars: ExtraVars = None,
    kubeconfig: Kubeconfig = None,
    output_: Output = "text",
    report: Report = None,
    verbose: Verbose = 0,
    junit: Junit = None,
) -> None:
    """Check every GPU node end to end: host facts (read-only), capacity, a GPU pod, metrics."""
    opts = _opts(inventory, limit, extra_vars, "", "", kubeconfig, output_, report, verbose)
    _exit(commands.verify(opts, junit=junit))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def upgrade(inventory: Inventory) -> None:
    """Rolling, drain-aware driver upgrade (not implemented yet)."""
    raise NotImplementedYet("upgrade", 6)


@app.command()
def uninstall(
    inventory: Inventory,
    components: Annotated[
        str,
        typer.Option("--components", help="Comma-separated: driver, toolkit, runtime, k8s."),
    ] = "driver",
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    limit: Limit = None,
    extra_vars: ExtraVars = None,
    kubeconfig: Kubeconfig = None,
    output_: Output = "text",
    report: Report = None,
    verbose: Verbose = 0,
) -> None:
    """Remove what gpustack installed, in reverse lifecycle order."""
    opts = _opts(inventory, limit, extra_vars, "", "", kubeconfig, output_, report, verbose)
    _exit(commands.uninstall(opts, components, yes))


@app.command()
def manifests(
    inventory: Inventory,
    output_dir: Annotated[
        str,
        typer.Option(
            "--output-dir",
            "-d",
            help="Directory for the YAML files (new, empty, or earlier gpustack manifests).",
            show_default=False,
        ),
    ],
    servicemonitor: Annotated[
        bool,
        typer.Option("--servicemonitor", help="Include dcgm-exporter's Prometheus ServiceMonitor."),
    ] = False,
    limit: Limit = None,
    extra_vars: ExtraVars = None,
) -> None:
    """Write the Kubernetes manifests gpustack would apply, as YAML files; contact no cluster."""
    _exit(commands.manifests(inventory, output_dir, servicemonitor, limit, extra_vars or []))


@lab_app.command("up")
def lab_up(
    name: Annotated[str, typer.Option("--name", help="Lab name.")] = "lab",
    nodes: Annotated[int, typer.Option("--nodes", min=1, max=16)] = 2,
    os_: Annotated[
        str,
        typer.Option(
            "--os", help="debian12, debian13, forky; comma-separated to mix (assigned in turn)."
        ),
    ] = "debian12",
    inventory: Annotated[
        str | None, typer.Option("--inventory", help="Where to write the inventory.")
    ] = None,
) -> None:
    """Start (or reuse) N podman systemd nodes reachable by SSH; write an inventory."""
    from gpustack import lab

    path = lab.up(name, nodes, os_, inventory)
    output.stdout.print(f"Lab {name}: {nodes} node(s) up. Inventory: {path}")


@lab_app.command("down")
def lab_down(
    name: Annotated[str, typer.Option("--name", help="Lab name.")] = "lab",
    images: Annotated[
        bool, typer.Option("--images", help="Also remove the cached node images.")
    ] = False,
) -> None:
    """Remove the lab's containers, key and inventory."""
    from gpustack import lab

    lab.down(name, images)
    output.stdout.print(f"Lab {name} removed.")


@lab_app.command("list")
def lab_list() -> None:
    """List labs and their nodes."""
    from gpustack import lab

    for row in lab.list_labs():
        output.stdout.print(row)


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version.")] = False,
) -> None:
    if version:
        output.stdout.print(f"gpustack {__version__}")
        raise typer.Exit(0)


def main(argv: list[str] | None = None) -> int:
    """Entry point: every predictable failure leaves here as Error + Hint + exit code."""
    try:
        code = app(args=argv, standalone_mode=False)
    except GpustackError as error:
        output.print_error(error)
        code = int(error.exit_code)
    except click_exceptions.NoArgsIsHelpError as error:
        output.stdout.print(error.ctx.get_help() if error.ctx else "", markup=False)
        code = int(ExitCode.OK)
    except click_exceptions.UsageError as error:
        command = error.ctx.command_path if error.ctx else "gpustack"
        output.print_error(
            GpustackError(error.format_message(), f"see `{command} --help`", ExitCode.BAD_INPUT)
        )
        code = int(ExitCode.BAD_INPUT)
    except typer.Abort:
        output.stderr.print("Canceled.")
        code = int(ExitCode.CANCELED)
    except KeyboardInterrupt:
        output.stderr.print("Canceled.")
        code = int(ExitCode.CANCELED)
    code = 0 if code is None else int(code)
    if argv is None:
        sys.exit(code)
    return code
