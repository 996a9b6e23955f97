"""The real host upgrader: the driver role on one host, through gpustack.ansible.runner."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from gpustack.ansible.inventory import Inventory
from gpustack.upgrade.backend import HostOutcome

PLAYBOOK = "upgrade.yml"  # gpu_preflight + nvidia_driver
CHECK_PLAYBOOK = "upgrade_check.yml"  # gpu_preflight + the driver's sources and version


def check_target(
    inventory: Inventory, hosts: list[str], extravars: dict[str, Any], verbose: int = 0
) -> dict[str, str]:
    """The hosts that cannot have the target driver, each with why (the driver role's own
    message); empty when all can. One run over `hosts`, before any of them is taken out of
    service. A canceled run raises KeyboardInterrupt (the command's Ctrl-C/SIGTERM path)."""
    from gpustack.ansible import runner

    subset = dataclasses.replace(inventory, hosts=list(hosts))
    result = runner.run_playbook(
        runner.build_run_spec(CHECK_PLAYBOOK, subset, extravars, verbosity=verbose)
    )
    if result.status == "canceled":
        raise KeyboardInterrupt
    problems = {}
    for name in hosts:
        host = result.hosts.get(name)
        if host is None or host.status == "not run":
            problems[name] = "the check did not run on it"
        elif host.unreachable:
            problems[name] = f"unreachable: {host.unreachable_message}"
        elif host.failures:
            problems[name] = host.failures[-1].message
        elif host.status == "stopped":
            problems[name] = "the check stopped before its end"
    return problems


class AnsibleHostUpgrader:
    """Runs playbooks/upgrade.yml limited to one host; reports the role's gpustack_driver fact."""

    def __init__(
        self,
        inventory: Inventory,
        extravars: dict[str, Any],
        verbose: int = 0,
        activity: dict[str, str] | None = None,
    ):
        self.inventory = inventory
        self.extravars = extravars
        self.verbose = verbose
        self.activity = activity if activity is not None else {}

    def __call__(self, host: str, cancel: Callable[[], bool], clock=None) -> HostOutcome:
        from gpustack.ansible import (
            runner,  # ansible-runner is imported only when hosts are contacted
        )

        one_host = dataclasses.replace(self.inventory, hosts=[host])
        spec = runner.build_run_spec(PLAYBOOK, one_host, self.extravars, verbosity=self.verbose)

        def progress(tracker, _event) -> None:
            current = tracker.hosts.get(host)
            if current and current.current_task:
                self.activity[host] = f"{current.current_role} : {current.current_task}"

        result = runner.run_playbook(spec, on_update=progress, cancel=cancel)
        outcome = result.hosts.get(host)
        artifacts = result.artifacts_dir
        if result.status == "canceled":
            return HostOutcome(ok=False, reason="canceled", artifacts=artifacts, canceled=True)
        if outcome is None:
            return HostOutcome(ok=False, reason="host did not run", artifacts=artifacts)
        driver = outcome.facts.get("gpustack_driver") or {}
        if outcome.unreachable:
            return HostOutcome(
                ok=False, reason=f"unreachable: {outcome.unreachable_message}", artifacts=artifacts
            )
        if outcome.failed or result.exit_code:
            failure = outcome.failures[-1] if outcome.failures else None
            reason = f"{failure.task}: {failure.message}" if failure else f"rc {result.rc}"
            return HostOutcome(ok=False, reason=reason, driver=driver, artifacts=artifacts)
        return HostOutcome(ok=True, driver=driver, artifacts=artifacts)
