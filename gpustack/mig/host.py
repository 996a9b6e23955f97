"""The real MIG applier: playbooks/mig.yml (gpu_preflight + nvidia_mig) on one host.

The layout comes from the caller (the node's `nvidia.com/mig.config` label); the role's own
`gpustack_mig` fact is the outcome. The flow decides about reboots: its apply runs with
`nvidia_mig_reboot=never`, its reboot with `if_needed` (the role then records `rebooting`,
reboots, waits for gpustack-mig.service and reports what the unit recorded at boot).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from gpustack.ansible.inventory import Inventory
from gpustack.mig.reconfigure import MigOutcome

PLAYBOOK = "mig.yml"


class AnsibleMigApplier:
    def __init__(self, inventory: Inventory, extravars: dict[str, Any], verbose: int = 0):
        self.inventory = inventory
        self.extravars = extravars
        self.verbose = verbose
        self.artifacts: dict[str, str] = {}  # host -> artifacts of its last run

    def _run(self, host: str, layout: str, check: bool, reboot: str) -> MigOutcome:
        from gpustack.ansible import runner  # ansible-runner only when hosts are contacted

        one_host = dataclasses.replace(self.inventory, hosts=[host])
        variables = {**self.extravars, "nvidia_mig_config": layout, "nvidia_mig_reboot": reboot}
        spec = runner.build_run_spec(
            PLAYBOOK, one_host, variables, check=check, verbosity=self.verbose
        )
        result = runner.run_playbook(spec)
        self.artifacts[host] = result.artifacts_dir
        outcome = result.hosts.get(host)
        if outcome is None:
            return MigOutcome(ran=False, reason=f"{host} did not run (rc {result.rc})")
        if outcome.unreachable:
            return MigOutcome(ran=False, reason=f"unreachable: {outcome.unreachable_message}")
        fact = outcome.facts.get("gpustack_mig")
        if fact:  # the role's verdict, also when its last task failed the host on it
            return MigOutcome.from_fact(fact)
        failure = outcome.failures[-1] if outcome.failures else None
        reason = f"{failure.task}: {failure.message}" if failure else f"rc {result.rc}"
        return MigOutcome(ran=False, reason=reason)

    def __call__(self, host: str, layout: str, check: bool) -> MigOutcome:
        return self._run(host, layout, check, "never")

    def reboot(self, host: str, layout: str) -> MigOutcome:
        return self._run(host, layout, False, "if_needed")
