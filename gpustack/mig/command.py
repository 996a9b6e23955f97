"""`gpustack mig`: bring every node to the MIG layout its `nvidia.com/mig.config` label names.

One node at a time (its GPUs are out of service while they change), with the sequence of
gpustack/mig/reconfigure.py, the cluster side of gpustack/k8s/cluster/mig.py and the nvidia_mig
role on the host (gpustack/mig/host.py).
"""

from __future__ import annotations

from dataclasses import asdict

from gpustack.ansible import playbook
from gpustack.ansible.invocation import HostOptions, validate
from gpustack.errors import BadInput, ExitCode
from gpustack.mig.reconfigure import FAILED, reconfigure_node
from gpustack.terminal import output
from gpustack.upgrade.backend import StepOptions
from gpustack.upgrade.executors import RealClock


def run_mig(opts: HostOptions, steps: StepOptions, reboot: bool = False) -> int:
    validated = validate(opts)
    if not validated.kubeconfig:
        raise BadInput(
            "gpustack mig reads each node's nvidia.com/mig.config label: it needs a cluster",
            "pass --kubeconfig (or set KUBECONFIG); without Kubernetes, set nvidia_mig_config "
            "per host and run playbooks/mig.yml (docs/mig.md)",
        )
    from gpustack.k8s.cluster.mig import connect_backend
    from gpustack.mig.host import AnsibleMigApplier

    inventory, extravars = validated.inventory, validated.extravars
    backend, strategy = connect_backend(validated.kubeconfig, inventory, extravars)
    applier = AnsibleMigApplier(inventory, extravars, opts.verbose)
    results = []
    with playbook.host_locks(opts, inventory):
        for host in inventory.hosts:
            rebooter = applier.reboot if reboot else None
            results.append(
                reconfigure_node(host, backend, applier, RealClock(), steps, strategy, rebooter)
            )
    failed = [r for r in results if r.state == FAILED]
    code = int(ExitCode.HOST_FAILED if failed else ExitCode.OK)
    doc = {
        "command": "mig",
        "mig_strategy": strategy,
        "nodes": {r.host: {**asdict(r), "artifacts": applier.artifacts.get(r.host, "")}
                  for r in results},
        "exit_code": code,
    }  # fmt: skip

    def text() -> None:
        for r in results:
            output.stdout.print(
                f"{r.host}: {r.config or '-'} {r.state or 'no label'}: {r.reason}", soft_wrap=True
            )
            for step in r.steps if opts.verbose else []:
                output.stdout.print(f"  {step}", soft_wrap=True)

    output.emit(doc, opts.report, opts.output, text)
    return code
