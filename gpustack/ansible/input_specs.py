"""Check role inputs against the roles' own argument specs before any host is contacted.

Ansible validates `meta/argument_specs.yml` when a role starts on a host; this runs the same
validator, Ansible's own `ArgumentSpecValidator` (ansible.module_utils.common.arg_spec), over
every role variable given with `-e` or set in the inventory, before anything runs, so a wrong
type or choice is one `Error:` + `Hint:`. Booleans are Ansible's (`convert_bool.BOOLEANS`:
yes/no, true/false, on/off, y/n, t/f, 1/0). A variable named like a role's input (its prefix)
that no role declares is refused with the closest declared name: Ansible would ignore it.
Format rules (versions, branches, URLs) live in input_formats.py.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import json
from functools import cache
from typing import Any

from gpustack import credentials, paths
from gpustack.ansible.input_files import printable
from gpustack.ansible.input_formats import check_extra_vars
from gpustack.ansible.inventory import resolved_vars, templated
from gpustack.errors import BadInput

# Playbook-level inputs (not a role's): validated the same way.
PLAYBOOK_INPUTS: dict[str, dict[str, Any]] = {
    "gpustack_require_gpu": {"type": "bool"},
    "gpustack_upgrade_verify_pod": {"type": "bool"},
}
# Integers the roles take are seconds: refused outside this range.
INT_RANGE = (0, 2**31 - 1)
# Connection plugins whose hosts gpustack's roles cannot serve (Windows, network devices).
UNUSABLE_CONNECTIONS = ("winrm", "psrp", "network_cli", "netconf", "httpapi")
_SPEC_KEYS = ("type", "elements", "choices", "options", "no_log", "aliases")


@cache
def role_options() -> dict[str, dict[str, Any]]:
    """Every documented role input: name -> its argument spec entry."""
    options: dict[str, dict[str, Any]] = {}
    for path in sorted(paths.roles_dir().glob("*/meta/argument_specs.yml")):
        spec = paths.load_yaml(path) or {}
        for entry in (spec.get("argument_specs") or {}).values():
            options.update((entry or {}).get("options") or {})
    return options


@cache
def role_prefixes() -> tuple[str, ...]:
    """`<role>_` of every role with an argument spec: a variable so named is that role's."""
    roles = sorted(
        p.parent.parent.name for p in paths.roles_dir().glob("*/meta/argument_specs.yml")
    )
    return tuple(f"{role}_" for role in sorted(roles, key=len, reverse=True))


def _validator_spec(entry: dict[str, Any]) -> dict[str, Any]:
    """An argument spec entry as ArgumentSpecValidator takes it for a partial set of inputs:
    no `required` (an input left out keeps its default) and no `default`."""
    spec = {k: v for k, v in entry.items() if k in _SPEC_KEYS}
    if isinstance(spec.get("options"), dict):
        spec["options"] = {n: _validator_spec(o or {}) for n, o in spec["options"].items()}
    return spec


def _known() -> dict[str, dict[str, Any]]:
    return {**role_options(), **PLAYBOOK_INPUTS}


def check_names(variables: dict[str, Any], where: str = "-e") -> None:
    """Refuse a variable named like a role input (its role's prefix) that no role declares."""
    known = _known()
    for name in variables:
        role = next((p for p in role_prefixes() if name.startswith(p)), None)
        if role is None or name in known or name.startswith("__"):
            continue
        candidates = sorted(n for n in known if n.startswith(role))
        close = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
        hint = (
            f"did you mean {close[0]}?"
            if close
            else f"{role[:-1]}'s inputs are listed in docs/variables.md"
        )
        raise BadInput(f"{where} {name}: no role takes this variable (Ansible would ignore it)",
                       hint)  # fmt: skip


