#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Converged-host stamps: record what a role left on a host; probe whether it is still there."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_converged
short_description: Record a role's converged stamp, or probe every stamp in one round trip
description:
  - I(mode=record) (end of a successful, non-check run of a host role) writes
    C(<dir>/<role>.json) - the role's resolved inputs, the preflight facts, gpustack's content
    hash, the sha256 of every file the role manages, the versions of its packages, its holds,
    its services' states, the containerd effective configuration's sha256 and the facts the role
    published. The file is rewritten only when that content differs (changed reports it); it is
    mode 0600, and secret inputs arrive as digests (filter_plugins/gpu_converged.py).
  - I(mode=probe) reads every stamp and re-reads all of it from the host - files, packages,
    holds, services, the runtime's effective configuration, the versions the package sources
    offer - in one module call; it returns observations and problems, the CLI decides. Changes
    nothing; supports check mode.
options:
  mode: {type: str, choices: [probe, record], default: probe, description: What to do.}
  dir: {type: path, default: /var/lib/gpustack/converged, description: Where stamps live.}
  role: {type: str, default: "", description: The role a stamp is for (record).}
  stamp: {type: dict, default: {}, description: "Role, inputs, facts, content, published (record)."}
  files: {type: list, elements: path, default: [], description: Files the role manages (record).}
  globs: {type: list, elements: str, default: [], description: File patterns it reads (record).}
  exclude: {type: list, elements: str, default: [], description: Patterns left out of globs.}
  packages: {type: list, elements: str, default: [], description: Packages it installed (record).}
  holds: {type: list, elements: str, default: [], description: Packages it held (record).}
  services: {type: list, elements: str, default: [], description: Units it manages (record).}
  runtime: {type: dict, default: {}, description: "kind, config, name, binary (record)."}
author: gpustack
"""

RETURN = r"""
ansible_facts:
  description: With I(mode=probe), C(gpustack_converged_probe) - per role its stamp and problems.
  returned: mode=probe
  type: dict
"""

import fnmatch
import glob
import hashlib
import json
import os
import re
import subprocess
import time

from ansible.module_utils.basic import AnsibleModule

SCHEMA = 1
APT_LISTS = "/var/lib/apt/lists"
APT_UPDATE_STAMP = "/var/lib/apt/periodic/update-success-stamp"


def run(args):
    try:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = proc.communicate()
        return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    except OSError as exc:
        return 127, "", str(exc)


def sha256(path):
    try:
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(65536), b""):
                digest.update(block)
        return digest.hexdigest()
    except (IOError, OSError):
        return None


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
    """{name: version or None}: installed versions (dpkg, else rpm)."""
    found = dict((name, None) for name in names)
    if not names:
        return found
    rc, out, _ = run(["dpkg-query", "-W", "-f=${Package} ${Version} ${db:Status-Abbrev}\n"] + names)
    if rc == 127:
        _, out, _ = run(["rpm", "-q", "--qf", "%{NAME} %{VERSION}-%{RELEASE} ii\n"] + names)
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] in found and parts[2][:2] in ("ii", "hi"):
            found[parts[0]] = parts[1]
    return found


def held_packages():
    rc, out, _ = run(["apt-mark", "showhold"])
    return set(out.split()) if rc == 0 else set()


def service_states(units):
    """{unit: {"enabled": UnitFileState, "active": ActiveState}} in one systemctl call."""
    states = dict((unit, {"enabled": "", "active": ""}) for unit in units)
    if not units:
        return states
    _, out, _ = run(["systemctl", "show", "--property=Id,UnitFileState,ActiveState"] + units)
    blocks = out.split("\n\n") + [""] * len(units)
    for unit, block in zip(units, blocks[: len(units)]):  # noqa: B905 - padded above
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        states[unit] = {
            "enabled": props.get("UnitFileState", ""),
            "active": props.get("ActiveState", ""),
        }
    return states


def toml_has_runtime(text, name, binary):
    """Whether a dumped TOML text defines runtimes.<name> with BinaryName <binary>."""
    quoted = r"[\"']?%s[\"']?" % re.escape(name)
    header = re.compile(r"^\s*\[.*\.runtimes\.%s(\.options)?\]\s*$" % quoted)
    in_entry = has_entry = has_binary = False
    for line in (text or "").splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            in_entry = bool(header.match(stripped))
            has_entry = has_entry or in_entry
            continue
        if in_entry and re.match(r"BinaryName\s*=\s*[\"']%s[\"']" % re.escape(binary), stripped):
            has_binary = True
    return has_entry and has_binary


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


def runtime_state(runtime):
    """containerd: sha256 of the effective configuration and whether it holds the runtime."""
    if (runtime or {}).get("kind") != "containerd":
        return {}
    config = runtime.get("config") or "/etc/containerd/config.toml"
    rc, out, err = run(["containerd", "--config", config, "config", "dump"])
    if rc != 0:
        return {"dump_sha256": None, "wired": False, "error": " ".join(err.split())[:300]}
    return {
        "dump_sha256": hashlib.sha256(canonical_dump(out).encode("utf-8")).hexdigest(),
        "wired": toml_has_runtime(
            out, runtime.get("name") or "nvidia", runtime.get("binary") or ""
        ),
    }


def madison(package):
    rc, out, _ = run(["apt-cache", "madison", package])
    versions = []
    for line in out.splitlines() if rc == 0 else []:
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 3 and parts[1] and parts[1] not in versions:
            versions.append(parts[1])
    return versions


def apt_lists_age():
    """Seconds since the package lists were refreshed, as ansible's apt module measures it."""
    for path in (APT_UPDATE_STAMP, APT_LISTS):
        if os.path.exists(path):
            return max(0, int(time.time() - os.stat(path).st_mtime))
    return None


