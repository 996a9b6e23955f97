# -*- coding: utf-8 -*-
"""Merge-safe runtime configuration, computed on the controller with real TOML/JSON parsers.

containerd: the nvidia runtime goes into a drop-in (``imports``). containerd before 2.1 merges
imported files per top-level plugin table (an imported ``plugins."io.containerd.grpc.v1.cri"``
replaces the main file's whole table), so for those versions the drop-in carries the main
file's entire CRI runtime table plus the nvidia entry — and, because a decoded ``runtimes``
table also replaces containerd's built-in map, every runtime that exists only as a default
(runc, on a distribution config) too. From 2.1 on imports merge deeply and the drop-in holds
only the nvidia entry. The nvidia entry copies runc's effective settings (from
``containerd config dump``), SystemdCgroup included, and points BinaryName at the NVIDIA runtime.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import base64
import copy
import json
import os
import re
import sys

try:
    import tomllib
except ImportError:  # pragma: no cover - controller Python < 3.11
    tomllib = None

try:
    from ansible.errors import AnsibleFilterError
except ImportError:  # pragma: no cover
    AnsibleFilterError = ValueError


def _tomlkit():
    """tomlkit, imported by the filters that need it. Ansible imports every filter file of the
    collection in each worker process that resolves any gpustack filter (a fresh fork per task
    and host), and tomlkit's import was most of this file's cost there: about 0.7 s of the
    controller's CPU per first install of 2 nodes (docs/performance.md)."""
    import tomlkit

    return tomlkit


try:
    from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_k3s import (
        TEMPLATES,
        k3s_templates,
    )
except ImportError:  # loaded as a file, outside Ansible's collection loader (unit tests)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../module_utils"))
    from gpustack_k3s import TEMPLATES, k3s_templates

CRI_KEYS = {1: "cri", 2: "io.containerd.grpc.v1.cri", 3: "io.containerd.cri.v1.runtime"}
# containerd's own default CDI specification directories (pkg/cri/config/config_unix.go@v1.7.24,
# internal/cri/config/config_unix.go@v2.1.9): the toolkit's /etc/cdi and the DRA driver's
# /var/run/cdi.
CDI_SPEC_DIRS = ["/etc/cdi", "/var/run/cdi"]
# The first containerd with CDI in its CRI plugin (enable_cdi, cdi_spec_dirs).
CDI_RELEASE = (1, 7)
DUMP_RUNTIME_KEYS = ("io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri", "cri")


def containerd_release(version):
    """(major, minor) from '1.6.20~ds1', 'v2.1.4', '2.1.9+unknown'."""
    match = re.search(r"(\d+)\.(\d+)", str(version or ""))
    if not match:
        raise AnsibleFilterError("cannot read the containerd version from %r" % version)
    return int(match.group(1)), int(match.group(2))


def _plain(value):
    """tomlkit items to plain Python containers."""
    return value.unwrap() if hasattr(value, "unwrap") else copy.deepcopy(value)


def _dump_cri(dump_text):
    """The CRI plugin's `containerd` table of `containerd config dump` output ({} if none)."""
    try:
        dump = tomllib.loads(dump_text) if tomllib else _plain(_tomlkit().parse(dump_text))
    except Exception as exc:
        raise AnsibleFilterError("cannot parse `containerd config dump` output: %s" % exc) from None
    plugins = dump.get("plugins", {})
    for key in DUMP_RUNTIME_KEYS:
        cri = plugins.get(key, {}).get("containerd")
        if cri is not None:
            return cri
    return {}


def _dump_runtimes(dump_text):
    """The runtimes table and default runtime name of `containerd config dump` output."""
    cri = _dump_cri(dump_text)
    return cri.get("runtimes", {}), cri.get("default_runtime_name", "runc")


def legacy_default_runtime(cri, release):
    """The deprecated `default_runtime` table of a CRI plugin table (the main file's) when
    containerd `release` puts it in force, else None. containerd 1.6/1.7 load a
    `default_runtime` that has a runtime_type as the runtime "default" and make that the default
    runtime, whatever default_runtime_name says (ValidatePluginConfig,
    pkg/cri/config/config.go@v1.6.20 and @v1.7.24); containerd 2.x has no such field and ignores
    the table with a warning (cmd/containerd/server/config/config.go@v2.1.9, Decode)."""
    entry = ((cri or {}).get("containerd") or {}).get("default_runtime")
    if release >= (2, 0) or not isinstance(entry, dict) or not entry.get("runtime_type"):
        return None
    return entry


