"""`install`/`plan` with the converged-host fast path: probe, decide, run site.yml where needed.

One run of site.yml: its probe also re-checks the stamps on the host, and the play decides per
host (roles/gpu_converged/tasks/check.yml, with the rules of gpustack/fleet/converged.py); a host
proven converged ends its play there and is reported as converged. `--full`, `--tags` and
`--skip-tags` turn the check off.
"""

from __future__ import annotations

import dataclasses

from gpustack.ansible.playbook import play as _play
from gpustack.ansible.results import HostResult, RunResult
from gpustack.fleet import converged

PROBE_FACTS = ("gpustack_converged_probe", "gpustack_converged_desired", "gpustack_runtime_loaded")
# Extra variable that turns the play's converged check on: gpustack's content hash.
CHECK_VAR = "gpustack_converged_check"


def _skipped(host: HostResult, published: dict) -> HostResult:
    """A converged host as the report shows it: no change, the facts its roles published when
    they last ran (kept in their stamps)."""
    facts = {**host.facts, **published}
    return dataclasses.replace(host, facts=facts, converged=True, changed=0, changes=[])


def run_site(opts, validated, title: str, check=False, diff=False, full=False) -> RunResult:
    """site.yml on every host, in one run: with the fast path on, a host proven converged by
    the play's check ends its play after the probe and is reported as converged."""
    inventory, extravars, _ = validated
    tagged = bool(opts.tags or opts.skip_tags)
    variables = {**extravars, **converged.extravars(record=not check and not tagged)}
    if full or tagged:
        return _play("site.yml", inventory, variables, opts, title, check, diff)
    variables[CHECK_VAR] = converged.content_hash()
    result = _play("site.yml", inventory, variables, opts, title, check, diff)
    for name, host in result.hosts.items():
        decision = host.facts.get("gpustack_converged")
        for key in PROBE_FACTS:  # the check's inputs (stamps included), not the report's
            host.facts.pop(key, None)
        if not isinstance(decision, dict):
            continue
        skip = bool(decision.get("converged")) and not host.failed and not host.unreachable
        host.facts["gpustack_converged"] = {
            "converged": skip,
            "reasons": decision.get("reasons") or [],
        }
        if skip:
            result.hosts[name] = _skipped(host, decision.get("published") or {})
    return result
