"""The only module that talks to ansible-runner: run a playbook, stream its events, fold results.

Events flow from ansible-runner's thread through a queue to the caller's thread, which feeds
the RunTracker and the live display; nothing here parses ansible's stdout.
"""

from __future__ import annotations

import json
import os
import queue
import shlex
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ansible_runner

from gpustack import credentials, paths
from gpustack.ansible import extravars as extra_vars
from gpustack.ansible import settings, vault
from gpustack.ansible.results import RunResult, RunTracker

KEEP_RUNS = 20
# How often ansible-runner asks whether the run was canceled (seconds).
CANCEL_POLL_S = 0.2
_FINISHED = object()  # queued by ansible-runner's finished callback, after every event
RUN_MIN_AGE_S = 24 * 3600  # a run directory this young may belong to a run still going


@dataclass(frozen=True)
class RunSpec:
    """Everything one ansible-playbook run needs; built by `build_run_spec`, a pure function."""

    playbook: Path
    inventory: Path
    target_group: str
    hosts: list[str]
    extravars: dict[str, Any] = field(default_factory=dict)
    tags: str = ""
    skip_tags: str = ""
    check: bool = False
    diff: bool = False
    verbosity: int = 0
    requested_forks: int | None = None  # -f/--forks; None: the default below

    @property
    def forks(self) -> int:
        """-f/--forks as given, else one fork per host (at least Ansible's 5, at most 50)."""
        return self.requested_forks or max(5, min(50, len(self.hosts)))

    def cmdline(self) -> str:
        flags = []
        if self.check:
            flags.append("--check")
        if self.diff:
            flags.append("--diff")
        return " ".join(flags)

    def envvars(self) -> dict[str, str]:
        return {
            "ANSIBLE_ROLES_PATH": str(paths.roles_dir()),
            # The roles call their modules and filters as gpustack.gpustack.* (plugins/).
            "ANSIBLE_COLLECTIONS_PATH": str(paths.collections_path()),
            # pipelining, ControlPersist, ...: what every runner of the roles gets (settings.py)
            **settings.environment(),
            # the inventory was read with these two plugins (inventory.py)
            "ANSIBLE_INVENTORY_ENABLED": "ini,yaml",
            "ANSIBLE_RETRY_FILES_ENABLED": "False",
            "ANSIBLE_FORCE_COLOR": "False",
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            # ANSIBLE_VAULT_PASSWORD_FILE / _IDENTITY_LIST as gpustack read them, paths absolute
            **vault.playbook_env(),
        }


def build_run_spec(
    playbook: str,
    inventory,
    extravars=None,
    *,
    tags="",
    skip_tags="",
    check=False,
    diff=False,
    verbosity=0,
    forks=None,
) -> RunSpec:
    """Pure: the run for `playbook` over an already validated Inventory."""
    variables = {"gpustack_target": inventory.target_group, **(extravars or {})}
    return RunSpec(
        playbook=paths.playbook(playbook),
        inventory=inventory.path,
        target_group=inventory.target_group,
        hosts=list(inventory.hosts),
        extravars=variables,
        tags=tags or "",
        skip_tags=skip_tags or "",
        check=check,
        diff=diff,
        verbosity=verbosity,
        requested_forks=forks,
    )


def runs_dir() -> Path:
    return paths.state_root() / "runs"


def _private_data_dir(playbook: Path) -> Path:
    root = runs_dir()
    root.mkdir(parents=True, exist_ok=True)
    old = sorted(p for p in root.iterdir() if p.is_dir())
    for stale in old[:-KEEP_RUNS]:  # keep the newest, and any that may still be in use
        if time.time() - stale.stat().st_mtime > RUN_MIN_AGE_S:
            shutil.rmtree(stale, ignore_errors=True)
    stamp = time.strftime("%Y%m%dT%H%M%S")
    # mkdtemp: runs started in parallel (rolling upgrades) in the same second stay apart.
    run_dir = Path(tempfile.mkdtemp(prefix=f"{stamp}-{os.getpid()}-{playbook.stem}-", dir=root))
    (run_dir / "env").mkdir(parents=True, exist_ok=True)
    return run_dir


def _secret_vars(data_dir: Path, variables: dict) -> tuple[dict, Path | None]:
    """(plain extra vars, path of a 0600 file holding the secret ones, or None)."""
    plain, secret = credentials.split_extravars(variables)
    for stale in runs_dir().glob("*/secret-vars.json"):  # left by a killed run
        if time.time() - stale.stat().st_mtime > 600:  # read within seconds by its own run
            stale.unlink(missing_ok=True)
    if not secret:
        return plain, None
    path = data_dir / "secret-vars.json"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(secret, fh)
    return plain, path


def ansible_playbook() -> str:
    """The `ansible-playbook` that ansible-core installed beside this Python (a venv's bin), else
    the first on PATH: ansible-core's own command, unpatched."""
    beside = Path(sys.executable).parent / "ansible-playbook"
    return (
        str(beside) if beside.exists() else shutil.which("ansible-playbook") or "ansible-playbook"
    )


