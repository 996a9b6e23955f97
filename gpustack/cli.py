"""Command definitions only: parse, call one function, leave through one error path."""

from __future__ import annotations

import functools
import inspect
import re
import signal
import sys
from typing import Annotated

import typer
from typer.core import TyperCommand

from gpustack import __version__, commands, paths
from gpustack.ansible.inventory import inventory_source
from gpustack.ansible.vault import VaultOptions
from gpustack.errors import ExitCode, GpustackError, note_sigterm
from gpustack.terminal import output

try:  # typer >= 0.26 vendors click; older releases use the click package
    from typer._click import exceptions as click_exceptions
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import exceptions as click_exceptions

HELP = {"help_option_names": ["-h", "--help"]}  # -h as ansible-playbook takes it

_TYPE_LABEL = re.compile(r" <(?:str|int|float|bool|list\[\w+\]|\w+ range)>")
_RANGE = {
    re.compile(r"\bx>=([\d.]+)"): r"\1 or more",
    re.compile(r"\b([\d.]+)<=x<=([\d.]+)"): r"\1 to \2",
}


class HelpInWords(TyperCommand):
    """A command whose --help names values in words: options carry a metavar (FILE, N, SECONDS);
    Typer still labels arguments with their Python type (`INVENTORY <str>`) and ranges as
    `x>=1`, which this drops and rewords. Docs it names are the installed files' paths."""

    def get_help(self, ctx) -> str:
        text = _TYPE_LABEL.sub("", super().get_help(ctx))
        for pattern, words in _RANGE.items():
            text = pattern.sub(words, text)
        return paths.resolve_doc_references(text)  # the installed docs, from a wheel


app = typer.Typer(
    help="Bring NVIDIA GPU nodes up and keep them current (driver, toolkit, runtime, k8s).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings=HELP,
)
lab_app = typer.Typer(
    help="A local lab of systemd nodes (podman, or one chroot node) to try gpustack on.",
    no_args_is_help=True,
    context_settings=HELP,
)
app.add_typer(lab_app, name="lab")

MAX_SECONDS = 7 * 24 * 3600  # timeouts and pauses: a week at most (also refuses inf)
MAX_NODES = 100_000  # node counts

