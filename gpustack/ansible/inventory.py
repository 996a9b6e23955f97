"""Read the user's inventory with Ansible's own loader and pick the target hosts."""

from __future__ import annotations

import contextlib
import io
import os
import re
import socket
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpustack import paths
from gpustack.ansible import INVENTORY_ENVIRONMENT
from gpustack.ansible.input_files import check_files, printable, readable
from gpustack.errors import BadInput

TARGET_GROUP = "gpu_nodes"
LOCAL_FILE = "local-inventory.ini"
_ENABLED_PLUGINS = ("ini", "yaml")
_PARSE_HINT = "check the INI/YAML syntax; `ansible-inventory -i PATH --graph` shows Ansible's view"


@dataclass(frozen=True)
class Inventory:
    """The hosts a command will act on, in inventory order, with their variables."""

    path: Path
    target_group: str
    hosts: list[str]
    hostvars: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False)
    # Ansible's InventoryManager of this file: parsed once per command, reused by resolved_vars
    ansible: Any = field(default=None, compare=False, repr=False)
    # {host: every variable as a play sees it}, filled on the first resolved_vars call
    play_vars: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False, repr=False)


def _ansible_inventory_manager(path: Path):
    """Build an InventoryManager restricted to the INI and YAML plugins; quiet on stderr.
    The restriction is Ansible's own settings, from the environment gpustack.ansible set before
    ansible was imported (its __init__). Its loader decrypts with the command's vault secrets
    (gpustack/ansible/vault.py)."""
    from ansible import constants as C
    from ansible.inventory.manager import InventoryManager

    from gpustack.ansible import vault

    if list(C.INVENTORY_ENABLED) != list(_ENABLED_PLUGINS) or not C.INVENTORY_UNPARSED_IS_FAILED:
        raise RuntimeError(  # a programming error: ansible imported before gpustack.ansible
            "ansible.constants was loaded before gpustack.ansible set the inventory settings "
            f"{INVENTORY_ENVIRONMENT}"
        )
    loader = vault.loader()
    warnings = io.StringIO()
    try:
        with contextlib.redirect_stderr(warnings), contextlib.redirect_stdout(warnings):
            return InventoryManager(loader=loader, sources=[str(path)])
    except RecursionError:
        raise BadInput(f"cannot parse inventory {path}: nested too deeply", _PARSE_HINT) from None
    except Exception as exc:  # AnsibleError, and whatever a plugin let through
        if vault.is_vault_error(exc):
            raise vault.refusal(f"inventory {path}", exc) from None
        cause = _parse_cause(path)
        raise BadInput(f"cannot parse inventory {path}: {cause}", _PARSE_HINT) from None


def _parse_cause(path: Path) -> str:
    """Ask the plugin that should have read the file why it could not (one line)."""
    from ansible.inventory.data import InventoryData
    from ansible.parsing.dataloader import DataLoader
    from ansible.plugins.loader import inventory_loader

    if path.is_dir():
        return "no file in this directory is a valid INI or YAML inventory"
    name = "yaml" if path.suffix in (".yml", ".yaml", ".json") else "ini"
    plugin = inventory_loader.get(name)
    try:
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            plugin.parse(InventoryData(), DataLoader(), str(path), cache=False)
    except RecursionError:
        return "nested too deeply"
    except Exception as exc:  # the plugin's own message is what the user needs
        text = getattr(exc, "message", None) or str(exc)
        return printable(str(text))
    return "not an INI or YAML inventory"