def check_inputs(variables: dict[str, Any], where: str = "-e") -> None:
    """Raise BadInput for the first role input of the wrong type, outside its choices or range
    (Ansible's ArgumentSpecValidator), or named like an input no role declares."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    check_names(variables, where)
    known = _known()
    given = {k: v for k, v in variables.items() if k in known and not templated(v)}
    if not given:
        return
    for name, value in given.items():
        if known[name].get("no_log"):
            credentials.register(value if isinstance(value, str) else json.dumps(value))
    spec = {name: _validator_spec(known[name]) for name in given}
    result = ArgumentSpecValidator(spec).validate(dict(given))
    if result.error_messages:
        raise _refusal(result.error_messages[0], given, where)
    for name, value in result.validated_parameters.items():
        if known[name].get("type") == "int" and not INT_RANGE[0] <= value <= INT_RANGE[1]:
            raise BadInput(f"{where} {name}={value}: out of range",
                           f"give {INT_RANGE[0]} to {INT_RANGE[1]} (seconds)")  # fmt: skip


def _refusal(message: str, given: dict[str, Any], where: str) -> BadInput:
    """ArgumentSpecValidator's verdict as one Error line: NAME=VALUE, then Ansible's words."""
    known = _known()
    name = next((n for n in given if f"'{n}'" in message or f" {n} " in message), None)
    text = _message(message)
    hint = "see docs/variables.md"
    if name:
        entry = known[name]
        value = given[name]
        shown = value if isinstance(value, str) else json.dumps(value, default=str)
        text = f"{name}={shown}: {text}"
        if entry.get("choices"):
            hint = f"choose one of {', '.join(str(c) for c in entry['choices'])}"
        elif entry.get("type") == "bool":
            # Ansible's list comes from a set, in no order: say it once, in one.
            text = text.split(". Valid booleans include")[0]
            hint = f"{name} is a boolean: {boolean_words()} (Ansible's booleans)"
        else:
            hint = f"{name} takes a {entry.get('type', 'str')}; see docs/variables.md"
    return BadInput(f"{where} {credentials.scrub(printable(text))}", hint)


def boolean_words() -> str:
    """Ansible's boolean words (convert_bool.BOOLEANS_TRUE / _FALSE), true ones first."""
    from ansible.module_utils.parsing.convert_bool import BOOLEANS_FALSE, BOOLEANS_TRUE

    def words(values) -> list[str]:
        return sorted({str(v) for v in values if isinstance(v, str)}, key=lambda w: (len(w), w))

    return ", ".join(words(BOOLEANS_TRUE)) + " / " + ", ".join(words(BOOLEANS_FALSE))


def is_true(value: Any) -> bool:
    """A boolean input as Ansible reads it (`| bool`, argument specs): convert_bool.BOOLEANS."""
    from ansible.module_utils.parsing.convert_bool import boolean

    return boolean(value, strict=False)


def _message(text: str) -> str:
    return " ".join(str(text).split())


def resolved_host_vars(inventory, extravars: dict[str, Any] | None = None):
    """{host: variables} as a play sees them, limited to what is checked here: role-prefixed
    names, gpustack's playbook inputs and the connection basics."""
    prefixes = role_prefixes()
    basics = {"ansible_port", "ansible_connection"}

    def wanted(name: str) -> bool:
        return name in PLAYBOOK_INPUTS or name in basics or name.startswith(prefixes)

    return resolved_vars(inventory, wanted, extravars)


@cache
def _plugin_loader() -> None:
    """ansible-core's plugin loader with collections (FQCNs, aliases), set up once, as
    ansible-playbook sets it up (`init_plugin_loader`)."""
    from ansible.plugins.loader import init_plugin_loader

    init_plugin_loader()


def check_connection(host: str, connection: Any) -> None:
    """A connection plugin gpustack's roles can use: one Ansible has, not Windows or network."""
    if connection in (None, "") or templated(connection):
        return
    name = str(connection)
    where = f"inventory host {host}: ansible_connection={name}"
    hint = "gpustack's roles run on Linux hosts: ansible_connection=ssh (default), or local"
    if name.rsplit(".", 1)[-1] in UNUSABLE_CONNECTIONS:
        raise BadInput(f"{where} is for Windows hosts or network devices", hint)
    from ansible.plugins.loader import connection_loader

    try:
        with contextlib.redirect_stderr(io.StringIO()):  # the loader warns on names it lacks
            _plugin_loader()
            found = connection_loader.find_plugin(name, check_aliases=True)
    except Exception:  # a malformed name: Ansible's loader raises rather than returning None
        found = None
    if not found:
        missing = f"{hint}; a collection's plugin needs that collection installed"
        raise BadInput(f"{where}: Ansible has no such connection plugin", missing)


def check_host_vars(inventory, extravars: dict[str, Any]) -> None:
    """Inventory variables of each target host: connection basics and role inputs."""
    for host, variables in resolved_host_vars(inventory, extravars).items():
        where = f"inventory host {host}:"
        port = variables.get("ansible_port")
        bad_port = not str(port).isdigit() or not 0 < int(str(port)) < 65536
        if port is not None and not templated(port) and bad_port:
            raise BadInput(
                f"{where} ansible_port={port} is not a port number",
                "fix the host's ansible_port in the inventory (1-65535)",
            )
        check_connection(
            host, extravars.get("ansible_connection", variables.get("ansible_connection"))
        )
        own = {
            k: v
            for k, v in variables.items()
            if k not in extravars and k not in ("ansible_port", "ansible_connection")
        }
        if not own:
            continue
        check_inputs(own, where)
        check_extra_vars({**{k: v for k, v in own.items() if not templated(v)}, **extravars},
                         where=where)  # fmt: skip