Inventory = Annotated[
    str,
    typer.Argument(
        help="Ansible inventory (INI or YAML).", show_default=False, metavar="INVENTORY"
    ),
]
LocalOrInventory = Annotated[
    str | None,
    typer.Argument(
        help="Ansible inventory (INI or YAML); leave out with --local.",
        show_default=False,
        metavar="INVENTORY",
    ),
]
Local = Annotated[
    bool,
    typer.Option("--local", help="This machine, no SSH (localhost ansible_connection=local)."),
]
Limit = Annotated[
    str | None, typer.Option("--limit", "-l", help="Ansible host pattern.", metavar="PATTERN")
]
ExtraVars = Annotated[
    list[str] | None,
    typer.Option(
        "--extra-vars",
        "-e",
        help="As ansible-playbook: KEY=VALUE [KEY=VALUE...], @file.yml or a YAML/JSON mapping; "
        "repeatable.",
        metavar="VARS",
    ),
]
VaultPasswordFile = Annotated[
    list[str] | None,
    typer.Option(
        "--vault-password-file",
        help="Vault password file (or script), as ansible-playbook; repeatable.",
        metavar="FILE",
    ),
]
VaultId = Annotated[
    list[str] | None,
    typer.Option(
        "--vault-id", help="Vault identity ID@FILE or ID@prompt; repeatable.", metavar="ID"
    ),
]
AskVaultPass = Annotated[
    bool, typer.Option("--ask-vault-pass", "-J", help="Ask for the vault password.")
]
Tags = Annotated[
    str, typer.Option("--tags", "-t", help="Only tasks with these tags.", metavar="TAGS")
]
SkipTags = Annotated[
    str, typer.Option("--skip-tags", help="Skip tasks with these tags.", metavar="TAGS")
]
Kubeconfig = Annotated[
    str | None,
    typer.Option(
        "--kubeconfig",
        help="Kubeconfig for the Kubernetes side (default: $KUBECONFIG).",
        metavar="FILE",
    ),
]
Output = Annotated[str, typer.Option("--output", "-o", help="text or json.", metavar="FORMAT")]
Report = Annotated[
    str | None, typer.Option("--report", help="Write a JSON report to FILE.", metavar="FILE")
]
Verbose = Annotated[int, typer.Option("--verbose", "-v", count=True, help="More detail.")]
Forks = Annotated[
    int | None,
    typer.Option(
        "--forks",
        "-f",
        min=1,
        max=1000,
        metavar="N",
        help="Hosts a playbook works on at once (ansible-playbook -f); default: all, up to 50.",
    ),
]
Full = Annotated[
    bool,
    typer.Option("--full", help="Run the whole play on every host (no converged-host fast path)."),
]
# Options of the commands that evict GPU pods (upgrade, mig).
Force = Annotated[bool, typer.Option("--force", help="Also evict GPU pods no controller manages.")]
DeleteEmptyDirData = Annotated[
    bool,
    typer.Option(
        "--delete-emptydir-data",
        help="Also evict pods with emptyDir volumes (their data is lost), as kubectl drain.",
    ),
]
PodDeletionTimeout = Annotated[
    float,
    typer.Option(
        "--pod-deletion-timeout",
        min=1,
        max=MAX_SECONDS,
        metavar="SECONDS",
        help="Seconds to evict GPU pods.",
    ),
]
Wait = Annotated[
    bool,
    typer.Option(
        "--wait",
        help="If another gpustack run is changing these hosts, wait for it (default: refuse).",
    ),
]
Junit = Annotated[
    str | None,
    typer.Option(
        "--junit", help="Write JUnit XML (one testcase per host per check).", metavar="FILE"
    ),
]


# Options every host command takes, appended to each one's own by @host_command.
COMMON_OPTIONS = {
    "limit": (Limit, None),
    "extra_vars": (ExtraVars, None),
    "output_": (Output, "text"),
    "report": (Report, None),
    "verbose": (Verbose, 0),
    "forks": (Forks, None),
    "vault_password_file": (VaultPasswordFile, None),
    "vault_id": (VaultId, None),
    "ask_vault_pass": (AskVaultPass, False),
}


def _vault(common: dict) -> VaultOptions:
    files, ids = common.get("vault_password_file") or (), common.get("vault_id") or ()
    return VaultOptions(tuple(files), tuple(ids), bool(common.get("ask_vault_pass")))


def host_command(fn):
    """Register `fn(own options..., **common)` as a command that also takes COMMON_OPTIONS; they
    reach it in `common`. Typer reads the parameters from the signature given here."""
    sig = inspect.signature(fn, eval_str=True)
    own = [p for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]
    keyword = inspect.Parameter.KEYWORD_ONLY
    shared = [inspect.Parameter(name, keyword, annotation=kind, default=value)
              for name, (kind, value) in COMMON_OPTIONS.items()]  # fmt: skip

    @functools.wraps(fn)
    def command(**options):
        return fn(**options)

    del command.__wrapped__  # typer must see the signature below, not fn's
    command.__signature__ = sig.replace(parameters=own + shared)
    return app.command(fn.__name__, cls=HelpInWords)(command)


def _opts(inventory, local=False, tags="", skip_tags="", kubeconfig=None, wait=False, common=None,
          **_own) -> commands.HostOptions:  # fmt: skip
    """The HostOptions of a host command, from its parameters: `_opts(**locals())` (options of
    the command's own are passed on by the command itself)."""
    c = common or {}
    return commands.HostOptions(
        inventory_source(inventory, local), c["limit"], c["extra_vars"] or [], tags, skip_tags,
        kubeconfig, c["output_"], c["report"], c["verbose"], wait, c["forks"], _vault(c),
    )  # fmt: skip


