"""Converged hosts: decide from a read-only probe whether `install` has anything to do (pure).

Each host role records a stamp at the end of a successful run (roles/gpu_converged): its
resolved inputs, the preflight facts it branched on, gpustack's content hash, and what it left
on the host (file checksums, package versions, holds, service states, containerd's effective
configuration). The probe re-reads all of that in one module call; this module compares the
stamp with what `install` would use now. Anything it cannot prove unchanged means "run the
full play on this host": the fast path may only ever be more conservative than a full run.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from gpustack import __version__, credentials, driver_version, paths
from gpustack.ansible.input_specs import is_true

# The host roles of playbooks/site.yml that record a stamp, in lifecycle order.
HOST_ROLES = ("nvidia_driver", "nvidia_container_toolkit", "container_runtime")
# Roles of site.yml that are strict no-ops while their switch input is empty and record no
# stamp: a host with the switch set is never proven converged (a full run checks its GPUs).
SWITCHED_ROLES = {"nvidia_mig": "nvidia_mig_config"}
# Inputs read by a role that are not its own (prefix-less, cross-role).
SHARED_INPUTS = {
    "nvidia_driver": ("gpustack_require_gpu",),
    # container_runtime_enable_cdi=auto turns CDI on with NVIDIA's DRA driver
    "container_runtime": ("gpustack_k8s_gpu_allocation",),
}
UNSET = "__unset__"
# ansible's apt module refreshes package lists older than this (the roles' cache_valid_time).
LISTS_VALID_SECONDS = 3600
# Extra variables the CLI passes: recording on (content hash) and the input names per role.
CONTENT_VAR = "gpustack_converged_content"
# How stamps record a secret (plugins/filter/gpu_converged.py).
_SECRET_DIGEST = re.compile(r"<secret [^>]*>")
INPUTS_VAR = "gpustack_converged_inputs"


@cache
def content_hash() -> str:
    """sha256 over gpustack's version and every file of playbooks/, plugins/ and roles/ (names +
    bytes): the modules, module_utils and filters the roles run are content too."""
    digest = hashlib.sha256(f"gpustack {__version__}\n".encode())
    root = paths.content_root()
    for top in ("playbooks", "plugins", "roles"):
        for path in sorted((root / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                digest.update(str(path.relative_to(root)).encode() + b"\0")
                digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()


@cache
def role_input_names(role: str) -> tuple[str, ...]:
    """The role's documented inputs (meta/argument_specs.yml main) plus the shared ones."""
    spec = paths.load_yaml(paths.roles_dir() / role / "meta/argument_specs.yml")
    options = ((spec.get("argument_specs") or {}).get("main") or {}).get("options") or {}
    return (*options, *SHARED_INPUTS.get(role, ()))


@cache
def role_defaults(role: str) -> dict[str, Any]:
    path = paths.roles_dir() / role / "defaults/main.yml"
    return paths.load_yaml(path) or {}


def extravars(record: bool) -> dict[str, Any]:
    """What the CLI adds to -e: input names for the probe and the roles; the content hash
    turns recording on (install without --check, --tags or --skip-tags)."""
    roles = (*HOST_ROLES, *SWITCHED_ROLES)
    out: dict[str, Any] = {INPUTS_VAR: {role: list(role_input_names(role)) for role in roles}}
    if record:
        out[CONTENT_VAR] = content_hash()
    return out


def _normal(value: Any) -> Any:
    """The JSON form a stamp stores, so recorded and desired values compare alike."""
    return json.loads(json.dumps(value, sort_keys=True, default=str))


def desired_inputs(role: str, resolved: dict[str, Any]) -> dict[str, Any]:
    """Inputs `install` would use for `role` on a host: resolved values (inventory, group/host
    vars, -e), else the role's default; names with neither stay UNSET (as the role records)."""
    defaults = role_defaults(role)
    out = {}
    for name in role_input_names(role):
        value = resolved.get(name, UNSET)
        if value == UNSET:
            value = defaults.get(name, UNSET)
        out[name] = value
    return _normal(out)


def fact_subset(preflight: dict[str, Any]) -> dict[str, Any]:
    """The preflight facts the roles branch on and do not change themselves."""
    osinfo = preflight.get("os") or {}
    return _normal(
        {
            "os": {k: osinfo.get(k) for k in ("id", "family", "version_id", "codename")},
            "arch": preflight.get("arch"),
            "kernel": preflight.get("kernel"),
            "secure_boot": preflight.get("secure_boot"),
            "gpus": [
                [d.get("pci_address"), d.get("device_id")]
                for d in (preflight.get("gpus") or {}).get("devices") or []
            ],
            "nvswitch": (preflight.get("nvswitch") or {}).get("count", 0),
            "runtime": preflight.get("runtime"),
            "runtimes": [
                {k: r.get(k) for k in ("kind", "binary", "version", "config_path")}
                for r in preflight.get("runtimes") or []
            ],
        }
    )


