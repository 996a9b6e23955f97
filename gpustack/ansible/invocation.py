"""One validated invocation per command: every input checked once, before any host is contacted.

A command's options become one `Invocation` — the inventory (parsed once; its variables resolved
once, see inventory.resolved_vars), the extra variables (GPUSTACK_* credentials, then -e) checked
against the roles' argument specs and formats, the inventory's own role inputs checked the same
way, and the kubeconfig. Mistakes leave as BadInput (Error + Hint, exit 2).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from gpustack import credentials
from gpustack.ansible import vault
from gpustack.ansible.extravars import parse_extra_vars
from gpustack.ansible.input_formats import check_extra_vars
from gpustack.ansible.input_specs import check_host_vars, check_inputs
from gpustack.ansible.inventory import Inventory, load_inventory
from gpustack.errors import BadInput

OUTPUTS = ("text", "json")
KUBECONFIG_HINT = "pass the path of a kubeconfig file, or leave --kubeconfig out"


@dataclass
class HostOptions:
    """Options shared by every command that runs on hosts."""

    inventory: str
    limit: str | None = None
    extra_vars: list[str] = field(default_factory=list)
    tags: str = ""
    skip_tags: str = ""
    kubeconfig: str | None = None
    output: str = "text"
    report: str | None = None
    verbose: int = 0
    wait: bool = False  # commands that change hosts: wait for another run's host locks
    forks: int | None = None  # ansible-playbook -f; None: one fork per host, 5 to 50
    vault: vault.VaultOptions = field(default_factory=vault.VaultOptions)


class Invocation(NamedTuple):
    """What a command acts on, validated."""

    inventory: Inventory
    extravars: dict[str, Any]
    kubeconfig: str | None  # --kubeconfig, else $KUBECONFIG, else None


def check_output(output: str, outputs: tuple[str, ...] = OUTPUTS) -> None:
    if output not in outputs:
        raise BadInput(
            f"unknown --output {output!r}", f"use --output {' or --output '.join(outputs)}"
        )


def check_writable(report: str) -> None:
    """A report (or JUnit, or capture) path gpustack can write, checked before any run."""
    parent = Path(report).expanduser().resolve().parent
    while not parent.exists():
        parent = parent.parent
    if Path(report).expanduser().is_dir() or not os.access(parent, os.W_OK):
        raise BadInput(f"cannot write report {report}", "choose a writable file path for --report")


def user_extravars(
    extra_vars: list[str] | None, vault_options: vault.VaultOptions | None = None
) -> dict[str, Any]:
    """Credentials from GPUSTACK_* environment variables (gpustack/credentials.py); -e wins.
    The vault secrets are read first: `-e @FILE` may be encrypted, or hold `!vault` values."""
    vault.setup(vault_options)
    return {**credentials.environment_inputs(), **parse_extra_vars(extra_vars or [])}


def invocation(
    inventory: str,
    limit: str | None,
    extravars: dict[str, Any],
    kubeconfig: str | None,
    kubeconfig_hint: str = KUBECONFIG_HINT,
) -> Invocation:
    """Check the extra variables, load the inventory, check its role inputs and the kubeconfig."""
    check_inputs(extravars)
    check_extra_vars(extravars)
    loaded = load_inventory(inventory, limit)
    check_host_vars(loaded, extravars)
    if kubeconfig and not Path(kubeconfig).expanduser().is_file():
        raise BadInput(f"kubeconfig {kubeconfig} does not exist", kubeconfig_hint)
    return Invocation(loaded, extravars, kubeconfig or os.environ.get("KUBECONFIG"))


def validate(opts: HostOptions, outputs: tuple[str, ...] = OUTPUTS) -> Invocation:
    """All input checks of a host command, before anything runs on a host."""
    check_output(opts.output, outputs)
    if opts.report:
        check_writable(opts.report)
    extravars = user_extravars(opts.extra_vars, opts.vault)
    return invocation(opts.inventory, opts.limit, extravars, opts.kubeconfig)