def _exit(code: int) -> None:
    raise typer.Exit(code)


@host_command
def install(
    inventory: LocalOrInventory = None,
    local: Local = False,
    check: Annotated[
        bool, typer.Option("--check", help="Change nothing; report what would change.")
    ] = False,
    diff: Annotated[bool, typer.Option("--diff", help="Show file differences.")] = False,
    tags: Tags = "",
    skip_tags: SkipTags = "",
    kubeconfig: Kubeconfig = None,
    junit: Junit = None,
    full: Full = False,
    wait: Wait = False,
    **common,
) -> None:
    """Install the GPU host stack on every target host; with a kubeconfig, the Kubernetes side."""
    _exit(commands.install(_opts(**locals()), check=check, diff=diff, junit=junit, full=full))


@host_command
def plan(
    inventory: LocalOrInventory = None,
    local: Local = False,
    tags: Tags = "",
    skip_tags: SkipTags = "",
    kubeconfig: Kubeconfig = None,
    full: Full = False,
    **common,
) -> None:
    """Show what install would change (check + diff); change nothing."""
    _exit(commands.plan(_opts(**locals()), full=full))


@host_command
def doctor(inventory: LocalOrInventory = None, local: Local = False, **common) -> None:
    """Read every host (read-only) and list problems with hints."""
    _exit(commands.doctor_cmd(_opts(**locals())))


@host_command
def status(
    inventory: LocalOrInventory = None,
    local: Local = False,
    kubeconfig: Kubeconfig = None,
    **common,
) -> None:
    """One row per node: OS, GPUs, driver, runtime (read-only)."""
    _exit(commands.status(_opts(**locals())))


@host_command
def verify(
    inventory: LocalOrInventory = None,
    local: Local = False,
    kubeconfig: Kubeconfig = None,
    junit: Junit = None,
    **common,
) -> None:
    """Check every GPU node end to end: host facts (read-only), capacity, a GPU pod, metrics."""
    _exit(commands.verify(_opts(**locals()), junit=junit))


@host_command
def smoke(
    inventory: LocalOrInventory = None,
    local: Local = False,
    image: Annotated[
        str | None,
        typer.Option(
            "--image", metavar="IMAGE", help="Local image for the container check (none: skip it)."
        ),
    ] = None,
    capture: Annotated[
        str | None,
        typer.Option("--capture", help="Write masked tool outputs under DIR.", metavar="DIR"),
    ] = None,
    **common,
) -> None:
    """Read-only smoke suite of each GPU host with NVIDIA's own tools (docs/gpu-hosts.md)."""
    _exit(commands.smoke(_opts(**locals()), image=image, capture=capture))