def load_inventory(path: str | Path, limit: str | None = None) -> Inventory:
    """Load `path`, target `gpu_nodes` when present (else all hosts), apply `--limit`."""
    inv_path = Path(path).expanduser().resolve()
    if not inv_path.exists():
        raise BadInput(
            f"inventory {path} does not exist",
            "pass the path of an Ansible INI or YAML inventory (e.g. one from `gpustack lab up`)",
        )
    if not os.access(inv_path, os.R_OK) or (inv_path.is_file() and not readable(inv_path)):
        raise BadInput(f"inventory {path} is not readable", "check the file's permissions")
    if not (inv_path.is_file() or inv_path.is_dir()):
        raise BadInput(f"inventory {path} is not a regular file or directory",
                       "pass the path of an Ansible INI or YAML inventory")  # fmt: skip
    check_files(inv_path, f"inventory {path}")

    manager = _ansible_inventory_manager(inv_path)
    group = TARGET_GROUP if TARGET_GROUP in manager.groups else "all"
    hosts = [h.name for h in manager.get_hosts(group)]
    if not hosts:
        where = f"group {group}" if group != "all" else "it"
        raise BadInput(
            f"inventory {path} has no hosts in {where}",
            f"add hosts under [{TARGET_GROUP}], or remove that group to target every host"
            if group == TARGET_GROUP
            else f"add hosts, ideally under a [{TARGET_GROUP}] group",
        )
    if limit:
        limit = _limit_from_file(limit)
        check_limit(limit, manager, hosts)
        with contextlib.redirect_stderr(io.StringIO()):  # ansible warns on unmatched patterns
            manager.subset(limit)
            limited = {h.name for h in manager.get_hosts(group)}
        chosen = [h for h in hosts if h in limited]
        if not chosen:
            raise BadInput(
                f"--limit {limit!r} matches no host in {group}",
                f"hosts in {group}: {', '.join(hosts[:10])}{' …' if len(hosts) > 10 else ''}",
            )
        hosts = chosen
    try:
        hostvars = {h: plain(dict(manager.get_host(h).get_vars())) for h in hosts}
    except TooLarge as exc:
        raise BadInput(f"inventory {path}: {exc}", _PARSE_HINT) from None
    except Exception as exc:
        from gpustack.ansible import vault

        if vault.is_vault_error(exc):
            raise vault.refusal(f"inventory {path}", exc) from None
        raise
    return Inventory(
        path=inv_path, target_group=group, hosts=hosts, hostvars=hostvars, ansible=manager
    )


def _limit_from_file(limit: str) -> str:
    """`--limit` with its `@FILE` elements (ansible-playbook's form, e.g. a .retry file) replaced
    by the file's lines, one pattern each, as InventoryManager.subset reads them."""
    from ansible.inventory.manager import split_host_pattern

    if "@" not in limit:
        return limit
    patterns: list[str] = []
    for element in split_host_pattern(limit):
        if not element.startswith("@"):
            patterns.append(element)
            continue
        path = Path(element[1:]).expanduser()
        if path.exists() and not path.is_file():
            raise BadInput(f"--limit {element}: not a regular file", "one host per line")
        try:
            lines = path.read_text(encoding="utf-8").split("\n")
        except (OSError, UnicodeDecodeError) as exc:
            reason = getattr(exc, "strerror", None) or "not a text file"
            raise BadInput(f"--limit {element}: {reason}",
                           "give a file with one host or pattern per line (e.g. a .retry file)",
                           ) from None  # fmt: skip
        found = [line.strip() for line in lines if line.strip()]
        if not found:
            raise BadInput(f"--limit {element}: the file names no host", "one host per line")
        patterns += found
    return ",".join(patterns)


_LIMIT_HINT = (
    "Ansible patterns: names or globs (gpu0*), groups, ranges (gpu[01:04]), ~regex, "
    "!exclude, &intersect, joined by commas; e.g. --limit 'gpu0*,!gpu03'"
)
_NAME = re.compile(r"^[\w.*?@/:-]+(\[[\w.*?:!-]*\])?[\w.*?@/:-]*$")