def nvidia_runtime_entry(dump_text, binary, existing=None, legacy=None):
    """runc's effective entry, with the NVIDIA runtime as the binary it starts. `legacy`: the
    main file's deprecated `default_runtime` table in force on containerd 1.x
    (legacy_default_runtime); where it starts runc (io.containerd.runc.*) pods run with it by
    default, so its settings (SystemdCgroup) go over runc's: nvidia pods get the cgroup settings
    every other pod gets."""
    runtimes, default = _dump_runtimes(dump_text)
    # Base on runc, not on the default runtime: once nvidia is the default, copying it would
    # make the result depend on the previous run. The legacy table is read from the main file,
    # which gpustack only adds its import to, so it is the same on every run.
    base = copy.deepcopy(runtimes.get("runc") or runtimes.get(default) or {})
    if legacy and str(legacy.get("runtime_type")).startswith("io.containerd.runc."):
        for key, value in legacy.items():
            if key != "options":
                base[key] = copy.deepcopy(value)
        base["options"] = dict(base.get("options") or {}, **(legacy.get("options") or {}))
    entry = base
    for key, value in (existing or {}).items():
        if key != "options":
            entry[key] = copy.deepcopy(value)
    options = dict(entry.get("options") or {})
    options.update((existing or {}).get("options") or {})
    options["BinaryName"] = binary
    entry["runtime_type"] = "io.containerd.runc.v2"
    entry["options"] = options
    return entry


def dropin_config_version(main_version, release):
    """The configuration version of gpustack's drop-in: the main file's, except for a version-1
    main file on containerd 2.0-2.2, where it is 3. Those releases migrate a version-1 file's
    plugin names (`cri` -> `io.containerd.grpc.v1.cri`) and its version number to 3 as they load
    it (cmd/containerd/server/config/config.go LoadConfig, `case 0, 1`, and the default config's
    Version = 3, cmd/containerd/command/config.go, containerd v2.1.9 926009266892), so the CRI
    plugins' own migration (`io.containerd.grpc.v1.cri` -> `io.containerd.cri.v1.runtime` and
    `.images`, plugins/cri/runtime/plugin.go) never runs for it: the whole CRI table of a
    version-1 file - sandbox_image, registry, runtimes - is ignored ("Ignoring unknown key in TOML
    for plugin"), and so would a version-1 drop-in be. A version-3 drop-in is read as it is.
    containerd 2.3.0 migrates every file as it loads it (commit 0d7fee0623430b8, containerd PR
    12608), and 2.3.0-2.3.4 refuse a drop-in of a higher version than the main file's (commit
    21248d00762e; reverted on main since, a8ed54668731): there the drop-in keeps the main file's
    version."""
    if main_version == 1 and release[0] == 2 and release < (2, 3):
        return 3
    return main_version