@host_command
def upgrade(
    inventory: Inventory,
    driver_version: Annotated[
        str,
        typer.Option(
            "--driver-version", metavar="VERSION", help="Exact driver package version to roll out."
        ),
    ] = "",
    driver_branch: Annotated[
        str,
        typer.Option(
            "--driver-branch", metavar="BRANCH", help="Or: the newest version of this branch."
        ),
    ] = "",
    max_unavailable: Annotated[
        str,
        typer.Option(
            "--max-unavailable", metavar="N|P%", help="Nodes out of service at once: N or P%."
        ),
    ] = "25%",
    max_parallel: Annotated[
        int,
        typer.Option(
            "--max-parallel", min=1, max=MAX_NODES, metavar="N", help="Nodes upgraded at once."
        ),
    ] = 1,
    canary: Annotated[
        int,
        typer.Option(
            "--canary", min=0, max=MAX_NODES, metavar="N", help="First batch size; then pause."
        ),
    ] = 0,
    canary_pause: Annotated[
        float,
        typer.Option(
            "--canary-pause",
            min=0,
            max=MAX_SECONDS,
            metavar="SECONDS",
            help="Seconds to wait after the canary.",
        ),
    ] = 0,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Continue without asking.")] = False,
    drain: Annotated[
        bool, typer.Option("--drain/--no-drain", help="Drain all pods (default: GPU pods only).")
    ] = False,
    pod_selector: Annotated[
        str,
        typer.Option(
            "--wait-for-jobs",
            metavar="SELECTOR",
            help="Wait for pods matching this label selector.",
        ),
    ] = "",
    wait_for_jobs_timeout: Annotated[
        float,
        typer.Option(
            "--wait-for-jobs-timeout",
            min=0,
            max=MAX_SECONDS,
            metavar="SECONDS",
            help="Seconds; 0: no limit.",
        ),
    ] = 0,
    pod_deletion_timeout: PodDeletionTimeout = 300,
    force: Force = False,
    delete_emptydir_data: DeleteEmptyDirData = False,
    drain_pod_selector: Annotated[
        str,
        typer.Option(
            "--pod-selector",
            metavar="SELECTOR",
            help="With --drain: drain only pods matching this label selector, as kubectl "
            "drain (GPU pods always leave).",
        ),
    ] = "",
    drain_timeout: Annotated[
        float,
        typer.Option(
            "--drain-timeout",
            min=1,
            max=MAX_SECONDS,
            metavar="SECONDS",
            help="Seconds to drain a node.",
        ),
    ] = 300,
    validation_timeout: Annotated[
        float,
        typer.Option(
            "--validation-timeout",
            min=1,
            max=MAX_SECONDS,
            metavar="SECONDS",
            help="Seconds to validate a node.",
        ),
    ] = 600,
    max_failures: Annotated[
        int,
        typer.Option(
            "--max-failures",
            min=0,
            max=MAX_NODES,
            metavar="N",
            help="Failed nodes tolerated before stopping.",
        ),
    ] = 0,
    resume: Annotated[
        bool, typer.Option("--resume", help="Continue the recorded upgrade.")
    ] = False,
    retry_failed: Annotated[
        bool, typer.Option("--retry-failed", help="With --resume: retry failed nodes.")
    ] = False,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the batch plan; change nothing.")
    ] = False,
    kubeconfig: Kubeconfig = None,
    wait: Wait = False,
    **common,
) -> None:
    """Rolling, drain-aware, resumable driver upgrade of the fleet (docs/upgrade.md)."""
    from gpustack.upgrade.command import UpgradeOptions, run_upgrade

    options = UpgradeOptions(
        inventory, driver_version, driver_branch, max_unavailable, max_parallel, canary,
        canary_pause, yes, drain, pod_selector, wait_for_jobs_timeout, pod_deletion_timeout,
        force, drain_timeout, validation_timeout, max_failures, resume, retry_failed, dry_run,
        kubeconfig, common["limit"], common["extra_vars"], common["output_"], common["report"],
        common["verbose"], wait, common["forks"], _vault(common),
        delete_emptydir_data=delete_emptydir_data, drain_pod_selector=drain_pod_selector,
    )  # fmt: skip
    _exit(run_upgrade(options))


@host_command
def mig(
    inventory: Inventory,
    reboot: Annotated[
        bool, typer.Option("--reboot", help="Reboot a node whose MIG mode change needs it.")
    ] = False,
    force: Force = False,
    delete_emptydir_data: DeleteEmptyDirData = False,
    pod_deletion_timeout: PodDeletionTimeout = 300,
    validation_timeout: Annotated[
        float,
        typer.Option(
            "--validation-timeout",
            min=1,
            max=MAX_SECONDS,
            metavar="SECONDS",
            help="Seconds for the new resources.",
        ),
    ] = 600,
    kubeconfig: Kubeconfig = None,
    wait: Wait = False,
    **common,
) -> None:
    """Apply each node's MIG layout from its nvidia.com/mig.config label (docs/mig.md)."""
    from gpustack.mig.command import run_mig
    from gpustack.upgrade.backend import StepOptions

    steps = StepOptions(force=force, delete_emptydir_data=delete_emptydir_data,
                        pod_deletion_timeout=pod_deletion_timeout,
                        validation_timeout=validation_timeout)  # fmt: skip
    _exit(run_mig(_opts(**locals()), steps, reboot=reboot))


