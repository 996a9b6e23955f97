"""`install`/`plan` with the converged-host fast path: probe, decide, run site.yml where needed.

One read-only play (playbooks/converged.yml: preflight + the stamps re-checked on the host)
decides per host (gpustack/fleet/converged.py); hosts proven converged are reported from that play,
the others get the full site.yml (limited to them). `--full`, `--tags` and `--skip-tags` run
site.yml on every host as before.
"""

from __future__ import annotations

import dataclasses

from gpustack.ansible.playbook import play as _play
from gpustack.ansible.results import HostResult, RunResult
from gpustack.fleet import converged

PROBE_FACTS = ("gpustack_converged_probe", "gpustack_converged_desired", "gpustack_runtime_loaded")


def _skipped(host: HostResult, decision: converged.Decision) -> HostResult:
    """A converged host as the report shows it: the probe's counts, no change, the facts its
    roles published when they last ran (kept in their stamps)."""
    facts = {k: v for k, v in host.facts.items() if k not in PROBE_FACTS}
    facts.update(decision.published)
    facts["gpustack_converged"] = decision.to_dict()
    return dataclasses.replace(host, facts=facts, converged=True, changed=0, changes=[])


def run_site(opts, validated, title: str, check=False, diff=False, full=False) -> RunResult:
    """site.yml on the hosts that need it; converged hosts reported from the probe play."""
    inventory, extravars, _ = validated
    tagged = bool(opts.tags or opts.skip_tags)
    variables = {**extravars, **converged.extravars(record=not check and not tagged)}
    if full or tagged:
        return _play("site.yml", inventory, variables, opts, title, check, diff)
    probe = _play("converged.yml", inventory, variables, opts, f"{title}: converged check")
    if probe.status == "canceled":
        return probe
    content = converged.content_hash()
    decisions: dict[str, converged.Decision] = {}
    for name, host in probe.hosts.items():
        if not host.unreachable and not host.failed:
            decisions[name] = converged.decide(name, host.facts, content)
    todo = [
        h
        for h in inventory.hosts
        if not probe.hosts.get(h) or not probe.hosts[h].unreachable
        if not (decisions.get(h) and decisions[h].converged)
    ]
    site = None
    if todo:
        subset = dataclasses.replace(inventory, hosts=todo)
        site = _play("site.yml", subset, variables, opts, title, check, diff)
    hosts: dict[str, HostResult] = {}
    for name in inventory.hosts:
        decision = decisions.get(name)
        if decision and decision.converged:
            hosts[name] = _skipped(probe.hosts[name], decision)
        elif site is not None and name in todo:
            hosts[name] = site.hosts.get(name) or HostResult(name=name)
            if decision:
                hosts[name].facts.setdefault("gpustack_converged", decision.to_dict())
        else:  # unreachable in the probe: reported as such, not tried twice
            hosts[name] = probe.hosts.get(name) or HostResult(name=name)
    ran = site or probe
    return RunResult(
        playbook="site.yml",
        status=ran.status,
        rc=ran.rc if site is not None else (0 if probe.status == "successful" else probe.rc),
        artifacts_dir=ran.artifacts_dir,
        hosts=hosts,
    )