def check_limit(limit: str, manager, hosts: list[str]) -> None:
    """Refuse a --limit Ansible would not read the way it was meant: a malformed element (Ansible
    would silently take it as a literal name, or an exclusion of nothing, and match every host)
    or an element that matches no host at all (a typo)."""
    from ansible.inventory.manager import split_host_pattern

    unbalanced = "~" not in limit and limit.count("[") != limit.count("]")
    if unbalanced or not limit.strip():
        raise BadInput(
            f"--limit {limit!r} is not a valid host pattern (unbalanced [ ])", _LIMIT_HINT
        )
    for element in split_host_pattern(limit):
        body = element[1:] if element[:1] in "!&" else element
        valid = bool(body) and body[:1] not in "!&"
        if valid and body.startswith("~"):
            try:
                re.compile(body[1:])
            except re.error as exc:
                raise BadInput(
                    f"--limit element {element!r}: invalid regular expression ({exc})", _LIMIT_HINT
                ) from None
        elif valid:
            valid = bool(_NAME.match(body))
        if not valid:
            raise BadInput(f"--limit element {element!r} is not a valid host pattern", _LIMIT_HINT)
        with contextlib.redirect_stderr(io.StringIO()):
            matched = manager.get_hosts(body)
        if not matched:
            shown = f"{', '.join(hosts[:10])}{' …' if len(hosts) > 10 else ''}"
            raise BadInput(
                f"--limit element {element!r} matches no host or group of the inventory",
                f"hosts: {shown}",
            )


class TooLarge(ValueError):
    """A value nested or aliased (YAML anchors) past what any gpustack input needs."""


MAX_NODES = 10_000  # values in one variable, counting each alias again
MAX_DEPTH = 64


def plain(value: Any, _budget: list[int] | None = None, _depth: int = 0) -> Any:
    """Ansible's tagged str/int/float values as plain Python values (messages, type checks);
    vaulted strings decrypted with the command's vault secrets and registered as secrets
    (gpustack/credentials.py). Raises TooLarge past MAX_NODES values or MAX_DEPTH levels."""
    from gpustack.ansible import vault

    budget = _budget if _budget is not None else [MAX_NODES]
    budget[0] -= 1
    if budget[0] < 0:
        raise TooLarge(f"a value holds more than {MAX_NODES} items (YAML aliases?)")
    if _depth > MAX_DEPTH:
        raise TooLarge(f"a value is nested more than {MAX_DEPTH} levels deep")
    value = vault.decrypted(value)
    if isinstance(value, bool) or value is None:
        return value
    for kind in (str, int, float):
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, dict):
        return {str(k): plain(v, budget, _depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v, budget, _depth + 1) for v in value]
    return value


class TemplateBroken(ValueError):
    """A Jinja2 template that cannot be parsed: no play could render it."""


def templated(value: Any) -> bool:
    return isinstance(value, str) and ("{{" in value or "{%" in value)


def _render(templar, value: Any) -> Any:
    """`value` rendered by Ansible's Templar, or unchanged where it needs what only a play has
    (facts, registered results): the play renders it then. Vault errors propagate."""
    from ansible.errors import AnsibleError, AnsibleTemplateSyntaxError

    from gpustack.ansible import vault

    try:
        rendered = templar.template(value)
    except AnsibleTemplateSyntaxError as exc:
        raise TemplateBroken(vault.one_line(exc)) from None
    except AnsibleError as exc:
        if vault.is_vault_error(exc):
            raise
        return value
    # Ansible's convention: variables named vault_* hold vaulted values (whole encrypted files
    # leave no mark on their values).
    if re.search(r"\bvault_\w", value):
        for item in rendered if isinstance(rendered, list) else [rendered]:
            if isinstance(item, str):
                vault.register(str(item))
    return rendered


