"""`gpustack upgrade`: check every input, open or resume the run, roll it out, report."""

from __future__ import annotations

import contextlib
import signal
import sys
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from gpustack.ansible.input_formats import DriverInputs
from gpustack.ansible.invocation import check_output, check_writable, invocation, user_extravars
from gpustack.ansible.playbook import host_locks
from gpustack.ansible.vault import VaultOptions
from gpustack.errors import BadInput, ExitCode, GpustackError, canceled_exit_code
from gpustack.terminal import output
from gpustack.terminal.upgrade_view import UpgradeLive, counts, node_rows, print_plan, print_summary
from gpustack.upgrade.backend import HostOnlyBackend, StepOptions
from gpustack.upgrade.executors import ThreadExecutor
from gpustack.upgrade.orchestrator import Orchestrator, RolloutPolicy, RolloutResult
from gpustack.upgrade.planner import Limits, NodeView, plan_batches, resolve_max_unavailable
from gpustack.upgrade.session import open_run
from gpustack.upgrade.state import FileStateStore, Target, UpgradeRun, UpgradeState, state_path_for


@dataclass
class UpgradeOptions:
    inventory: str
    driver_version: str = ""
    driver_branch: str = ""
    max_unavailable: str = "25%"
    max_parallel: int = 1
    canary: int = 0
    canary_pause: float = 0
    yes: bool = False
    drain: bool = False
    pod_selector: str = ""
    wait_for_jobs_timeout: float = 0
    pod_deletion_timeout: float = 300
    force: bool = False
    drain_timeout: float = 300
    validation_timeout: float = 600
    max_failures: int = 0
    resume: bool = False
    retry_failed: bool = False
    dry_run: bool = False
    kubeconfig: str | None = None
    limit: str | None = None
    extra_vars: list[str] | None = None
    output: str = "text"
    report: str | None = None
    verbose: int = 0
    wait: bool = False
    forks: int | None = None  # refused: every playbook run of an upgrade has one host
    vault: VaultOptions = field(default_factory=VaultOptions)
    delete_emptydir_data: bool = False
    drain_pod_selector: str = ""  # kubectl drain --pod-selector: which other pods --drain takes


def _target(opts: UpgradeOptions, extravars: dict[str, Any]) -> Target:
    version, branch = opts.driver_version.strip(), opts.driver_branch.strip()
    if not version and not branch:
        raise BadInput(
            "upgrade needs a target driver",
            "pass --driver-version (e.g. 535.309.01-0+deb12u1) or --driver-branch (e.g. 580)",
        )
    try:
        DriverInputs.model_validate(
            {"nvidia_driver_version": version, "nvidia_driver_branch": branch}
        )
    except ValidationError as exc:
        err = exc.errors()[0]
        flag = "--driver-version" if err["loc"][0] == "nvidia_driver_version" else "--driver-branch"
        raise BadInput(
            f"{flag}: {err['msg'].removeprefix('Value error, ')}",
            "e.g. --driver-version 535.309.01-0+deb12u1 or --driver-branch 580",
        ) from None
    for key, value in (("nvidia_driver_version", version), ("nvidia_driver_branch", branch)):
        given = str(extravars.get(key, "")).strip()
        if given and value and given != value:
            raise BadInput(
                f"-e {key}={given} disagrees with the upgrade target {value}",
                f"drop -e {key}; the --driver-* option sets it",
            )
    return Target(version=version, branch=branch if not version else "")


