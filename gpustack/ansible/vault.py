"""Ansible Vault as ansible-playbook reads it: the same options, the same secrets, Ansible's code.

`--vault-password-file`, `--vault-id` and `--ask-vault-pass` (and Ansible's own settings:
ANSIBLE_VAULT_PASSWORD_FILE, ANSIBLE_VAULT_IDENTITY_LIST, ansible.cfg) are read once per
command by `ansible.cli.CLI.setup_vault_secrets`, exactly as ansible-playbook's start does, so
gpustack can check an inventory's and `-e` files' vaulted values before any host is contacted.
The playbook run gets the same options (absolute paths; prompted passwords answered through
ansible-runner's `passwords`, which stay in memory) and decrypts on its own: gpustack never
writes a decrypted value to disk. Every value decrypted here is registered with
gpustack/credentials.py, so it is masked wherever gpustack prints.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpustack import credentials
from gpustack.errors import BadInput

VAULT_HINT = (
    "give the vault password: --vault-password-file FILE, --vault-id [ID@]FILE, "
    "--ask-vault-pass, or ANSIBLE_VAULT_PASSWORD_FILE (as for ansible-playbook)"
)
_PROMPTS = ("prompt", "prompt_ask_vault_pass")


@dataclass(frozen=True)
class VaultOptions:
    """The vault options of a command line, as ansible-playbook takes them."""

    password_files: tuple[str, ...] = ()
    vault_ids: tuple[str, ...] = ()
    ask_vault_pass: bool = False


@dataclass
class _Configured:
    options: VaultOptions | None = None
    secrets: list = field(default_factory=list)  # [(vault_id, VaultSecret)]
    args: list[str] = field(default_factory=list)  # for ansible-playbook
    env: dict[str, str] = field(default_factory=dict)
    answers: dict[str, str] = field(default_factory=dict)  # prompt regex -> password


_STATE = _Configured()
# The list handed to Ansible's VaultSecretsContext (initialised once per process); it is
# gpustack's own list, filled by `setup`.
_CONTEXT_SECRETS: list = []


def _absolute(slug: str) -> str:
    """`ID@path` or `path` with the path made absolute (the playbook runs in another directory);
    prompts stay prompts."""
    vault_id, sep, source = slug.rpartition("@") if "@" in slug else ("", "", slug)
    if source in _PROMPTS:
        return slug
    return f"{vault_id}{sep}{Path(source).expanduser().resolve()}"


def _check_sources(options: VaultOptions) -> None:
    for slug in (*options.password_files, *options.vault_ids):
        source = slug.rpartition("@")[2] if slug in options.vault_ids else slug
        if source in _PROMPTS:
            continue
        if source == "-":
            raise BadInput(
                f"vault password from standard input ({slug!r})",
                "gpustack reads the password once and the playbook needs it again: "
                "use --ask-vault-pass or a password file",
            )
        path = Path(source).expanduser()
        if not path.is_file() or not os.access(path, os.R_OK):
            raise BadInput(
                f"vault password file {source} does not exist or is not readable",
                "pass the path of a readable file (or an executable script) holding the password",
            )


def _setup_vault_secrets(loader, vault_ids: list[str], options: VaultOptions) -> list:
    from ansible.cli import CLI

    kwargs: dict[str, Any] = {
        "vault_ids": vault_ids,
        "vault_password_files": list(options.password_files),
        "ask_vault_pass": options.ask_vault_pass,
        "auto_prompt": False,
    }
    if "initialize_context" in inspect.signature(CLI.setup_vault_secrets).parameters:
        kwargs["initialize_context"] = False  # gpustack initialises it once, below
    return CLI.setup_vault_secrets(loader, **kwargs)


def _initialise_context() -> None:
    """Ansible's VaultSecretsContext (ansible-core 2.19+) decrypts inline `!vault` values; it can
    be initialised once per process, with gpustack's own list that `setup` fills."""
    from ansible.parsing import vault

    context = getattr(vault, "VaultSecretsContext", None)
    if context is not None and context.current(optional=True) is None:
        context.initialize(context(_CONTEXT_SECRETS))