def newest(resolve: dict[str, Any], available: list[str]) -> str | None:
    """The version a full run would pick now when no exact version is set (None: no pick)."""
    kind = resolve.get("kind")
    if kind == "toolkit":  # the role takes madison's first line
        return available[0] if available else None
    if kind == "driver":
        try:  # the same resolution as the role's filter plugin (gpustack/driver_version.py)
            return driver_version.resolve(
                available, resolve.get("branch") or "", "", resolve.get("source") or ""
            )
        except driver_version.VersionError:
            return None
    return None


@dataclass
class Decision:
    """Whether a host may skip the full play, and every reason it may not."""

    host: str
    converged: bool
    reasons: list[str] = field(default_factory=list)
    published: dict[str, Any] = field(default_factory=dict)  # the roles' gpustack_* facts

    def to_dict(self) -> dict[str, Any]:
        return {"converged": self.converged, "reasons": self.reasons}


def _input_reason(role: str, name: str, now: Any, then: Any) -> str:
    """Why an input differs; never a secret (stamps hold digests of secrets, never values)."""
    if credentials.is_secret_name(name) or name.endswith("_password_file"):
        return f"{role}: input {name} changed"
    shown_now, shown_then = (
        _SECRET_DIGEST.sub("<secret>", json.dumps(credentials.scrub_data(v))) for v in (now, then)
    )
    if shown_now == shown_then:  # the difference is in the credentials of a URL
        return f"{role}: input {name} changed (credentials)"
    return f"{role}: input {name} is {json.loads(shown_now)!r}, was {json.loads(shown_then)!r}"


def _role_reasons(role, entry, preflight, resolved, content, lists_age) -> list[str]:
    stamp = entry.get("stamp") or {}
    reasons = [f"{role}: {p}" for p in entry.get("problems") or []]
    if not stamp:
        return reasons or [f"{role}: no stamp"]
    if stamp.get("content") != content:
        reasons.append(f"{role}: gpustack's roles changed since the last full run")
    want = desired_inputs(role, resolved)
    have = stamp.get("inputs") or {}
    for name in sorted(set(want) | set(have)):
        if want.get(name, UNSET) != have.get(name, UNSET):
            reasons.append(_input_reason(role, name, want.get(name, UNSET), have.get(name, UNSET)))
    facts_now, facts_then = fact_subset(preflight), fact_subset(stamp.get("facts") or {})
    for key in sorted(set(facts_now) | set(facts_then)):
        if facts_now.get(key) != facts_then.get(key):
            reasons.append(f"{role}: host fact {key} changed")
    resolve = stamp.get("resolve") or {}
    kind = resolve.get("kind")
    if kind not in ("driver", "toolkit", "none"):
        reasons.append(f"{role}: {resolve.get('why') or 'no fast path for this configuration'}")
    elif kind != "none" and not resolve.get("version_input"):
        if lists_age is None or lists_age >= LISTS_VALID_SECONDS:
            reasons.append(
                f"{role}: no exact version set and the package lists are over an hour old "
                "(a full run refreshes them and installs the newest)"
            )
        else:
            pick = newest(resolve, entry.get("available") or [])
            if pick != resolve.get("target"):
                reasons.append(
                    f"{role}: newest available is {pick or 'none'}, "
                    f"installed {resolve.get('target')}"
                )
    if role == "nvidia_driver" and kind == "driver":
        require = is_true(resolved.get("gpustack_require_gpu", False))
        gpus = int((preflight.get("gpus") or {}).get("count") or 0)
        loaded = ((preflight.get("driver") or {}).get("loaded_version")) or ""
        if (gpus or require) and loaded != driver_version.upstream_version(resolve.get("target")):
            reasons.append(
                f"{role}: loaded driver {loaded or 'none'} is not {resolve.get('target')} "
                "(reload or reboot pending)"
            )
    return reasons


def decide(host: str, facts: dict[str, Any], content: str) -> Decision:
    """Pure: the probe play's facts for one host -> converged or not, with reasons."""
    preflight = facts.get("gpustack_preflight") or {}
    probe = facts.get("gpustack_converged_probe") or {}
    resolved = facts.get("gpustack_converged_desired") or {}
    if not preflight or not probe:
        return Decision(host, False, ["no probe facts"])
    stamps = probe.get("stamps") or {}
    reasons: list[str] = []
    published: dict[str, Any] = {}
    for role in HOST_ROLES:
        entry = stamps.get(role)
        if entry is None:
            reasons.append(f"{role}: no stamp (never installed by this gpustack, or --check)")
            continue
        reasons += _role_reasons(
            role, entry, preflight, resolved, content, probe.get("apt_lists_age")
        )
        published.update((entry.get("stamp") or {}).get("published") or {})
    for role, switch in SWITCHED_ROLES.items():
        value = resolved.get(switch, UNSET)
        if value not in (UNSET, "", None):
            reasons.append(f"{role}: {switch}={value} (no stamp: a full run checks the GPUs)")
    loaded = facts.get("gpustack_runtime_loaded") or {}
    if loaded.get("restart_pending"):
        reasons.append("container_runtime: restart pending (a run stopped before restarting)")
    reasons += [f"container_runtime: {d}" for d in loaded.get("differences") or []]
    return Decision(host, not reasons, reasons, published if not reasons else {})