@host_command
def uninstall(
    inventory: LocalOrInventory = None,
    local: Local = False,
    components: Annotated[
        str,
        typer.Option(
            "--components",
            metavar="LIST",
            help="Comma-separated: driver, toolkit, runtime, mig, k8s (driver includes mig).",
        ),
    ] = "driver",
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    check: Annotated[
        bool,
        typer.Option("--check", help="Change nothing; show what would be removed or restored."),
    ] = False,
    kubeconfig: Kubeconfig = None,
    wait: Wait = False,
    **common,
) -> None:
    """Remove what gpustack installed, in reverse lifecycle order."""
    _exit(commands.uninstall(_opts(**locals()), components, yes, check))


@app.command(cls=HelpInWords)
def manifests(
    inventory: Inventory,
    output_dir: Annotated[
        str,
        typer.Option(
            "--output-dir",
            "-d",
            metavar="DIR",
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
    vault_password_file: VaultPasswordFile = None,
    vault_id: VaultId = None,
    ask_vault_pass: AskVaultPass = False,
) -> None:
    """Write the Kubernetes manifests gpustack would apply, as YAML files; contact no cluster."""
    vault = _vault(locals())
    _exit(commands.manifests(inventory, output_dir, servicemonitor, limit, extra_vars or [], vault))


@lab_app.command("up", cls=HelpInWords)
def lab_up(
    name: Annotated[str, typer.Option("--name", metavar="NAME", help="Lab name.")] = "lab",
    nodes: Annotated[
        int | None,
        typer.Option("--nodes", min=1, max=16, metavar="N", help="2 podman nodes; 1 chroot node."),
    ] = None,
    os_: Annotated[
        str,
        typer.Option(
            "--os",
            metavar="OS",
            help="debian12, debian13, forky; comma-separated to mix (assigned in turn).",
        ),
    ] = "debian12",
    inventory: Annotated[
        str | None,
        typer.Option("--inventory", metavar="FILE", help="Where to write the inventory."),
    ] = None,
    kubernetes: Annotated[
        bool,
        typer.Option(
            "--kubernetes",
            help="Also run a real Kubernetes: a control plane on this machine and a kubelet "
            "on every node (built from Go modules once; docs/lab.md).",
        ),
    ] = False,
    boot: Annotated[
        str,
        typer.Option(
            "--boot",
            metavar="KIND",
            help="podman: podman systemd nodes; chroot: one node booted with systemd as PID 1 in "
            "namespaces of its own, for hosts without systemd (docs/lab.md).",
        ),
    ] = "podman",
    rootfs: Annotated[
        str | None,
        typer.Option(
            "--rootfs",
            metavar="PATH",
            help="chroot: the node's root filesystem (a directory or a .tar.xz from "
            "`gpustack lab rootfs --pack`); default: built here with debootstrap.",
        ),
    ] = None,
    bind: Annotated[
        list[str] | None,
        typer.Option(
            "--bind", metavar="SRC:DEST", help="chroot: SRC:DEST[:ro|rw] also mounted in the node."
        ),
    ] = None,
) -> None:
    """Start (or reuse) N systemd nodes reachable by SSH; write an inventory."""
    from gpustack.lab import nodes as lab

    count = nodes or (1 if boot == "chroot" else 2)
    path = lab.up(name, count, os_, inventory, kubernetes=kubernetes, boot=boot,
                  rootfs_source=rootfs, binds=bind)  # fmt: skip
    output.stdout.print(f"Lab {name}: {count} node(s) up. Inventory: {path}")
    if kubernetes:
        kubeconfig = lab.kubeconfig_path(name)
        output.stdout.print(f"Kubeconfig: {kubeconfig}")


@lab_app.command("components")
def lab_components(
    build: Annotated[
        bool, typer.Option("--build", help="Build the components that are not cached yet.")
    ] = False,
) -> None:
    """The Kubernetes components the lab runs: pinned versions, cache, build figures."""
    from gpustack.lab import components

    for row in components.describe(build, log=output.stdout.print):
        where = row["cached"] or "not built (gpustack lab components --build)"
        figures = ""
        if row["cached"]:
            sizes = ", ".join(f"{k} {v} MiB" for k, v in row["sizes_mib"].items())
            figures = (
                f" — built in {row['build_seconds']} s, peak {row['peak_rss_mib']} MiB; {sizes}"
            )
        output.stdout.print(f"{row['component']} v{row['version']} ({row['go']}): {where}{figures}")


@lab_app.command("down", cls=HelpInWords)
def lab_down(
    name: Annotated[str, typer.Option("--name", metavar="NAME", help="Lab name.")] = "lab",
    images: Annotated[
        bool, typer.Option("--images", help="Also remove the cached node images.")
    ] = False,
) -> None:
    """Remove the lab's containers, key and inventory."""
    from gpustack.lab import nodes as lab

    lab.down(name, images)
    output.stdout.print(f"Lab {name} removed.")


@lab_app.command("rootfs", cls=HelpInWords)
def lab_rootfs(
    directory: Annotated[
        str, typer.Argument(help="Where the root filesystem goes (built there once).")
    ],
    os_: Annotated[str, typer.Option("--os", help="debian12 or debian13.")] = "debian12",
    pack: Annotated[
        str | None, typer.Option("--pack", help="Then pack it with tar + xz into this file.")
    ] = None,
) -> None:
    """Build a chroot node's root filesystem (debootstrap; cached), optionally pack it."""
    from gpustack.lab import nodes as lab

    for line in lab.build_rootfs(directory, os_, pack):
        output.stdout.print(line)


@lab_app.command("list", cls=HelpInWords)
def lab_list() -> None:
    """List labs and their nodes."""
    from gpustack.lab import nodes as lab

    for row in lab.list_labs():
        output.stdout.print(row)


@app.callback(invoke_without_command=True)
def _root(
    version: Annotated[bool, typer.Option("--version", help="Print the version.")] = False,
) -> None:
    if version:
        output.stdout.print(f"gpustack {__version__}")
        raise typer.Exit(0)


class Terminated(KeyboardInterrupt):
    """SIGTERM: stops a run exactly as Ctrl-C does (children stopped, report), exit 143."""


_TERM = {"seen": False}


def _on_sigterm(signum, frame) -> None:
    if _TERM["seen"]:
        return  # the run is stopping already; a second SIGTERM must not cut its report short
    _TERM["seen"] = True
    note_sigterm()
    raise Terminated()


def main(argv: list[str] | None = None) -> int:
    """Entry point: every predictable failure leaves here as Error + Hint + exit code."""
    terminated = said = False
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        code = app(args=argv, standalone_mode=False)
    except Terminated:
        output.stderr.print("Terminated (SIGTERM).")
        said = True
        code = int(ExitCode.TERMINATED)
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
    finally:
        terminated = _TERM["seen"]
        signal.signal(signal.SIGTERM, previous)
    code = 0 if code is None else int(code)
    if terminated and code in (ExitCode.CANCELED, ExitCode.TERMINATED):
        if not said:  # stopped inside a command: say why, as Ctrl-C's report does
            output.stderr.print("Terminated (SIGTERM).")
        code = int(ExitCode.TERMINATED)
    if argv is None:
        sys.exit(code)
    return code
