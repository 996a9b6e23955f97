"""What each CLI command does, given parsed arguments; returns the exit code."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpustack.ansible import playbook, vault
from gpustack.ansible.extravars import parse_extra_vars
from gpustack.ansible.input_formats import check_extra_vars
from gpustack.ansible.input_specs import check_inputs, is_true
from gpustack.ansible.inventory import load_inventory
from gpustack.ansible.invocation import OUTPUTS, HostOptions, check_writable, validate
from gpustack.ansible.results import RunResult
from gpustack.ansible.vault import VaultOptions
from gpustack.errors import BadInput, ExitCode
from gpustack.fleet import doctor
from gpustack.terminal import output


def _run(
    opts: HostOptions, playbook_name: str, title: str, check=False, diff=False, validated=None
) -> tuple:
    inventory, extravars, kubeconfig = validated or validate(opts)
    result = playbook.play(playbook_name, inventory, extravars, opts, title, check, diff)
    return result, inventory, extravars, kubeconfig


def _finish(
    command: str, opts: HostOptions, result: RunResult, extra=None, text=None, code=None
) -> int:
    """Report, print, return the exit code (`code` when the command's own verdict decides it)."""
    code = int(result.exit_code) if code is None else int(code)
    doc = output.run_document(command, result, extra)
    doc["exit_code"] = code
    text = text or (lambda: output.print_run(result, opts.verbose))
    output.emit(doc, opts.report, opts.output, text)
    if result.exit_code:
        output.stderr.print(f"Artifacts of this run: {result.artifacts_dir}")
    return code


def install(
    opts: HostOptions,
    check: bool = False,
    diff: bool = False,
    junit: str | None = None,
    full: bool = False,
) -> int:
    validated = validate(opts)
    if junit:
        check_writable(junit)
    session = None
    if validated.kubeconfig:  # reach the cluster before any host is touched
        from gpustack.k8s.cluster import flow

        session = flow.prepare(
            validated.kubeconfig, validated.inventory, validated.extravars, workloads=True
        )
    from gpustack.ansible import converged_run

    extra: dict = {"check_mode": check}
    k8s = None
    with playbook.host_locks(opts, validated.inventory, check):
        result = converged_run.run_site(opts, validated, "gpustack install", check, diff, full)
        if session and result.status != "canceled":
            k8s = flow.install(session, result, check=check)
            extra["kubernetes"] = k8s.to_dict()
    return _finish_with_cluster("install", opts, result, extra, k8s, junit)


def verify(opts: HostOptions, junit: str | None = None) -> int:
    """Read-only host facts, then the cluster: capacity, verification pods, metrics."""
    from gpustack.k8s.cluster import flow

    validated = validate(opts)
    if junit:
        check_writable(junit)
    session = flow.prepare(
        validated.kubeconfig,
        validated.inventory,
        validated.extravars,
        required=True,
        workloads=True,
    )
    result, *_ = _run(opts, "verify.yml", "gpustack verify (read-only)", validated=validated)
    k8s = None
    if result.status != "canceled":
        k8s = flow.verify_cluster(session, result)
    extra = {"kubernetes": k8s.to_dict()} if k8s else {}
    return _finish_with_cluster("verify", opts, result, extra, k8s, junit)


def _finish_with_cluster(command, opts: HostOptions, result: RunResult, extra, k8s, junit) -> int:
    """_finish with the cluster's report after the hosts', JUnit if asked; a cluster check that
    failed on otherwise good hosts is exit code VERIFY_FAILED."""

    def show() -> None:
        output.print_run(result, opts.verbose)
        if k8s is not None:
            from gpustack.terminal.cluster_report import print_cluster

            print_cluster(k8s, opts.verbose)

    code = int(result.exit_code)
    if code == ExitCode.OK and k8s is not None and not k8s.passed:
        code = int(ExitCode.VERIFY_FAILED)  # in the report too, not only the process's exit
    code = _finish(command, opts, result, extra, text=show, code=code)
    if junit:
        from gpustack.terminal import junit as junit_xml

        cases = junit_xml.host_cases(result) + (junit_xml.node_cases(k8s.nodes) if k8s else [])
        junit_xml.write(junit, f"gpustack {command}", cases)
    return code


STOPPED = ("failed", "unreachable", "stopped")  # a host whose plan did not run to its end


def plan(opts: HostOptions, full: bool = False) -> int:
    from gpustack.ansible import converged_run

    title = "gpustack plan (check mode)"
    result = converged_run.run_site(opts, validate(opts), title, check=True, diff=True, full=full)
    return _finish_plan("plan", opts, result, {})


def _finish_plan(command: str, opts: HostOptions, result: RunResult, extra: dict) -> int:
    """A check-mode run: per host what would change (plan's summary), then the run's table."""
    from gpustack.fleet import plan_summary
    from gpustack.terminal import fleet_view

    plans = {name: plan_summary.summarize(host.changes) for name, host in result.hosts.items()}
    extra = {**extra, "check_mode": True, "plan": {n: p.to_dict() for n, p in plans.items()}}
    stopped = {n: h.status for n, h in result.hosts.items() if h.status in STOPPED}
    return _finish(
        command,
        opts,
        result,
        extra,
        text=lambda: (
            fleet_view.print_plan(plans, opts.verbose, stopped),
            output.print_run(result, opts.verbose),
        ),
    )


def _runtime_classes(inventory, extravars: dict) -> dict[str, str]:
    """gpustack_k8s_runtime_class per host as a play sees it ("nvidia" when unset)."""
    key = "gpustack_k8s_runtime_class"
    if key in extravars:
        return {host: str(extravars[key] or "") for host in inventory.hosts}
    from gpustack.k8s.manifests_vars import inventory_k8s_vars

    try:
        found = inventory_k8s_vars(inventory, extravars=extravars)
    except BadInput:  # a templated value: `install` reports it; doctor assumes the default
        found = {}
    return {h: str((found.get(h) or {}).get(key, "nvidia") or "") for h in inventory.hosts}


def _require_gpu(inventory, extravars: dict) -> dict[str, bool]:
    """gpustack_require_gpu per host as the roles (and status) see it: -e, else the inventory."""
    key = "gpustack_require_gpu"
    if key in extravars:
        return dict.fromkeys(inventory.hosts, is_true(extravars[key]))
    from gpustack.ansible.inventory import resolved_vars

    found = resolved_vars(inventory, lambda name: name == key)
    return {h: is_true((found.get(h) or {}).get(key, False)) for h in inventory.hosts}


def _cdi_needed(inventory, extravars: dict) -> dict[str, str]:
    """Per host, the setting that makes install turn CDI on in containerd ("" when none):
    container_runtime_enable_cdi and gpustack_k8s_gpu_allocation as a play sees them."""
    from gpustack.ansible.inventory import resolved_vars

    keys = ("container_runtime_enable_cdi", "gpustack_k8s_gpu_allocation")
    found = resolved_vars(inventory, lambda name: name in keys)
    chosen = {k: v for k, v in extravars.items() if k in keys}
    return {h: doctor.cdi_needed({**(found.get(h) or {}), **chosen}) for h in inventory.hosts}


def doctor_cmd(opts: HostOptions) -> int:
    result, inventory, extravars, _ = _run(opts, "preflight.yml", "gpustack doctor")
    require_gpu = _require_gpu(inventory, extravars)
    runtime_classes = _runtime_classes(inventory, extravars)
    cdi = _cdi_needed(inventory, extravars)
    problems = [
        p
        for name, host in result.hosts.items()
        if not host.unreachable
        for p in doctor.find_problems(
            name,
            host.facts,
            require_gpu.get(name, False),
            runtime_classes.get(name, "nvidia"),
            cdi.get(name, ""),
        )
    ]
    problems = doctor.run_problems(result.hosts) + problems
    extra = {"problems": [p.__dict__ for p in problems]}
    code = result.exit_code
    if code == ExitCode.OK and any(p.severity == "error" for p in problems):
        code = ExitCode.VERIFY_FAILED
    return _finish(
        "doctor",
        opts,
        result,
        extra,
        text=lambda: output.print_fleet(result, problems),
        code=code,
    )


def status(opts: HostOptions) -> int:
    from gpustack.fleet import converged
    from gpustack.fleet import status as fleet
    from gpustack.terminal import fleet_view

    validated = validate(opts, (*OUTPUTS, "wide"))
    # The input names whose resolved values the play publishes (gpustack_converged_desired).
    validated = validated._replace(
        extravars={**validated.extravars, **converged.extravars(record=False)}
    )
    inventory, extravars, kubeconfig = validated
    session = None
    if kubeconfig:  # reach the cluster before any host is contacted
        from gpustack.k8s.cluster import status as cluster_status

        session = cluster_status.prepare(kubeconfig, inventory, extravars)
    result, *_ = _run(opts, "status.yml", "gpustack status", validated=validated)
    k8s = cluster_status.read_nodes(session) if session else None
    rows = fleet.status_rows(
        result.hosts,
        k8s,
        fleet.upgrade_states(inventory.path),
        None if k8s else fleet.upgrade_target(inventory.path),
    )
    extra = {
        "nodes": {row.host: row.to_dict() for row in rows},
        "drift": {row.host: row.drift for row in rows if row.drift},
    }
    code = result.exit_code
    if code == ExitCode.OK and extra["drift"]:
        code = ExitCode.DRIFT
    return _finish(
        "status",
        opts,
        result,
        extra,
        text=lambda: (
            fleet_view.print_status(rows, k8s is not None, wide=opts.output == "wide"),
            output.print_unreachable(result),
        ),
        code=code,
    )


def smoke(opts: HostOptions, image: str | None = None, capture: str | None = None) -> int:
    """Read-only smoke suite (docs/gpu-hosts.md): the probe play, then the controller's checks."""
    from gpustack.smoke import checks
    from gpustack.terminal import smoke_view as view

    if image:
        opts.extra_vars = [*opts.extra_vars, json.dumps({"gpu_smoke_image": image})]
    if capture:
        if Path(capture).expanduser().exists() and not Path(capture).expanduser().is_dir():
            raise BadInput(f"--capture {capture} is not a directory", "pass a directory path")
        check_writable(str(Path(capture).expanduser() / "x"))
    result, *_ = _run(opts, "smoke.yml", "gpustack smoke (read-only)")
    hosts = [checks.host_smoke(name, host.facts) for name, host in result.hosts.items()]
    extra: dict = {"smoke": {h.host: h.to_dict() for h in hosts}}
    if capture:
        from datetime import date

        from gpustack import __version__
        from gpustack.smoke.capture import write_capture

        extra["captures"] = {
            h.host: str(write_capture(Path(capture).expanduser(), h.host,
                                      result.hosts[h.host].facts, h, __version__, date.today()))
            for h in hosts if h.verdict != "not run"
        }  # fmt: skip
    code = checks.exit_code(int(result.exit_code), hosts)
    return _finish(
        "smoke",
        opts,
        result,
        extra,
        text=lambda: (view.print_smoke(hosts, opts.verbose), output.print_unreachable(result)),
        code=code,
    )


UNINSTALL_COMPONENTS = ("driver", "toolkit", "runtime", "mig", "k8s")


def uninstall(opts: HostOptions, components: str, yes: bool, check: bool = False) -> int:
    chosen = [c.strip() for c in components.split(",") if c.strip()]
    unknown = [c for c in chosen if c not in UNINSTALL_COMPONENTS]
    if unknown or not chosen:
        raise BadInput(
            f"unknown component(s) {', '.join(unknown) or components!r}",
            "choose from driver, toolkit, runtime, mig, k8s (comma-separated)",
        )
    if check and "k8s" in chosen:
        raise BadInput(
            "uninstall --check covers the hosts' components (driver, toolkit, runtime, mig), "
            "not k8s",
            "leave k8s out of --components; `gpustack status --kubeconfig FILE` lists what "
            "gpustack applied in the cluster",
        )
    if check:  # no question, no lock: nothing changes
        opts.extra_vars = [*opts.extra_vars, json.dumps({"gpustack_uninstall_components": chosen})]
        result, *_ = _run(opts, "uninstall.yml", "gpustack uninstall (check mode)", True, True)
        return _finish_plan("uninstall", opts, result, {"components": chosen})
    validated = validate(opts)
    inventory = validated[0]
    session = None
    if "k8s" in chosen:  # needs the cluster; reach it before asking or touching anything
        from gpustack.k8s.cluster import flow

        session = flow.prepare(validated[2], inventory, validated[1], required=True)
    host_components = [c for c in chosen if c != "k8s"]
    if not yes:
        if not sys.stdin.isatty():
            raise BadInput(
                "uninstall needs confirmation", "pass --yes to confirm non-interactively"
            )
        if not output.confirm(f"Remove {', '.join(chosen)} from {len(inventory.hosts)} host(s)?"):
            output.stderr.print("Nothing changed.")
            return int(ExitCode.OK)
    removed = None
    if session:  # reverse lifecycle order: the Kubernetes side goes first
        removed = flow.uninstall(session)
        if opts.output != "json":
            from gpustack.terminal.cluster_report import print_removed

            print_removed(removed, opts.verbose)
    extra = {"components": chosen, **({"kubernetes": removed} if removed else {})}
    if not host_components:
        output.emit({"command": "uninstall", "exit_code": 0, **extra}, opts.report, opts.output)
        return int(ExitCode.OK)
    opts.extra_vars = [
        *opts.extra_vars,
        json.dumps({"gpustack_uninstall_components": host_components}),
    ]
    with playbook.host_locks(opts, inventory):
        result, *_ = _run(opts, "uninstall.yml", "gpustack uninstall")
    return _finish("uninstall", opts, result, extra)


def manifests(
    inventory: str,
    output_dir: str,
    servicemonitor: bool,
    limit: str | None,
    extra_vars: list[str],
    vault_options: VaultOptions | None = None,
) -> int:
    """Render from the inventory's and -e's gpustack_k8s_* settings; write YAML files."""
    from gpustack.k8s import manifests as k8s

    vault.setup(vault_options)
    extravars = parse_extra_vars(extra_vars)
    check_inputs(extravars)
    check_extra_vars(extravars)
    config = k8s.config_from_inventory(load_inventory(inventory, limit), extravars)
    target = Path(output_dir).expanduser()
    written = k8s.write_manifests(k8s.render(config, servicemonitor=servicemonitor), target)
    output.print_written(f"Wrote {len(written)} manifests to {target}:", written)
    return int(ExitCode.OK)
