# -*- coding: utf-8 -*-
"""Converged-host stamps: what a host role left on a host (written by gpustack_converged at the
end of a role's successful run) and every difference the host shows now (read by
gpustack_host_probe, section converged). The CLI decides from them (gpustack/fleet/converged.py).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import fnmatch
import glob
import hashlib
import json
import os
import re
import time

from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_host import (
    containerd_dump,
    holds,
    lists_mtime,
    packages,
    run,
    service_states,
    sha256,
    toml_has_runtime,
)

SCHEMA = 1
# Where stamps live (written by gpustack_converged, read by gpustack_host_probe).
DIR = "/var/lib/gpustack/converged"


def expand(globs, exclude):
    found = set()
    for pattern in globs:
        for path in glob.glob(pattern):
            if os.path.isfile(path) and not any(fnmatch.fnmatch(path, x) for x in exclude):
                found.add(path)
    return sorted(found)


def checksums(files, globs, exclude):
    return dict((path, sha256(path)) for path in sorted(set(files) | set(expand(globs, exclude))))


def package_versions(names):
    """{name: version or None}: installed versions of exactly these packages."""
    found = packages(names)
    return dict((name, found.get(name)) for name in names)


def canonical_dump(text):
    """`containerd config dump` prints Go maps (and `imports`) in map order: sort the lines of
    each table, the tables, and the imports, so one configuration always hashes alike."""
    tables, header, lines = [], "", []
    for line in (text or "").splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("["):
            tables.append((header, sorted(lines)))
            header, lines = stripped, []
            continue
        match = re.match(r"^imports\s*=\s*\[(.*)\]$", stripped)
        if match:
            items = sorted(i.strip() for i in match.group(1).split(",") if i.strip())
            stripped = "imports = [%s]" % ", ".join(items)
        lines.append(stripped)
    tables.append((header, sorted(lines)))
    return "\n".join("%s\n%s" % (h, "\n".join(body)) for h, body in sorted(tables))


# `docker info` as one JSON object (the container_runtime role asks with the same format).
DOCKER_INFO_FORMAT = '{"runtimes": {{json .Runtimes}}, "default": {{json .DefaultRuntime}}}'


def docker_loaded(name, binary):
    """Whether the running dockerd loaded the runtime `name` with `binary` (None: no answer)."""
    rc, out, _ = run(["docker", "info", "--format", DOCKER_INFO_FORMAT])
    try:
        runtimes = json.loads(out).get("runtimes") if rc == 0 else None
    except (ValueError, AttributeError):
        runtimes = None
    if not isinstance(runtimes, dict):
        return None
    entry = runtimes.get(name)
    return isinstance(entry, dict) and entry.get("path") == binary


def runtime_state(runtime):
    """containerd: sha256 of the effective configuration and whether it holds the runtime;
    Docker: whether the running daemon loaded it (a reload lost after daemon.json was written)."""
    kind = (runtime or {}).get("kind")
    if kind == "docker":
        name, binary = runtime.get("name") or "nvidia", runtime.get("binary") or ""
        return {"loaded": docker_loaded(name, binary)}
    if kind != "containerd":
        return {}
    rc, out, err = containerd_dump(runtime.get("config") or "/etc/containerd/config.toml")
    if rc != 0:
        return {"dump_sha256": None, "wired": False, "error": " ".join(err.split())[:300]}
    return {
        "dump_sha256": hashlib.sha256(canonical_dump(out).encode("utf-8")).hexdigest(),
        "wired": toml_has_runtime(
            out, runtime.get("name") or "nvidia", runtime.get("binary") or ""
        ),
    }


def madison(names):
    """{package: versions the sources offer, newest first} from one `apt-cache madison` call
    (apt-cache loads the whole package cache once per call; each line names its package)."""
    names = sorted(set(names))
    if not names:
        return {}
    rc, out, _ = run(["apt-cache", "madison"] + names)
    found = dict((name, []) for name in names)
    for line in out.splitlines() if rc == 0 else []:
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 3 and parts[1] and parts[0] in found and parts[1] not in found[parts[0]]:
            found[parts[0]].append(parts[1])
    return found


def apt_lists_age(paths):
    """Seconds since the package lists were refreshed, as ansible's apt module measures it
    (paths: apt's update-success stamp, then the lists directory)."""
    mtime = lists_mtime(paths)
    return None if mtime is None else max(0, int(time.time() - mtime))


def observe(stamp, installed, units):
    """What the host shows now for everything a stamp recorded; `installed` (packages: the
    installed ones' versions) and `units` (service_states) are read once for all stamps."""
    runtime = stamp.get("runtime") or {}
    names = sorted(stamp.get("packages") or {})
    services = sorted(stamp.get("services") or {})
    return {
        "files": checksums(
            stamp.get("files") or {}, stamp.get("globs") or [], stamp.get("exclude") or []
        ),
        "packages": dict((name, installed.get(name)) for name in names),
        "services": dict((unit, units[unit]) for unit in services),
        "runtime": runtime_state(runtime.get("spec")),
    }


def problems(stamp, now, held):
    """Every difference between a stamp and the host, one line each ([] when converged)."""
    found = []
    for path, digest in sorted((stamp.get("files") or {}).items()):
        current = now["files"].get(path)
        if digest != current:
            what = "removed" if current is None else ("created" if digest is None else "changed")
            found.append("file %s %s" % (path, what))
    for path in sorted(set(now["files"]) - set(stamp.get("files") or {})):
        found.append("file %s appeared" % path)
    for name, version in sorted((stamp.get("packages") or {}).items()):
        if now["packages"].get(name) != version:
            found.append(
                "package %s %s, recorded %s"
                % (name, now["packages"].get(name) or "absent", version or "absent")
            )
    for name in stamp.get("holds") or []:
        if name not in held:
            found.append("package %s not held" % name)
    for unit, state in sorted((stamp.get("services") or {}).items()):
        current = now["services"].get(unit) or {}
        for key in ("enabled", "active"):
            if state.get(key) != current.get(key):
                found.append(
                    "service %s %s %r, recorded %r" % (unit, key, current.get(key), state.get(key))
                )
    recorded = stamp.get("runtime") or {}
    if recorded.get("spec", {}).get("kind") == "containerd":
        current = now["runtime"]
        if not current.get("wired"):
            found.append(
                "containerd: runtime %r not in the effective configuration"
                % recorded["spec"].get("name")
            )
        if current.get("dump_sha256") != recorded.get("dump_sha256"):
            found.append("containerd: effective configuration changed")
    if recorded.get("spec", {}).get("kind") == "docker" and not now["runtime"].get("loaded"):
        found.append(
            "docker: runtime %r not loaded by the running daemon" % recorded["spec"].get("name")
        )
    return found


def recorded_facts(preflight):
    """The part of gpustack_preflight a stamp keeps: the host facts the roles branch on and do
    not change themselves, in gpustack_preflight's shape (the CLI compares them through
    gpustack/fleet/converged.py fact_subset). The rest - installed and loaded driver, active
    units, kernel headers, the kubelet - moves with the install itself: a stamp holding the
    facts probed at the start of a first install would be rewritten by the next full run."""
    preflight = preflight or {}
    osinfo = preflight.get("os") or {}
    devices = (preflight.get("gpus") or {}).get("devices") or []
    return {
        "os": dict((k, osinfo.get(k)) for k in ("id", "family", "version_id", "codename")),
        "arch": preflight.get("arch"),
        "kernel": preflight.get("kernel"),
        "secure_boot": preflight.get("secure_boot"),
        "gpus": {
            "devices": [
                {"pci_address": d.get("pci_address"), "device_id": d.get("device_id")}
                for d in devices
            ]
        },
        "nvswitch": {"count": (preflight.get("nvswitch") or {}).get("count", 0)},
        "runtime": preflight.get("runtime"),
        "runtimes": [
            dict((k, r.get(k)) for k in ("kind", "binary", "version", "config_path"))
            for r in preflight.get("runtimes") or []
        ],
    }


def build(params):
    """The stamp a role's record writes: what the role passed, then what the host shows."""
    stamp = dict(params["stamp"])
    stamp["facts"] = recorded_facts(stamp.get("facts"))
    stamp.update(
        {
            "schema": SCHEMA,
            "role": params["role"],
            "globs": params["globs"],
            "exclude": params["exclude"],
        }
    )
    stamp["files"] = checksums(params["files"], params["globs"], params["exclude"])
    stamp["packages"] = package_versions(sorted(set(params["packages"])))
    stamp["holds"] = sorted(set(params["holds"]))
    stamp["services"] = service_states(sorted(set(params["services"])))
    stamp["runtime"] = {"spec": params["runtime"]}
    stamp["runtime"].update(runtime_state(params["runtime"]))
    return stamp


def probe(params):
    """Every stamp under params["dir"] (default DIR), re-checked on the host:
    {stamps, apt_lists_age}."""
    held = set(holds())
    stamps, readable = {}, {}
    for path in sorted(glob.glob(os.path.join(params.get("dir") or DIR, "*.json"))):
        role = os.path.basename(path)[: -len(".json")]
        try:
            with open(path) as fh:
                stamp = json.load(fh)
        except (IOError, OSError, ValueError) as exc:
            stamps[role] = {"stamp": {}, "problems": ["stamp unreadable: %s" % exc]}
            continue
        if stamp.get("schema") != SCHEMA:
            stamps[role] = {"stamp": {}, "problems": ["stamp schema %r" % stamp.get("schema")]}
            continue
        readable[role] = stamp
    # One dpkg-query and one systemctl call for every stamp's packages and units.
    installed = packages(
        sorted(set(n for stamp in readable.values() for n in stamp.get("packages") or {}))
    )
    units = service_states(
        sorted(set(u for stamp in readable.values() for u in stamp.get("services") or {}))
    )
    asks = {}  # role -> the package whose offered versions decide "newest available"
    for role, stamp in readable.items():
        entry = {
            "stamp": dict(
                (k, stamp.get(k)) for k in ("content", "inputs", "facts", "resolve", "published")
            ),
            "problems": problems(stamp, observe(stamp, installed, units), held),
        }
        package = (stamp.get("resolve") or {}).get("package")
        if package and not (stamp.get("resolve") or {}).get("version_input"):
            asks[role] = package
        stamps[role] = entry
    offered = madison(asks.values())
    for role, package in asks.items():
        stamps[role]["available"] = offered[package]
    return {
        "stamps": dict(sorted(stamps.items())),
        "apt_lists_age": apt_lists_age(params.get("apt_lists") or []),
    }