def run_upgrade(opts: UpgradeOptions, upgrader_factory=None, target_check=None) -> int:
    """Exit code of `gpustack upgrade`. `upgrader_factory` lets tests inject a host upgrader,
    `target_check` the check that every node can have the target (`host.check_target`'s
    signature; with an injected upgrader and no check, none runs: no host is contacted)."""
    check_output(opts.output)
    if opts.report:
        check_writable(opts.report)
    if opts.retry_failed and not opts.resume:
        raise BadInput("--retry-failed only applies with --resume", "add --resume")
    if opts.forks is not None:
        raise BadInput(
            "--forks does not apply to upgrade (each node is its own playbook run)",
            "use --max-parallel to upgrade more nodes at once",
        )
    extravars = user_extravars(opts.extra_vars, opts.vault)
    target = _target(opts, extravars)
    if opts.driver_version:
        extravars["nvidia_driver_version"] = target.version
    if target.branch:
        extravars["nvidia_driver_branch"] = target.branch
    # The node is drained: loading the new driver by a reboot, when needed, is safe now.
    extravars.setdefault("nvidia_driver_reboot", "if_needed")
    if opts.drain_pod_selector and not opts.drain:
        raise BadInput(
            "--pod-selector chooses which pods --drain evicts: it needs --drain",
            "add --drain, or leave --pod-selector out (GPU pods are evicted either way)",
        )
    # the same checks as every command: role inputs of -e and of the inventory, kubeconfig
    inventory, extravars, kubeconfig = invocation(
        opts.inventory,
        opts.limit,
        extravars,
        opts.kubeconfig,
        "pass the path of a kubeconfig file, or leave --kubeconfig out for a host-only fleet",
    )
    if not kubeconfig:
        cluster_only = (("--drain", opts.drain), ("--force", opts.force),
                        ("--delete-emptydir-data", opts.delete_emptydir_data),
                        ("--wait-for-jobs", bool(opts.pod_selector)),
                        ("--pod-selector", bool(opts.drain_pod_selector)))  # fmt: skip
        given = [flag for flag, on in cluster_only if on]
        if given:
            raise BadInput(
                f"{', '.join(given)} only apply with a cluster: this upgrade is host-only",
                "pass --kubeconfig (or set KUBECONFIG), or leave them out",
            )
    limits = Limits(
        resolve_max_unavailable(opts.max_unavailable, len(inventory.hosts)), opts.max_parallel
    )
    backend = _backend(kubeconfig, inventory, extravars)
    if kubeconfig:  # refused by the API server before any node is touched
        backend.check_selectors({"--wait-for-jobs": opts.pod_selector,
                                 "--pod-selector": opts.drain_pod_selector})  # fmt: skip
    # The state is read under the host locks: a second run (e.g. two --resume) waits or is
    # refused before it reads a record the first is still writing (gpustack/ansible/locks.py).
    with host_locks(opts, inventory, check=opts.dry_run):
        store = FileStateStore(state_path_for(inventory.path))
        existing = store.load()
        label_states = (
            backend.recorded_states(inventory.hosts) if backend.mode != "host-only" else None
        )
        run = open_run(
            existing,
            inventory=inventory.path,
            target=target,
            hosts=inventory.hosts,
            mode=backend.mode,
            resume=opts.resume,
            state_file=store.path,
            label_states=label_states,
        )
        policy = RolloutPolicy(
            limits=limits,
            max_failures=opts.max_failures,
            canary=opts.canary,
            canary_pause=opts.canary_pause,
            assume_yes=opts.yes,
            retry_failed=opts.retry_failed,
            steps=StepOptions(
                drain=opts.drain,
                pod_selector=opts.pod_selector,
                wait_for_jobs_timeout=opts.wait_for_jobs_timeout,
                pod_deletion_timeout=opts.pod_deletion_timeout,
                force=opts.force,
                delete_emptydir_data=opts.delete_emptydir_data,
                drain_pod_selector=opts.drain_pod_selector,
                drain_timeout=opts.drain_timeout,
                validation_timeout=opts.validation_timeout,
            ),
        )
        if opts.dry_run:
            return _dry_run(opts, run, inventory.hosts, backend, policy, store.path)

        conditions = backend.conditions(inventory.hosts)
        activity: dict[str, str] = {}
        if upgrader_factory is None:
            from gpustack.upgrade.host import AnsibleHostUpgrader, check_target

            upgrade_host = AnsibleHostUpgrader(inventory, extravars, opts.verbose, activity)
            target_check = target_check or check_target
        else:
            upgrade_host = upgrader_factory(inventory, extravars)
        if target_check is not None:
            _check_target(opts, run, inventory, extravars, conditions, target, target_check)
        if not run.history:  # a new run: every node (but those labelled skip) is upgrade-required
            for name in inventory.hosts:
                if not conditions[name].skip:
                    backend.record_state(name, run.nodes[name].state)
        store.save(run)
        orch = Orchestrator(
            run,
            inventory.hosts,
            store,
            backend,
            upgrade_host,
            policy,
            ThreadExecutor(opts.max_parallel),
            confirm=output.confirm if sys.stdin.isatty() and not opts.yes else None,
        )
        orch.activity = activity
        title = f"gpustack upgrade → {target.describe()}"
        with _stop_on_signals(orch), UpgradeLive(orch, title, opts.verbose) as live:
            orch.notify = live.notify
            orch.on_transition = live.transition
            result = orch.execute()
        store.save(run)  # one snapshot: the journal of this run's transitions folded in
        return _finish(opts, run, orch, result, store.path, limits)