def _guard(data_dir: Path, playbook: Path) -> Path:
    """ansible-playbook under childguard.py, so it dies with this process (SIGKILL too).
    ansible-runner passes every option to a custom binary but not the playbook: the shim adds it."""
    shim = data_dir / "ansible-playbook-guarded"
    python = shlex.quote(sys.executable)
    shim.write_text(
        f"#!/bin/sh\nexec {python} -m gpustack.ansible.childguard "
        f'{shlex.quote(ansible_playbook())} "$@" {shlex.quote(str(playbook))}\n',
        encoding="utf-8",
    )
    shim.chmod(0o755)
    return shim


@contextmanager
def _ctrl_c_cancels(canceled: dict[str, bool]) -> Iterator[None]:
    """The first Ctrl-C anywhere in a run asks the runner to stop ansible-playbook; the second
    interrupts. Without this, a Ctrl-C while ansible-runner was still starting could leave its
    thread and ansible-playbook running until the SSH timeout. Main thread only (signal's rule)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum, frame) -> None:
        if canceled["requested"]:
            raise KeyboardInterrupt
        canceled["requested"] = True

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def run_playbook(
    spec: RunSpec,
    on_update: Callable[[RunTracker, dict], None] | None = None,
    cancel: Callable[[], bool] | None = None,
) -> RunResult:
    """Run `spec`; `on_update` is called on the caller's thread after each event;
    `cancel() -> True` stops the run (as Ctrl-C does)."""
    canceled = {"requested": False}
    with _ctrl_c_cancels(canceled):
        return _run(spec, on_update, cancel, canceled)


def _run(
    spec: RunSpec,
    on_update: Callable[[RunTracker, dict], None] | None,
    cancel: Callable[[], bool] | None,
    canceled: dict[str, bool],
) -> RunResult:
    data_dir = _private_data_dir(spec.playbook)
    limit_file = data_dir / "limit.txt"
    limit_file.write_text("\n".join(spec.hosts) + "\n", encoding="utf-8")
    events: queue.Queue[dict] = queue.Queue()
    # `-e @FILE` items reach ansible-playbook as given (it reads and decrypts them itself), in
    # their order, before the values given inline, which win as they do on a command line.
    values, files = extra_vars.for_playbook(spec.extravars)
    # Secrets never reach ansible-runner's env/extravars: a 0600 file, gone once read.
    extravars, secret_file = _secret_vars(data_dir, values)
    options = [*vault.playbook_args(), *(a for f in files for a in ("-e", f"@{f}"))]
    if secret_file:
        options += ["-e", f"@{secret_file}"]
    cmdline = " ".join(filter(None, [spec.cmdline(), shlex.join(options)]))

    masked: list[str] = []

    def handler(event: dict) -> bool:
        if secret_file and event.get("event") == "playbook_on_start":
            secret_file.unlink(missing_ok=True)  # read (and cached) by now: inventory, vars
        if credentials.scrub_event(event):  # runner writes this very dict to job_events
            masked.append(str(event.get("event_data", {}).get("task") or event.get("event")))
        events.put(event)
        return True

    thread, runner = ansible_runner.run_async(
        private_data_dir=str(data_dir),
        binary=str(_guard(data_dir, spec.playbook)),
        playbook=str(spec.playbook),
        inventory=str(spec.inventory),
        limit=f"@{limit_file}",
        extravars=extravars,
        tags=spec.tags or None,
        skip_tags=spec.skip_tags or None,
        cmdline=cmdline or None,
        verbosity=spec.verbosity or None,
        forks=spec.forks,
        envvars=spec.envvars(),
        quiet=True,
        event_handler=handler,
        # --ask-vault-pass: ansible-playbook's prompt answered from memory; ansible-runner would
        # write `passwords` to env/passwords, so then no env/ file is written at all (extra
        # variables go on the command line; the secret ones stay in their 0600 file)
        passwords=vault.prompt_answers() or None,
        suppress_env_files=bool(vault.prompt_answers()),
        cancel_callback=lambda: canceled["requested"] or bool(cancel and cancel()),
        # ansible-runner asks cancel_callback once per pexpect wait, 5 s by default: a Ctrl-C or
        # SIGTERM left the playbook running up to 5 s more (tasks started in them included).
        settings={"pexpect_timeout": CANCEL_POLL_S},
        # after the last event: the loop below ends at once instead of at its next poll
        finished_callback=lambda _runner: events.put(_FINISHED),
    )
    tracker = RunTracker(spec.hosts)
    while True:
        try:
            try:
                event = events.get(timeout=0.1)
            except queue.Empty:
                if not thread.is_alive() and events.empty():
                    break  # the runner failed before its finished callback
                continue
            if event is _FINISHED:
                break
            tracker.handle(event)
            if on_update:
                on_update(tracker, event)
        except KeyboardInterrupt:
            if canceled["requested"]:
                raise
            canceled["requested"] = True  # runner stops ansible-playbook at its next check
    thread.join()
    tracker.ended()
    if secret_file:
        secret_file.unlink(missing_ok=True)
    if credentials.scrub_file(Path(runner.config.artifact_dir) / "stdout") or masked:
        # A task let a secret through (masked here): say which, without the secret.
        (Path(runner.config.artifact_dir) / "gpustack-masked.json").write_text(
            json.dumps({"events": masked}), encoding="utf-8"
        )
    return RunResult(
        playbook=spec.playbook.name,
        status=runner.status,
        rc=runner.rc if runner.rc is not None else -1,
        artifacts_dir=str(runner.config.artifact_dir),
        hosts=tracker.hosts,
    )
