"""`-e/--extra-vars` read as ansible-playbook reads them, with Ansible's own code.

ansible-core's `ansible.utils.vars.load_extra_vars` reads its global CLI context, which only
ansible-core's own CLI sets; this applies the same rules with the same public functions, item
by item: `@FILE` is `DataLoader.load_from_file` (YAML or JSON, vault-encrypted files and inline
`!vault` values decrypted with the command's vault secrets), an item starting with `{` or `[` is
`DataLoader.load`, anything else `ansible.parsing.splitter.parse_kv` (`-e 'a=1 b=2'` is two
variables), merged with `combine_vars` in order, later items winning. On top of Ansible's
rules: words without `=` (which ansible-playbook silently drops), invalid variable names and
values nested or aliased past any sensible size are refused.

The playbook run gets the `@FILE` items as `-e @/absolute/path` in the same order, so it reads
and decrypts those files itself (see `for_playbook`): gpustack never writes a value it decrypted.
"""

from __future__ import annotations

import contextlib
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpustack import credentials
from gpustack.ansible import vault
from gpustack.ansible.input_files import check_files, printable, readable
from gpustack.ansible.inventory import TooLarge, plain
from gpustack.errors import BadInput

_FORMS = (
    "write -e KEY=VALUE (repeatable), -e 'KEY1=V1 KEY2=V2', -e @vars.yml "
    'or -e \'{"key": "value"}\''
)


@dataclass
class _Passthrough:
    files: list[str] = field(default_factory=list)  # absolute paths, in the order given
    values: dict[str, Any] = field(default_factory=dict)  # name -> the object a file gave it


_PASSTHROUGH = _Passthrough()


def parse_extra_vars(items: list[str] | None) -> dict[str, Any]:
    """Merge every `-e` item as ansible-playbook does; plain Python values."""
    from ansible.utils.vars import combine_vars

    merged: dict[str, Any] = {}
    passthrough = _Passthrough()
    for item in items or []:
        text = str(item)
        if not text:
            continue  # ansible-playbook skips empty items
        where = f"-e {_shown(text)}"
        if text.startswith("@"):
            path, data = _load_file(text[1:], where)
            passthrough.files.append(str(path))
        else:
            data = _load_inline(text, where)
        data = _plain_mapping(data, where)
        if text.startswith("@") and vault.file_is_encrypted(path):
            _register_all(data)  # every value of an encrypted file is a secret
        for name in data:
            passthrough.values.pop(name, None)
        merged = combine_vars(merged, data)
        if text.startswith("@"):
            passthrough.values.update({name: merged[name] for name in data})
    passthrough.values = {k: v for k, v in passthrough.values.items() if merged.get(k) is v}
    _PASSTHROUGH.files, _PASSTHROUGH.values = passthrough.files, passthrough.values
    return merged


def for_playbook(variables: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the variables to hand over as values, the `-e @FILE` items to pass through in order):
    a variable whose value is still the one an `-e @FILE` gave reaches the playbook from that
    file, as with ansible-playbook; any other (given inline, or set by gpustack) is a value."""
    values = {
        name: value
        for name, value in variables.items()
        if not (name in _PASSTHROUGH.values and _PASSTHROUGH.values[name] is value)
    }
    return values, list(_PASSTHROUGH.files)


def _shown(text: str) -> str:
    text = credentials.scrub(text)
    return repr(text if len(text) <= 80 else text[:77] + "...")


def _load_file(name: str, where: str) -> tuple[Path, Any]:
    path = Path(name).expanduser()
    if not path.exists():
        raise BadInput(f"{where}: file not found", "give the path of a YAML or JSON file") from None
    if not path.is_file() or not readable(path):
        raise BadInput(f"{where}: not a readable file", "give the path of a YAML or JSON file")
    path = path.resolve()
    check_files(path, where)
    loader = vault.loader()
    try:
        with contextlib.redirect_stderr(io.StringIO()):  # Ansible's warnings: the error says it
            try:
                data = loader.load_from_file(str(path), cache="none", trusted_as_template=True)
            except TypeError:  # ansible-core before 2.19: no trusted_as_template (all trusted)
                data = loader.load_from_file(str(path), cache="none")
    except RecursionError:
        raise BadInput(f"{where}: nested too deeply", "extra vars are a YAML mapping") from None
    except Exception as exc:  # Ansible's parser and vault errors; their message is the cause
        raise _refusal(where, exc) from None
    return path, data


def _load_inline(text: str, where: str) -> Any:
    from ansible.parsing.splitter import parse_kv, split_args

    if text[0] in "/.":  # ansible-playbook: "Please prepend extra_vars filename ... with '@'"
        raise BadInput(f"{where} looks like a file name", f"prepend @: -e @{text}")
    try:
        if text[0] in "[{":
            return vault.loader().load(_trusted(text))
        words = split_args(text)
        data = parse_kv(_trusted(text))
    except RecursionError:
        raise BadInput(f"{where}: nested too deeply", "extra vars are a YAML mapping") from None
    except Exception as exc:
        raise _refusal(where, exc) from None
    loose = [w for w in words if "=" not in w]
    if loose:
        raise BadInput(f"{where}: {loose[0]!r} is not KEY=VALUE (ansible-playbook would drop it)",
                       _FORMS)  # fmt: skip
    return data


def _trusted(text: str) -> str:
    """Command-line text is trusted as a template, as ansible-playbook's option parser marks it
    (ansible-core 2.19+; earlier releases trust everything)."""
    try:
        from ansible.template import trust_as_template
    except ImportError:
        return text
    return trust_as_template(text)


def _refusal(where: str, exc: BaseException) -> BadInput:
    if vault.is_vault_error(exc):
        return vault.refusal(where, exc)
    origin = getattr(exc, "obj", None)  # Ansible's parser errors point at the line
    line, column = getattr(origin, "line_num", None), getattr(origin, "col_num", None)
    at = f" (line {line}, column {column})" if line and column else ""
    return BadInput(f"{where}: {printable(vault.one_line(exc))}{at}",
                    "extra vars are a YAML (or JSON) mapping")  # fmt: skip


def _plain_mapping(data: Any, where: str) -> dict[str, Any]:
    from ansible.utils.vars import isidentifier

    if data is None:
        return {}
    if not isinstance(data, dict):
        raise BadInput(f"{where}: not a mapping of variable names to values",
                       "write it as `key: value` lines, or KEY=VALUE")  # fmt: skip
    for key in data:
        if not isinstance(key, str) or not isidentifier(str(key)):
            raise BadInput(
                f"{where}: {_shown(str(key))} is not a valid variable name",
                "variable names start with a letter or _ and hold ASCII letters, digits and _",
            )
    try:
        return plain(dict(data))
    except TooLarge as exc:
        hint = "gpustack's inputs are small values, lists and mappings"
        raise BadInput(f"{where}: {exc}", hint) from None
    except Exception as exc:
        raise _refusal(where, exc) from None


def _register_all(value: Any) -> None:
    if isinstance(value, dict):
        for item in value.values():
            _register_all(item)
    elif isinstance(value, list):
        for item in value:
            _register_all(item)
    elif isinstance(value, str):
        vault.register(value)