def resolved_vars(
    inventory: Inventory, keep: Callable[[str], bool], extravars: dict[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """{host: variables} of the target hosts as a play sees them ([all:vars], groups,
    group_vars/, host_vars/; Ansible's own VariableManager), only names `keep` accepts.
    Templates (`"{{ vault_mirror_password }}"`) are rendered with Ansible's Templar over the
    host's variables and `extravars`; one that needs facts or results of the play is left as
    written, for the play. Vaulted values are decrypted (and masked wherever gpustack prints
    them). The inventory is not parsed again (see Inventory.ansible), and each host's variables
    are resolved once per command however many checks ask."""
    from gpustack.ansible import vault

    missing = [name for name in inventory.hosts if name not in inventory.play_vars]
    if missing:
        from ansible.vars.manager import VariableManager

        # An Inventory built by hand (tests) has no parsed manager yet: parse the file now.
        manager = inventory.ansible or _ansible_inventory_manager(inventory.path)
        variables = VariableManager(loader=vault.loader(), inventory=manager)
        for name in missing:
            try:
                with contextlib.redirect_stderr(io.StringIO()):
                    inventory.play_vars[name] = variables.get_vars(
                        host=manager.get_host(name), include_hostvars=False
                    )
            except Exception as exc:
                if vault.is_vault_error(exc):
                    raise vault.refusal(f"inventory {inventory.path} (host {name})", exc) from None
                raise BadInput(f"inventory {inventory.path} (host {name}): {vault.one_line(exc)}",
                               _PARSE_HINT) from None  # fmt: skip
    found: dict[str, dict[str, Any]] = {}
    for name in inventory.hosts:
        every = inventory.play_vars[name]
        wanted = {k: v for k, v in every.items() if keep(k)}
        try:
            if any(templated(v) for v in wanted.values()):
                from ansible.template import Templar

                templar = Templar(loader=vault.loader(), variables={**every, **(extravars or {})})
                for key, value in wanted.items():
                    try:
                        wanted[key] = _render(templar, value) if templated(value) else value
                    except TemplateBroken as exc:
                        raise TemplateBroken(f"{key}: {exc}") from None
            found[name] = {k: plain(v) for k, v in wanted.items()}
        except TooLarge as exc:
            raise BadInput(f"inventory host {name}: {exc}", _PARSE_HINT) from None
        except TemplateBroken as exc:
            hint = "fix the Jinja2 expression ({{ ... }}) in the inventory"
            raise BadInput(f"inventory host {name}: {printable(str(exc))}", hint) from None
        except Exception as exc:
            if vault.is_vault_error(exc):
                raise vault.refusal(f"inventory {inventory.path} (host {name})", exc) from None
            raise
    return found


def local_inventory_text(node_name: str, python: str) -> str:
    """The inventory `--local` stands for: this machine over Ansible's local connection.

    Modules run with gpustack's own interpreter (`ansible_playbook_python`, as for Ansible's
    implicit localhost): interpreter discovery may pick a broken shim on a workstation."""
    return (
        "# Written by `gpustack --local`: this machine, Ansible's local connection, no SSH.\n"
        "# k8s_node_name: the Kubernetes Node this machine is (verify, status --kubeconfig).\n"
        f"[{TARGET_GROUP}]\n"
        f"localhost ansible_connection=local ansible_python_interpreter={python} "
        f"k8s_node_name={node_name}\n"
    )


def inventory_source(path: str | None, local: bool) -> str:
    """The inventory a command acts on: the one given, or with --local a generated one."""
    if local and path:
        raise BadInput(
            f"both an inventory ({path}) and --local were given",
            "--local acts on this machine alone: drop the INVENTORY argument or --local",
        )
    if local:
        return str(write_local_inventory())
    if not path:
        raise BadInput(
            "Missing argument 'INVENTORY'.",
            "pass an Ansible inventory, or --local to act on this machine without SSH",
        )
    return path


def write_local_inventory(directory: Path | None = None) -> Path:
    """Write (when it differs) the --local inventory under gpustack's state directory."""
    directory = directory or paths.state_root()
    target = directory / LOCAL_FILE
    text = local_inventory_text(socket.gethostname().lower(), sys.executable)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        if not target.is_file() or target.read_text(encoding="utf-8") != text:
            with tempfile.NamedTemporaryFile(
                "w", dir=directory, prefix=".local-", delete=False, encoding="utf-8"
            ) as handle:
                handle.write(text)
            os.replace(handle.name, target)
    except OSError as exc:
        raise BadInput(
            f"cannot write the --local inventory in {directory}: {exc.strerror}",
            "set GPUSTACK_STATE_DIR to a writable directory",
        ) from None
    return target