def _check_target(opts, run, inventory, extravars, conditions, target, target_check) -> None:
    """Before any node is taken out of service: every node the rollout would upgrade can have
    the target (its sources offer that version). A typo in --driver-version, or a version the
    archive does not carry, was found only on the first node, after its cordon and drain."""
    final = {UpgradeState.DONE} | (set() if opts.retry_failed else {UpgradeState.FAILED})
    hosts = [n for n in inventory.hosts
             if run.nodes[n].state not in final and not conditions[n].skip]  # fmt: skip
    if not hosts:
        return
    output.stderr.print(
        f"Checking that the sources offer {target.describe()} on {len(hosts)} node(s) "
        "before any is taken out of service…"
    )
    problems = target_check(inventory, hosts, extravars, opts.verbose)
    if not problems:
        return
    first, message = next(iter(problems.items()))
    reason, _, hint = (" ".join(part.split()) for part in message.partition(" Hint: "))  # one line
    others = f" (and {len(problems) - 1} more node(s))" if len(problems) > 1 else ""
    raise GpustackError(
        f"{first}: {reason.rstrip('.')}{others}. No node was taken out of service",
        hint
        or "fix the node or its sources (`gpustack doctor`), or leave it out with --limit, "
        "then run upgrade again",
        ExitCode.BAD_INPUT
        if all(m.startswith("Resolve the exact version") for m in problems.values())
        else ExitCode.HOST_FAILED,
    )


def _backend(kubeconfig: str | None, inventory, extravars):
    if not kubeconfig:
        return HostOnlyBackend()
    # only gpustack/k8s/cluster talks to Kubernetes
    from gpustack.k8s.cluster.upgrade import KubernetesBackend

    return KubernetesBackend.from_kubeconfig(kubeconfig, inventory, extravars)


@contextlib.contextmanager
def _stop_on_signals(orch: Orchestrator):
    """Ctrl-C and SIGTERM stop the rollout: in-flight nodes finish; a second one aborts them."""

    def handler(signum, frame):
        orch.request_stop()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def _document(opts, run: UpgradeRun, targets, skipped, state_file, limits) -> dict[str, Any]:
    return {
        "command": "upgrade",
        "mode": run.mode,
        "target": {"version": run.target.version, "branch": run.target.branch},
        "target_text": run.target.describe(),
        "state_file": str(state_file),
        "limits": {
            "max_unavailable": limits.max_unavailable,
            "max_parallel": limits.max_parallel,
            "canary": opts.canary,
            "max_failures": opts.max_failures,
        },
        "batches": run.batches,
        "nodes": node_rows(run, targets, skipped),
        "summary": counts(run, targets, skipped),
    }


def _dry_run(opts, run, targets, backend, policy, state_file) -> int:
    conditions = backend.conditions(targets)
    views = []
    for name in targets:
        cond = conditions.get(name)
        views.append(
            NodeView(
                name,
                run.nodes[name].state,
                bool(cond and cond.unavailable),
                bool(cond and cond.skip),
                run.durations.get(name),
            )
        )
    skipped = {n for n, c in conditions.items() if c.skip}
    canary = 0 if run.canary_done else policy.canary
    plan = plan_batches(views, policy.limits, canary=canary, retry_failed=policy.retry_failed)
    doc = _document(opts, run, targets, skipped, state_file, policy.limits)
    measured = sum(1 for v in views if v.expected is not None)
    doc.update({"dry_run": True, "plan": plan, "status": "planned", "exit_code": 0,
                "measured_nodes": measured})  # fmt: skip
    output.emit(doc, opts.report, opts.output, lambda: print_plan(doc))
    return int(ExitCode.OK)


def _exit_code(result: RolloutResult, summary: dict[str, int]) -> ExitCode:
    if result.status == "interrupted":
        return canceled_exit_code()
    if result.status in ("failed", "blocked") or summary["failed"]:
        return ExitCode.HOST_FAILED
    return ExitCode.OK


def _finish(opts, run, orch, result: RolloutResult, state_file, limits) -> int:
    skipped = {n for n, c in orch.conditions.items() if c.skip}
    doc = _document(opts, run, orch.targets, skipped, state_file, limits)
    code = _exit_code(result, doc["summary"])
    message = {
        "failed": f"Rollout stopped: {result.message}.",
        "blocked": f"Rollout blocked: {result.message}.",
        "interrupted": "Rollout interrupted; continue with --resume.",
        "paused": "Rollout paused after the canary batch; continue with --resume.",
    }.get(result.status, "")
    if result.status == "done" and doc["summary"]["failed"]:
        message = "Failed nodes remain; retry them with --resume --retry-failed."
    doc.update(
        {"dry_run": False, "status": result.status, "message": message, "exit_code": int(code)}
    )
    output.emit(doc, opts.report, opts.output, lambda: print_summary(doc))
    return int(code)
