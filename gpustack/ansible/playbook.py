"""One playbook run as commands use it: the runner with the live view, and the host locks."""

from __future__ import annotations

import contextlib

from gpustack.ansible.invocation import HostOptions
from gpustack.ansible.results import RunResult
from gpustack.terminal import output


def play(playbook: str, inventory, variables: dict, opts: HostOptions, title: str,
         check=False, diff=False) -> RunResult:  # fmt: skip
    """One playbook run with the live progress view."""
    from gpustack.ansible import runner  # ansible-runner is imported only when hosts are contacted

    spec = runner.build_run_spec(
        playbook,
        inventory,
        variables,
        tags=opts.tags,
        skip_tags=opts.skip_tags,
        check=check,
        diff=diff,
        verbosity=opts.verbose,
        forks=opts.forks,
    )
    with output.LiveProgress(title, opts.verbose) as progress:
        return runner.run_playbook(spec, on_update=progress.update)


def host_locks(opts, inventory, check: bool = False):
    """The host locks of a run that changes hosts (none for check mode and dry runs); `opts.wait`
    waits for another run's locks instead of refusing. See gpustack/ansible/locks.py."""
    from gpustack.ansible import locks

    if check:
        return contextlib.nullcontext()

    def waiting(busy) -> None:
        output.stderr.print(f"Waiting: {locks.refusal(busy).message}", soft_wrap=True)

    return locks.hold(inventory, locks.command_line(), wait=opts.wait, on_wait=waiting)