def observe(stamp):
    """What the host shows now for everything a stamp recorded."""
    runtime = stamp.get("runtime") or {}
    return {
        "files": checksums(
            stamp.get("files") or {}, stamp.get("globs") or [], stamp.get("exclude") or []
        ),
        "packages": package_versions(sorted(stamp.get("packages") or {})),
        "services": service_states(sorted(stamp.get("services") or {})),
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
    return found


def record(module, params):
    path = os.path.join(params["dir"], params["role"] + ".json")
    stamp = dict(params["stamp"])
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
    text = json.dumps(stamp, indent=1, sort_keys=True) + "\n"
    try:
        with open(path) as fh:
            same = fh.read() == text
        if same and os.stat(path).st_mode & 0o777 == 0o600:
            module.exit_json(changed=False, path=path)
    except (IOError, OSError):
        pass
    if not module.check_mode:
        if not os.path.isdir(params["dir"]):
            os.makedirs(params["dir"], 0o755)
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o600)  # root only: checksums of credential files are in it
        module.atomic_move(tmp, path)
        os.chmod(path, 0o600)  # atomic_move gives a new file the umask's mode
    module.exit_json(changed=True, path=path)


def probe(params):
    held = held_packages()
    stamps = {}
    for path in sorted(glob.glob(os.path.join(params["dir"], "*.json"))):
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
        entry = {
            "stamp": dict(
                (k, stamp.get(k)) for k in ("content", "inputs", "facts", "resolve", "published")
            ),
            "problems": problems(stamp, observe(stamp), held),
        }
        package = (stamp.get("resolve") or {}).get("package")
        if package and not (stamp.get("resolve") or {}).get("version_input"):
            entry["available"] = madison(package)
        stamps[role] = entry
    return {"stamps": stamps, "apt_lists_age": apt_lists_age()}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            mode=dict(type="str", choices=["probe", "record"], default="probe"),
            dir=dict(type="path", default="/var/lib/gpustack/converged"),
            role=dict(type="str", default=""),
            stamp=dict(type="dict", default={}),
            files=dict(type="list", elements="path", default=[]),
            globs=dict(type="list", elements="str", default=[]),
            exclude=dict(type="list", elements="str", default=[]),
            packages=dict(type="list", elements="str", default=[]),
            holds=dict(type="list", elements="str", default=[]),
            services=dict(type="list", elements="str", default=[]),
            runtime=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if params["mode"] == "record":
        if not re.match(r"^[a-z][a-z0-9_]*$", params["role"] or ""):
            module.fail_json(msg="record needs a role name, got %r" % params["role"])
        record(module, params)
    module.exit_json(changed=False, ansible_facts={"gpustack_converged_probe": probe(params)})


if __name__ == "__main__":
    main()
