"""Credentials: where they come from, and the one masking helper for everything gpustack shows.

Mirror credentials reach the roles as `<role>_mirror_username` / `<role>_mirror_password`
(or `user:password@` in a URL, or `<role>_mirror_password_file`, read on the controller by
the role). They never belong in what gpustack prints or stores:

* `mask_url` / `scrub` / `scrub_data`: `user:password@` in any URL becomes `user:***@`, and
  every secret value gpustack knows of becomes `********`. Output, reports, JSON, the `-v`
  log, `Error:` lines and the converged-host reasons all go through here.
* `environment_inputs`: `GPUSTACK_<INPUT>` environment variables for the credential inputs
  (e.g. GPUSTACK_NVIDIA_CONTAINER_TOOLKIT_MIRROR_PASSWORD), taken out of gpustack's own
  environment at once, so neither ansible-playbook's environment nor ansible-runner's
  `artifacts/*/command` (which records the full environment) ever holds them.
* `split_extravars`: the variables that carry a secret are kept out of ansible-runner's
  `env/extravars`; the runner hands them over in a 0600 file it deletes
  (gpustack/ansible/runner.py).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

MASK = "********"
# scheme://userinfo@ — the userinfo runs to the last '@' before the host's end.
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^\s/?#\"'<>]*)@")
# The role inputs that are secrets (also marked no_log in the roles' argument specs).
SECRET_SUFFIXES = ("_password",)
# Inputs that may also come from the environment as GPUSTACK_<NAME upper-case>.
ENV_INPUTS = (
    "nvidia_driver_mirror_username",
    "nvidia_driver_mirror_password",
    "nvidia_container_toolkit_mirror_username",
    "nvidia_container_toolkit_mirror_password",
)
ENV_PREFIX = "GPUSTACK_"

_known: set[str] = set()
_from_env: dict[str, str] | None = None


def is_secret_name(name: str) -> bool:
    return str(name).endswith(SECRET_SUFFIXES)


def register(*values: Any) -> None:
    """Remember secret values so that `scrub` masks them wherever they show up."""
    for value in values:
        if isinstance(value, str) and value.strip():
            _known.add(value)
            _known.add(value.strip())


def forget_all() -> None:
    """Tests only: start from no known secrets."""
    _known.clear()


def mask_url(text: str) -> str:
    """`scheme://user:password@host` -> `scheme://user:***@host`; `scheme://token@host` ->
    `scheme://***@host` (a lone user part is often a token)."""

    def repl(match: re.Match) -> str:
        userinfo = match.group("userinfo")
        if ":" in userinfo:
            return f"{match.group('scheme')}{userinfo.split(':', 1)[0]}:***@"
        return f"{match.group('scheme')}***@"

    return _USERINFO.sub(repl, text)


def has_credentials(url: str) -> bool:
    return bool(_USERINFO.search(str(url)))


def scrub(text: str) -> str:
    """Every known secret masked, then every URL's credentials."""
    if not isinstance(text, str) or not text:
        return text
    for secret in sorted(_known, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, MASK)
    return mask_url(text)


def scrub_data(data: Any) -> Any:
    """`scrub` through dicts, lists and strings (keys too); values of secret-named keys are
    masked whatever they hold."""
    if isinstance(data, dict):
        return {
            scrub(k) if isinstance(k, str) else k: (
                MASK if is_secret_name(k) and isinstance(v, str) and v else scrub_data(v)
            )
            for k, v in data.items()
        }
    if isinstance(data, (list, tuple)):
        return [scrub_data(v) for v in data]
    if isinstance(data, str):
        return scrub(data)
    return data


def needs_scrub(text: str) -> bool:
    return any(s in text for s in _known) or bool(_USERINFO.search(text))


def environment_inputs() -> dict[str, str]:
    """Credential inputs given as GPUSTACK_* environment variables (read once, then removed
    from this process's environment so that no child process or artifact inherits them)."""
    global _from_env
    if _from_env is None:
        _from_env = {}
        for name in ENV_INPUTS:
            value = os.environ.pop(ENV_PREFIX + name.upper(), None)
            if value:
                _from_env[name] = value.strip()
        register(*(v for k, v in _from_env.items() if is_secret_name(k)))
    return dict(_from_env)


def carries_secret(name: str, value: Any) -> bool:
    """Whether an extra variable holds a secret: a password input, or credentials in a URL."""
    if is_secret_name(name) and value not in (None, ""):
        return True
    if isinstance(value, str):
        return has_credentials(value)
    if isinstance(value, dict):
        return any(carries_secret(str(k), v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return any(carries_secret(name, v) for v in value)
    return False


def split_extravars(variables: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(plain, secret): the variables ansible-runner may write to env/extravars, and the rest."""
    plain, secret = {}, {}
    for name, value in variables.items():
        (secret if carries_secret(name, value) else plain)[name] = value
    return plain, secret


def register_inputs(variables: dict[str, Any]) -> None:
    """Register the secrets among role inputs: passwords, password files' first lines and the
    password part of URLs."""
    for name, value in variables.items():
        if not isinstance(value, str) or not value:
            continue
        if is_secret_name(name):
            register(value)
        elif name.endswith("_password_file"):
            try:
                with open(os.path.expanduser(value), encoding="utf-8") as fh:
                    lines = fh.read().splitlines()
            except (OSError, UnicodeDecodeError):
                continue
            register(lines[0] if lines else "")
        else:
            register(*_url_passwords(value))


def _url_passwords(text: str) -> Iterable[str]:
    from urllib.parse import unquote

    for match in _USERINFO.finditer(text):
        _, sep, password = match.group("userinfo").partition(":")
        if sep and password:
            yield password
            yield unquote(password)


def _scrub_values(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _scrub_values(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_scrub_values(v) for v in data]
    if isinstance(data, str):
        return scrub(data)
    return data


def scrub_event(event: dict) -> bool:
    """Mask secrets in an ansible-runner event in place (ansible-runner writes this very dict to
    job_events); True when there was something to mask, i.e. a task let a secret through."""
    if not needs_scrub(json.dumps(event, default=str)):
        return False
    clean = _scrub_values(event)
    event.clear()
    event.update(clean)
    return True


def scrub_file(path: Path) -> bool:
    """Mask secrets in a text file in place (ansible-runner's stdout artifact); True if any."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    if not needs_scrub(text):
        return False
    path.write_text(scrub(text), encoding="utf-8")
    return True
