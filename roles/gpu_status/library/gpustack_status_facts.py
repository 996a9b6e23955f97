#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Read-only probe of what the gpustack roles left on a host: pins, holds, toolkit, wiring."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_status_facts
short_description: Read what gpustack installed and wired on a host, in one round trip
description:
  - Reads the driver and toolkit packages, their apt/dnf pins and holds, whether the container
    runtime's effective configuration holds the nvidia runtime, and whether a reboot is pending.
  - Changes nothing (no package list refresh, no service restart); supports check mode.
  - Publishes the fact C(gpustack_status).
options:
  runtime_kind:
    description: Runtime to inspect (containerd, docker, crio, k3s, rke2); empty or none skips it.
    type: str
    default: ""
  containerd_config:
    description: containerd main configuration file.
    type: path
    default: /etc/containerd/config.toml
  nvidia_name:
    description: Name of the runtime entry gpustack adds.
    type: str
    default: nvidia
  nvidia_binary:
    description: The NVIDIA runtime binary that entry must start.
    type: path
    default: /usr/bin/nvidia-container-runtime
author: gpustack
"""

RETURN = r"""
ansible_facts:
  description: C(gpustack_status) with the keys driver, toolkit, runtime, reboot_required_file.
  returned: always
  type: dict
"""

import json
import os
import re
import subprocess

from ansible.module_utils.basic import AnsibleModule

DRIVER_PIN = "/etc/apt/preferences.d/gpustack-nvidia-driver.pref"
TOOLKIT_PIN = "/etc/apt/preferences.d/gpustack-nvidia-container-toolkit.pref"
TOOLKIT_PACKAGES = [
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
]
DRIVER_PATTERNS = ["nvidia-*", "libnvidia-*", "libcuda1", "cuda-drivers*", "firmware-nvidia-*"]
EXTRA_PATH = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
    "/var/lib/rancher/rke2/bin",
]
K3S_CONFIG = {
    "k3s": "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
    "rke2": "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
}


def read(path, default=None):
    try:
        with open(path, "r") as fh:
            return fh.read()
    except (IOError, OSError):
        return default


def run(args):
    try:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = proc.communicate()
        return proc.returncode, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
    except OSError as exc:
        return 127, "", str(exc)


def which(name):
    for directory in os.environ.get("PATH", "").split(os.pathsep) + EXTRA_PATH:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def pinned_version(text):
    """The version of an apt preferences file gpustack wrote (`Pin: version X`)."""
    match = re.search(r"^Pin:\s*version\s+(\S+)", text or "", re.MULTILINE)
    return match.group(1) if match else None


def pins(text):
    """{package: version} of every `Package:`/`Pin: version` stanza of a gpustack pin file."""
    found = {}
    for stanza in re.split(r"\n\s*\n", text or ""):
        package = re.search(r"^Package:\s*(.+)$", stanza, re.MULTILINE)
        version = re.search(r"^Pin:\s*version\s+(\S+)", stanza, re.MULTILINE)
        if package and version:
            for name in package.group(1).split():
                found[name] = version.group(1)
    return found


def parse_dpkg(text):
    """`Package Version Status-Abbrev` lines -> {package: version} of installed packages."""
    found = {}
    for line in (text or "").splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[2][:2] in ("ii", "hi"):
            found[parts[0]] = parts[1]
    return found


def packages(names):
    if which("dpkg-query"):
        _, out, _ = run(
            ["dpkg-query", "-W", "-f=${Package} ${Version} ${db:Status-Abbrev}\n"] + names
        )
        return parse_dpkg(out)
    if which("rpm"):
        _, out, _ = run(["rpm", "-qa", "--qf", "%{NAME} %{VERSION}-%{RELEASE} ii\n"] + names)
        return parse_dpkg(out)
    return {}


def holds():
    if which("apt-mark"):
        _, out, _ = run(["apt-mark", "showhold"])
        return sorted(set(out.split()))
    if which("dnf"):
        # versionlock entries look like name-epoch:version-release.*
        text = read("/etc/dnf/plugins/versionlock.list", "") or ""
        lines = [line for line in text.splitlines() if line.strip() and line[0] != "#"]
        return sorted(set(re.sub(r"-[0-9]+:.*$", "", line).strip() for line in lines))
    return []


def toml_has_runtime(text, name, binary):
    """Whether a (dumped) TOML text defines runtimes.<name> with BinaryName <binary>."""
    quoted = r"[\"']?%s[\"']?" % re.escape(name)
    header = re.compile(r"^\s*\[.*\.runtimes\.%s(\.options)?\]\s*$" % quoted)
    in_entry = False
    has_entry = has_binary = False
    for line in (text or "").splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            in_entry = bool(header.match(stripped))
            has_entry = has_entry or in_entry
            continue
        if in_entry and re.match(r"BinaryName\s*=\s*[\"']%s[\"']" % re.escape(binary), stripped):
            has_binary = True
    return has_entry and has_binary


def runtime_wiring(kind, containerd_config, name, binary):
    result = {
        "kind": kind or None,
        "wired": None,
        "binary_present": os.path.exists(binary),
        "detail": "",
    }
    if not kind or kind == "none":
        result["detail"] = "no container runtime"
        return result
    if kind == "containerd":
        config = containerd_config if os.path.exists(containerd_config) else "/dev/null"
        rc, out, err = run(["containerd", "--config", config, "config", "dump"])
        if rc != 0:
            result["detail"] = "containerd config dump failed: " + " ".join(err.split())[:300]
            result["wired"] = False
            return result
        result["wired"] = toml_has_runtime(out, name, binary)
        result["detail"] = "effective configuration (containerd config dump)"
    elif kind == "docker":
        try:
            data = json.loads(read("/etc/docker/daemon.json", "") or "{}")
        except ValueError:
            data = {}
            result["detail"] = "/etc/docker/daemon.json is not valid JSON"
        entry = (data.get("runtimes") or {}).get(name) or {}
        result["wired"] = entry.get("path") == binary
        result["detail"] = result["detail"] or "/etc/docker/daemon.json"
    elif kind == "crio":
        text = read("/etc/crio/crio.conf.d/99-%s.toml" % name, "") or ""
        result["wired"] = ("runtimes.%s" % name) in text and binary in text
        result["detail"] = "/etc/crio/crio.conf.d/99-%s.toml" % name
    elif kind in K3S_CONFIG:
        generated = read(K3S_CONFIG[kind], "") or ""
        template = read(K3S_CONFIG[kind] + ".tmpl", "") or ""
        in_template = re.search(r"runtimes\.[\"']?%s[\"']?" % re.escape(name), template)
        result["wired"] = toml_has_runtime(generated, name, binary) or bool(
            in_template and binary in template
        )
        result["detail"] = K3S_CONFIG[kind]
    return result


def gather(params):
    driver_pkgs = packages(DRIVER_PATTERNS)
    driver_pkgs = dict(
        (k, v)
        for k, v in driver_pkgs.items()
        if not k.startswith(("nvidia-container", "libnvidia-container"))
    )
    toolkit_pkgs = packages(TOOLKIT_PACKAGES)
    held = holds()
    return {
        "driver": {
            "packages": driver_pkgs,
            "held": [p for p in held if p in driver_pkgs],
            "pinned_version": pinned_version(read(DRIVER_PIN)),
            "pins": pins(read(DRIVER_PIN)),
        },
        "toolkit": {
            "installed_version": toolkit_pkgs.get("nvidia-container-toolkit"),
            "packages": toolkit_pkgs,
            "held": [p for p in held if p in toolkit_pkgs],
            "pinned_version": pinned_version(read(TOOLKIT_PIN)),
        },
        "runtime": runtime_wiring(
            params["runtime_kind"],
            params["containerd_config"],
            params["nvidia_name"],
            params["nvidia_binary"],
        ),
        "reboot_required_file": os.path.exists("/var/run/reboot-required"),
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            runtime_kind=dict(type="str", default=""),
            containerd_config=dict(type="path", default="/etc/containerd/config.toml"),
            nvidia_name=dict(type="str", default="nvidia"),
            nvidia_binary=dict(type="path", default="/usr/bin/nvidia-container-runtime"),
        ),
        supports_check_mode=True,
    )
    module.exit_json(changed=False, ansible_facts={"gpustack_status": gather(module.params)})


if __name__ == "__main__":
    main()