def containerd_nvidia(
    main_text,
    dump_text,
    containerd_version,
    binary="/usr/bin/nvidia-container-runtime",
    runtime_name="nvidia",
    set_default=False,
    dropin_glob="/etc/containerd/conf.d/*.toml",
    main_exists=True,
    extra=None,
    cdi=False,
):
    """Compute the new main config (imports added) and the drop-in; pure, deterministic.
    `cdi`: CDI on in the CRI runtime plugin (cdi_settings)."""
    tomlkit = _tomlkit()
    major, minor = containerd_release(containerd_version)
    deep_merge = (major, minor) >= (2, 1)
    if main_exists and (main_text or "").strip():
        try:
            main = tomlkit.parse(main_text)
        except Exception as exc:
            raise AnsibleFilterError("cannot parse the containerd config: %s" % exc) from None
        version = int(main.get("version", 1))
    else:
        main = tomlkit.document()
        version = 3 if major >= 2 else 2
        main["version"] = version
    if version not in CRI_KEYS:
        raise AnsibleFilterError("containerd config version %s is not supported" % version)
    key = CRI_KEYS[version]

    main_cri = _plain(main.get("plugins", {}).get(key, {})) if "plugins" in main else {}
    existing = main_cri.get("containerd", {}).get("runtimes", {}).get(runtime_name)
    legacy = legacy_default_runtime(main_cri, (major, minor))
    entry = nvidia_runtime_entry(dump_text, binary, existing, legacy)
    for name, value in (extra or {}).items():
        if name == "options" and isinstance(value, dict):
            entry["options"].update(value)
        else:
            entry[name] = copy.deepcopy(value)

    dropin_version = dropin_config_version(version, (major, minor))
    # The main file's CRI table goes into the drop-in only where containerd merges per plugin
    # table and reads both files in one schema; a version-1 file's table on containerd 2.0-2.2 is
    # not in force at all (dropin_config_version).
    carry_main = not deep_merge and dropin_version == version
    cri = copy.deepcopy(main_cri) if carry_main else {}
    section = cri.setdefault("containerd", {})
    runtimes = section.setdefault("runtimes", {})
    if set_default and legacy is not None:
        # containerd 1.x would make the deprecated table the default again (it wins over
        # default_runtime_name): the drop-in, whose CRI table replaces the main file's, carries
        # it as the runtime "default" - as containerd itself loads it, so a RuntimeClass with
        # handler "default" keeps working - and without the table.
        section.pop("default_runtime", None)
        runtimes["default"] = copy.deepcopy(legacy)
    if not deep_merge:
        # Before 2.1 a decoded `runtimes` table replaces the built-in map, so runtimes that only
        # exist as defaults (runc on a distribution config) would vanish: carry them over.
        for name, value in _dump_runtimes(dump_text)[0].items():
            if name != runtime_name and name not in runtimes:
                runtimes[name] = copy.deepcopy(value)
    runtimes[runtime_name] = entry
    if set_default:
        section["default_runtime_name"] = runtime_name
    if cdi:
        cri = cdi_settings(cri, main_cri if (carry_main or deep_merge) else {}, (major, minor))

    dropin = tomlkit.document()
    dropin.add(
        tomlkit.comment(
            "Managed by gpustack: the %s runtime%s for containerd %d.%d (%s merge of imports)."
            % (
                runtime_name,
                " and CDI" if cdi else "",
                major,
                minor,
                "deep" if deep_merge else "per-plugin-table",
            )
        )
    )
    if dropin_version != 1:
        dropin["version"] = dropin_version
    dropin["plugins"] = {CRI_KEYS[dropin_version]: cri}

    imports = main.get("imports")
    if imports is None:
        main["imports"] = [dropin_glob]
    elif dropin_glob not in list(imports):
        imports.append(dropin_glob)
    return {
        "main": tomlkit.dumps(main),
        "dropin": tomlkit.dumps(dropin),
        "config_version": version,
        "plugin_key": CRI_KEYS[dropin_version],
        "dropin_version": dropin_version,
        "merge": "deep" if deep_merge else "replace",
        "cdi": bool(cdi),
    }


def cdi_settings(cri, main_cri, release):
    """The drop-in's CRI runtime plugin table with CDI on: `enable_cdi = true` (off by default
    in containerd 1.7, on in 2.x) and, where the main file's table in force sets no
    `cdi_spec_dirs`, containerd's default directories. The keys sit at the top of the plugin
    table, where containerd reads them (PluginConfig, pkg/cri/config/config.go@v1.7.24;
    RuntimeConfig, internal/cri/config/config.go@v2.1.9) and where `nvidia-ctk runtime configure
    --cdi.enabled` writes enable_cdi (pkg/config/engine/containerd/config.go, EnableCDI). An
    `enable_cdi = false` of the user's is overridden by the drop-in (the main file keeps it).
    `main_cri`: the main file's CRI table where it is in force ({} where it is not)."""
    if release < CDI_RELEASE:
        raise AnsibleFilterError(
            "containerd %d.%d has no CDI support (enable_cdi came with containerd 1.7)" % release
        )
    settings = {"enable_cdi": True}
    if "cdi_spec_dirs" not in main_cri:
        settings["cdi_spec_dirs"] = list(CDI_SPEC_DIRS)
    out = dict(settings)
    out.update((key, value) for key, value in cri.items() if key not in settings)
    return out


def containerd_without_nvidia(main_text, dropin_glob="/etc/containerd/conf.d/*.toml"):
    """Undo: the main config without the import gpustack added (containerd_restore decides
    whether a file gpustack created goes)."""
    tomlkit = _tomlkit()
    main = tomlkit.parse(main_text)
    imports = main.get("imports")
    if imports is not None and dropin_glob in list(imports):
        remaining = [i for i in imports if i != dropin_glob]
        if remaining:
            imports.clear()
            imports.extend(remaining)
        else:
            del main["imports"]
    return tomlkit.dumps(main)