def setup(options: VaultOptions | None = None) -> None:
    """Read the vault secrets (password files, scripts, prompts) once per command."""
    options = options or VaultOptions()
    if _STATE.options == options:
        return
    _check_sources(options)
    from ansible import constants as C
    from ansible.errors import AnsibleError
    from ansible.parsing.dataloader import DataLoader

    prompts = options.ask_vault_pass or any(s.endswith("@prompt") for s in options.vault_ids)
    if prompts and not sys.stdin.isatty():
        raise BadInput(
            "--ask-vault-pass (or --vault-id ID@prompt) needs a terminal",
            "use --vault-password-file FILE when gpustack runs without a terminal",
        )
    vault_ids = list(C.DEFAULT_VAULT_IDENTITY_LIST or []) + list(options.vault_ids)
    warnings = io.StringIO()
    try:
        with contextlib.redirect_stderr(warnings):
            secrets = _setup_vault_secrets(DataLoader(), vault_ids, options)
    except AnsibleError as exc:
        raise BadInput(f"vault password: {one_line(exc)}", VAULT_HINT) from None
    except EOFError:
        raise BadInput("no vault password was entered", VAULT_HINT) from None
    _STATE.options = options
    _STATE.secrets = list(secrets)
    _CONTEXT_SECRETS[:] = _STATE.secrets
    _initialise_context()
    _STATE.args, _STATE.answers = [], {}
    for path in options.password_files:
        _STATE.args += ["--vault-password-file", _absolute(path)]
    for slug in options.vault_ids:
        _STATE.args += ["--vault-id", _absolute(slug)]
    if options.ask_vault_pass:
        _STATE.args.append("--ask-vault-pass")
    from ansible.parsing.vault import PromptVaultSecret

    for vault_id, secret in _STATE.secrets:  # prompted secrets: answered again for the playbook
        if not isinstance(secret, PromptVaultSecret):
            continue
        password = (secret.bytes or b"").decode("utf-8", errors="surrogateescape")
        credentials.register(password)
        if options.ask_vault_pass and vault_id == C.DEFAULT_VAULT_IDENTITY:
            _STATE.answers[r"^Vault password:\s*?$"] = password
        _STATE.answers[rf"^Vault password \({re.escape(vault_id)}\):\s*?$"] = password
    _STATE.env = {}
    if C.DEFAULT_VAULT_PASSWORD_FILE:
        _STATE.env["ANSIBLE_VAULT_PASSWORD_FILE"] = _absolute(str(C.DEFAULT_VAULT_PASSWORD_FILE))
    if C.DEFAULT_VAULT_IDENTITY_LIST:
        _STATE.env["ANSIBLE_VAULT_IDENTITY_LIST"] = ",".join(
            _absolute(s) for s in C.DEFAULT_VAULT_IDENTITY_LIST
        )


def loader():
    """A DataLoader that decrypts with the command's vault secrets (what ansible-playbook's
    `_play_prereqs` builds)."""
    from ansible.parsing.dataloader import DataLoader

    if _STATE.options is None:
        setup()
    data_loader = DataLoader()
    data_loader.set_vault_secrets(_STATE.secrets)
    return data_loader


def playbook_args() -> list[str]:
    """ansible-playbook options that give the run the same vault secrets."""
    return list(_STATE.args)


def playbook_env() -> dict[str, str]:
    """Ansible's own vault settings, with absolute paths, for the run's environment."""
    return dict(_STATE.env)


def prompt_answers() -> dict[str, str]:
    """ansible-runner `passwords`: the answers to the run's vault prompts (memory only)."""
    return dict(_STATE.answers)


def has_secrets() -> bool:
    return bool(_STATE.secrets)


def one_line(exc: BaseException) -> str:
    """Ansible's message of `exc` on one line, without decrypted text (messages never hold
    plaintext, but a caller's may: scrubbed)."""
    text = getattr(exc, "message", None) or str(exc) or type(exc).__name__
    text = " ".join(str(text).split())
    return credentials.scrub(text)


def is_vault_error(exc: BaseException) -> bool:
    """Whether `exc` (or what caused it) is Ansible failing to decrypt vaulted data."""
    from ansible.errors import AnsibleError
    from ansible.parsing.vault import AnsibleVaultError

    seen = 0
    while exc is not None and seen < 10:
        if isinstance(exc, (AnsibleVaultError, ReferenceError)):
            return True
        if isinstance(exc, AnsibleError) and "vault" in str(getattr(exc, "message", "")).lower():
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def refusal(where: str, exc: BaseException) -> BadInput:
    """The BadInput for vaulted data that could not be decrypted at `where`."""
    if not _STATE.secrets:
        return BadInput(f"{where} holds vault-encrypted data and no vault password was given",
                        VAULT_HINT)  # fmt: skip
    return BadInput(
        f"{where}: vault-encrypted data could not be decrypted ({one_line(exc)})",
        "check the vault password (or --vault-id ID@FILE for data encrypted with a vault ID)",
    )


def decrypted(value: Any) -> Any:
    """`value` with every vaulted string decrypted to a plain str, registered as a secret."""
    from ansible.parsing import vault

    helper = getattr(vault, "VaultHelper", None)
    kinds = tuple(
        k
        for k in (
            getattr(vault, "EncryptedString", None),
            _legacy_encrypted_type(),
        )
        if k is not None
    )
    if kinds and isinstance(value, kinds):
        text = str(str(value))
        register(text)
        return text
    if (
        helper is not None
        and isinstance(value, str)
        and helper.get_ciphertext(value, with_tags=False)
    ):
        register(str(value))  # a decrypted value (VaultedValue tag)
    return value


MIN_MASKED = 4  # shorter vaulted values (a port, a flag) are not masked: it would blank out text


def register(text: str) -> None:
    """Mask a value that came out of vault wherever gpustack prints (gpustack/credentials.py)."""
    if len(text.strip()) >= MIN_MASKED:
        credentials.register(text)


def _legacy_encrypted_type():
    """ansible-core before 2.19: AnsibleVaultEncryptedUnicode (a str subclass)."""
    try:
        from ansible.parsing.yaml.objects import AnsibleVaultEncryptedUnicode
    except ImportError:
        return None
    from ansible.parsing import vault

    return None if hasattr(vault, "EncryptedString") else AnsibleVaultEncryptedUnicode


def file_is_encrypted(path: Path) -> bool:
    from ansible.parsing.vault import is_encrypted_file

    try:
        with path.open("rb") as handle:
            return bool(is_encrypted_file(handle))
    except OSError:
        return False
