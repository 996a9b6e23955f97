"""One error model for every command: a message, a hint and a documented exit code."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit codes documented in the README."""

    OK = 0
    HOST_FAILED = 1
    BAD_INPUT = 2
    VERIFY_FAILED = 3
    UNREACHABLE = 4
    DRIFT = 5
    BUSY = 6
    CANCELED = 130
    TERMINATED = 143


_SIGTERM = {"seen": False}


def note_sigterm() -> None:
    """Called by the CLI's SIGTERM handler: a run canceled from now on was terminated."""
    _SIGTERM["seen"] = True


def canceled_exit_code() -> ExitCode:
    """A canceled run's exit code, in its report as in the process's status: 143 after a
    SIGTERM, 130 after Ctrl-C."""
    return ExitCode.TERMINATED if _SIGTERM["seen"] else ExitCode.CANCELED


class GpustackError(Exception):
    """A predictable failure: printed as `Error:` + `Hint:`, never as a traceback."""

    exit_code: ExitCode = ExitCode.HOST_FAILED

    def __init__(self, message: str, hint: str = "", exit_code: ExitCode | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code


class BadInput(GpustackError):
    """The user's input is wrong; nothing has been run on any host."""

    exit_code = ExitCode.BAD_INPUT


class LabError(GpustackError):
    """The local podman lab could not be brought up or down."""
