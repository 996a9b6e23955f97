"""Check role inputs against the roles' own argument specs before any host is contacted.

Ansible validates `meta/argument_specs.yml` too, but only when the role starts on a host; this
gives the same verdict (type and choices) for `-e` values and inventory variables up front, as
one `Error:` + `Hint:`. Format rules (versions, branches, URLs) live in input_formats.py.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any

from gpustack import paths
from gpustack.ansible.input_formats import check_extra_vars
from gpustack.ansible.inventory import resolved_vars
from gpustack.errors import BadInput

_BOOL = ("true", "false", "yes", "no", "1", "0", "on", "off", "y", "n")


@cache
def role_options() -> dict[str, dict[str, Any]]:
    """Every documented role input: name -> its argument spec entry."""
    options: dict[str, dict[str, Any]] = {}
    for path in sorted(paths.roles_dir().glob("*/meta/argument_specs.yml")):
        spec = paths.load_yaml(path) or {}
        for entry in (spec.get("argument_specs") or {}).values():
            options.update((entry or {}).get("options") or {})
    return options


def _type_error(kind: str, value: Any) -> str | None:
    """Why `value` cannot be converted to `kind` the way Ansible would (None when it can)."""
    if kind == "bool":
        if isinstance(value, bool) or str(value).strip().lower() in _BOOL:
            return None
        return "not a boolean"
    if kind == "int":
        if isinstance(value, bool):
            return "not an integer"
        if isinstance(value, int) or str(value).strip().lstrip("-").isdigit():
            return None
        return "not an integer"
    if kind == "list":
        return None if isinstance(value, (list, str)) else "not a list"
    if kind == "dict":
        if isinstance(value, dict):
            return None
        if isinstance(value, str):
            try:
                if isinstance(json.loads(value), dict):
                    return None
            except ValueError:
                pass
        return "not a mapping"
    if kind in ("str", "path", "raw"):
        return "not a string" if isinstance(value, (list, dict)) and kind != "raw" else None
    return None


def _templated(value: Any) -> bool:
    return isinstance(value, str) and "{{" in value


def check_inputs(variables: dict[str, Any], where: str = "-e") -> None:
    """Raise BadInput for the first role input of the wrong type or outside its choices."""
    options = role_options()
    for name, value in variables.items():
        spec = options.get(name)
        if spec is None or _templated(value):
            continue
        kind = spec.get("type", "str")
        problem = _type_error(kind, value)
        if problem:
            shown = json.dumps(value) if not isinstance(value, str) else value
            raise BadInput(
                f"{where} {name}={shown}: {problem} ({kind} expected)",
                f"see {name} in docs/variables.md",
            )
        choices = [str(c) for c in spec.get("choices") or []]
        # As Ansible's validator: YAML's True/False count as the one true/false word among the
        # choices (ansible/module_utils/common/parameters.py, _validate_argument_values).
        if str(value) in ("True", "False") and str(value).lower() in choices:
            value = str(value).lower()
        if choices and str(value) not in choices:
            raise BadInput(
                f"{where} {name}={value}: not one of {', '.join(str(c) for c in choices)}",
                f"choose one of {', '.join(str(c) for c in choices)}",
            )


def resolved_host_vars(inventory) -> dict[str, dict[str, Any]]:
    """{host: variables} as a play sees them, limited to what is checked here."""
    wanted = set(role_options()) | {"gpustack_require_gpu", "ansible_port"}
    return resolved_vars(inventory, wanted.__contains__)


def check_host_vars(inventory, extravars: dict[str, Any]) -> None:
    """Inventory variables of each target host: connection basics and role inputs."""
    options = role_options()
    for host, variables in resolved_host_vars(inventory).items():
        where = f"inventory host {host}:"
        port = variables.get("ansible_port")
        bad_port = not str(port).isdigit() or not 0 < int(str(port)) < 65536
        if port is not None and not _templated(port) and bad_port:
            raise BadInput(
                f"{where} ansible_port={port} is not a port number",
                "fix the host's ansible_port in the inventory (1-65535)",
            )
        own = {
            k: v
            for k, v in variables.items()
            if k not in extravars
            and (k in options or k == "gpustack_require_gpu")
            and not _templated(v)
        }
        if not own:
            continue
        check_inputs(own, where)
        check_extra_vars({**own, **extravars}, where=where)