def containerd_restore(
    current_text, original_text, dropin_glob="/etc/containerd/conf.d/*.toml", created=False
):
    """Undo: the original file byte for byte when nothing else changed since gpustack's edit;
    otherwise the current file without gpustack's import (the user's later edits kept). Where
    gpustack created the file (`created`, no original), None (remove it) when nothing but its
    `version` is left, as gpustack wrote it; a file the user has since added settings to is kept
    without the import."""
    tomlkit = _tomlkit()
    without = containerd_without_nvidia(current_text, dropin_glob)
    if original_text is not None:
        try:
            if tomlkit.parse(without).unwrap() == tomlkit.parse(original_text).unwrap():
                return original_text
        except Exception:  # an unreadable record: fall back to the structural undo
            pass
    elif created and set(tomlkit.parse(without).unwrap()) <= {"version"}:
        return None
    return without


def containerd_config_error(text, path="/etc/containerd/config.toml"):
    """Why the main configuration cannot be read as TOML ('' when it can); checked before
    uninstall changes anything."""
    tomlkit = _tomlkit()
    try:
        tomlkit.parse(text or "")
    except Exception as exc:
        return "%s is not valid TOML: %s" % (path, exc)
    return ""


def _indent(text):
    for line in (text or "").splitlines()[1:]:
        stripped = line.lstrip(" ")
        if stripped and len(stripped) < len(line):
            return len(line) - len(stripped)
    return 2


def docker_daemon_nvidia(
    text, binary="/usr/bin/nvidia-container-runtime", set_default=False, runtime_name="nvidia"
):
    """daemon.json with the nvidia runtime merged in; every other key kept, in order."""
    data = _daemon_json(text)
    before = copy.deepcopy(data)
    runtimes = data.setdefault("runtimes", {})
    entry = dict(runtimes.get(runtime_name) or {})
    entry["path"] = binary
    entry.setdefault("args", [])
    runtimes[runtime_name] = entry
    if set_default:
        data["default-runtime"] = runtime_name
    if data == before and (text or "").strip():
        return text  # nothing to add: keep the file byte for byte
    return json.dumps(data, indent=_indent(text)) + "\n"


def _daemon_json(text):
    try:
        data = json.loads(text) if (text or "").strip() else {}
    except ValueError as exc:
        raise AnsibleFilterError("/etc/docker/daemon.json is not valid JSON: %s" % exc) from None
    if not isinstance(data, dict):
        raise AnsibleFilterError("/etc/docker/daemon.json must hold a JSON object")
    return data


def docker_daemon_error(text):
    """Why daemon.json cannot be merged ('' when it can); checked before anything is written."""
    try:
        _daemon_json(text)
    except AnsibleFilterError as exc:
        return str(exc)
    return ""


def docker_daemon_restore(current_text, original_text=None, runtime_name="nvidia"):
    """daemon.json with gpustack's keys put back as the original had them (uninstall).

    The runtime entry `runtime_name`, and `default-runtime` while it names that entry, take the
    original's values, or go when the original had none; every other key stays as it is now.
    The original bytes come back when nothing else was edited since; None when gpustack created
    the file (no original) and nothing else is left in it.
    """
    current = _daemon_json(current_text)
    original = _daemon_json(original_text) if original_text is not None else {}
    data = copy.deepcopy(current)
    runtimes, before = data.get("runtimes"), original.get("runtimes")
    if isinstance(runtimes, dict):
        if isinstance(before, dict) and runtime_name in before:
            runtimes[runtime_name] = before[runtime_name]
        else:
            runtimes.pop(runtime_name, None)
        if not runtimes and "runtimes" not in original:
            data.pop("runtimes")
    if data.get("default-runtime") == runtime_name:
        if "default-runtime" in original:
            data["default-runtime"] = original["default-runtime"]
        else:
            data.pop("default-runtime")
    if original_text is not None and data == original:
        return original_text  # untouched since: the user's bytes, formatting and all
    if original_text is None and not data:
        return None
    if data == current:
        return current_text
    return json.dumps(data, indent=_indent(current_text)) + "\n"


def docker_info(answer):
    """The runtimes and the default runtime from `docker info` run with the role's format
    (a command result: rc, stdout); `answered` is false when Docker did not answer."""
    empty = {"answered": False, "runtimes": {}, "default": None}
    if not isinstance(answer, dict) or answer.get("rc") != 0:
        return empty
    try:
        data = json.loads(answer.get("stdout") or "")
    except ValueError:
        return empty
    if not isinstance(data, dict) or not isinstance(data.get("runtimes"), dict):
        return empty
    return {"answered": True, "runtimes": data["runtimes"], "default": data.get("default")}


