"""Parse `-e/--extra-vars` the way ansible-playbook does: KEY=VALUE, @file.yml or a mapping."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from gpustack.errors import BadInput

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def parse_extra_vars(items: list[str] | None) -> dict[str, Any]:
    """Merge every `-e` item, later items winning, as ansible-playbook does."""
    merged: dict[str, Any] = {}
    for item in items or []:
        merged.update(_parse_one(item))
    return merged


def _parse_one(item: str) -> dict[str, Any]:
    text = item.strip()
    if text.startswith("@"):
        return _load_file(text[1:])
    if text.startswith("{"):
        return _load_mapping(text, f"-e {item!r}")
    if "=" not in text:
        raise BadInput(
            f"-e {item!r} is not KEY=VALUE",
            'write -e KEY=VALUE (repeatable), -e @vars.yml, or -e \'{"key": "value"}\'',
        )
    key, value = text.split("=", 1)
    key = key.strip()
    if not _KEY.match(key):
        raise BadInput(
            f"-e {item!r}: {key!r} is not a valid variable name",
            "variable names start with a letter or _ and hold letters, digits and _",
        )
    # As with ansible-playbook, KEY=VALUE values are strings; roles cast with `| bool`/`| int`.
    return {key: value}


def _load_file(name: str) -> dict[str, Any]:
    path = Path(name).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"-e @{name}: file not found", "give the path of a YAML file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise BadInput(f"-e @{name}: cannot read file ({exc})", "check the file") from None
    return _load_mapping(text, f"-e @{name}")


def _load_mapping(text: str, where: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise BadInput(f"{where}: {problem}{at}", "extra vars must be a YAML mapping") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise BadInput(
            f"{where}: not a mapping of variable names to values", "write it as `key: value` lines"
        )
    return data