def docker_loaded(answer, want):
    """Whether the running dockerd loaded the runtime `want["name"]` with `want["binary"]` (and
    as its default when `want["default"]`): what a container started with `--runtime nvidia` (or
    a RuntimeClass) gets."""
    info = docker_info(answer)
    entry = info["runtimes"].get(want["name"])
    if not isinstance(entry, dict) or entry.get("path") != want["binary"]:
        return False
    set_default = str(want.get("default")).lower() in ("1", "true", "yes")
    return not set_default or info["default"] == want["name"]


def toml_canonical(text):
    """One stable string per TOML document: `containerd config dump` prints Go maps (and the
    `imports` list) in random order, so two dumps of one configuration can differ as text."""
    try:
        data = tomllib.loads(text) if tomllib else _plain(_tomlkit().parse(text))
    except Exception:
        return text
    if isinstance(data.get("imports"), list):
        data["imports"] = sorted(data["imports"])  # containerd lists them in map order too
    return json.dumps(data, sort_keys=True, default=str)


def containerd_verify_problems(runtime, loaded, name="nvidia", binary="", config=""):
    """Which of containerd's verify conditions failed, one sentence each ([] when none):
    `runtime` is the gpustack_runtime fact (wired, container_check), `loaded` the loaded-state
    check's result (restart_pending, differences). The failure message names only these, not
    the conditions that held."""
    runtime, loaded = runtime or {}, loaded or {}
    problems = []
    if str(runtime.get("wired")).lower() not in ("true", "1", "yes"):
        problems.append(
            "the %s runtime with BinaryName %s is not in the effective configuration "
            "(`containerd --config %s config dump`)" % (name, binary, config)
        )
    if loaded.get("restart_pending"):
        problems.append(
            "gpustack's restart-pending marker is still there (containerd was not restarted "
            "after gpustack changed its files)"
        )
    if loaded.get("differences"):
        problems.append(
            "the running containerd differs from its files (%s)" % "; ".join(loaded["differences"])
        )
    check = str(runtime.get("container_check") or "")
    if check.startswith("failed"):
        problems.append("the test container failed (%s)" % check[len("failed") :].lstrip(": "))
    return problems


def flatten(value, prefix=""):
    """{'a': {'b': 1}} -> {'a.b': 1}; lists kept as values. For comparing config dumps."""
    out = {}
    if isinstance(value, dict):
        for key, item in value.items():
            out.update(flatten(item, "%s.%s" % (prefix, key) if prefix else str(key)))
    else:
        out[prefix] = value
    return out


def k3s_read_templates(files, name, want_default=False, config_version=2):
    """k3s_templates (module_utils/gpustack_k3s.py) on gpustack_reads' answer: files is
    {file name: {exists, content (base64)}}; names other than the templates are ignored."""
    texts = {}
    for key in TEMPLATES:
        found = files.get(key) or {}
        texts[key] = (
            base64.b64decode(found.get("content") or "").decode("utf-8", "replace")
            if found.get("exists")
            else None
        )
    return k3s_templates(texts, name, want_default, config_version)


def k3s_generated(text, name, binary):
    """What containerd runs on a k3s/RKE2 host: {wired, default} from the config.toml k3s
    generated, read as a `containerd config dump` is (_dump_runtimes)."""
    try:
        runtimes, default = _dump_runtimes(text or "")
    except AnsibleFilterError:
        return {"wired": False, "default": False}
    entry = runtimes.get(name) or {}
    return {
        "wired": (entry.get("options") or {}).get("BinaryName") == binary,
        "default": default == name,
    }


class FilterModule(object):
    def filters(self):
        return {
            "gpustack_containerd_nvidia": containerd_nvidia,
            "gpustack_containerd_without_nvidia": containerd_without_nvidia,
            "gpustack_containerd_restore": containerd_restore,
            "gpustack_containerd_config_error": containerd_config_error,
            "gpustack_docker_daemon_nvidia": docker_daemon_nvidia,
            "gpustack_docker_daemon_error": docker_daemon_error,
            "gpustack_docker_daemon_restore": docker_daemon_restore,
            "gpustack_docker_info": docker_info,
            "gpustack_docker_loaded": docker_loaded,
            "gpustack_toml_canonical": toml_canonical,
            "gpustack_containerd_verify_problems": containerd_verify_problems,
            "gpustack_k3s_templates": k3s_read_templates,
            "gpustack_k3s_generated": k3s_generated,
        }
