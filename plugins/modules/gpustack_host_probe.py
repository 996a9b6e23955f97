#!/usr/bin/python
# -*- coding: utf-8 -*-
"""The one read-only host probe: preflight facts, what gpustack left on the host, and the
converged stamps re-checked - whatever a command needs, in one module call per host."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_host_probe
short_description: Read a GPU host for gpustack in one round trip
version_added: 0.1.0
description:
  - Section preflight (always) - OS, kernel, NVIDIA PCI devices, NVSwitch, Secure Boot, nouveau,
    kernel headers, installed and loaded NVIDIA driver, container runtimes, cri-dockerd and the
    kubelet (with the CRI endpoint it talks to); fact C(gpustack_preflight).
  - Section status - the driver and toolkit packages, their pins and holds, whether the
    runtime's configuration holds the nvidia runtime, a pending reboot; fact C(gpustack_status).
  - Section converged - every converged stamp re-checked on the host (files, packages, holds,
    services, containerd's effective configuration, versions offered); fact
    C(gpustack_converged_probe). The stamps are written by C(gpustack_converged).
  - Section loaded - on a containerd host, the runtime handlers the running containerd loaded
    against those of its files, and gpustack's restart-pending marker; fact
    C(gpustack_runtime_loaded) (the check C(gpustack_containerd_loaded) makes during install).
    On a Docker host, whether the running dockerd loaded the nvidia runtime (C(docker info)).
  - Section headers - whether the package sources offer the running kernel's missing headers
    (C(kernel_headers.available); C(apt-cache policy) loads the whole package cache, so only
    doctor asks; without it C(available) is null unless the headers are installed).
  - Section dpkg - on a dpkg host, whether dpkg is usable as C(gpustack_dpkg_ready) finds it
    (the holders of dpkg's and apt's locks, what an interrupted run left, python3-apt for
    Ansible's apt module), without waiting; fact C(gpustack_dpkg_probe). site.yml asks for it,
    and includes roles/dpkg_ready only where it found something to wait for or finish. Not read
    where section converged found every stamp without a problem (a no-op install's hosts).
  - Paths come from the role's vars (roles/gpu_preflight/vars/main.yml). Changes nothing (no
    package list refresh, no restart); supports check mode.
options:
  sections:
    description: Sections beyond preflight.
    type: list
    elements: str
    choices: [status, converged, loaded, headers, dpkg]
    default: []
  runtimes:
    description: Per runtime kind (k3s, rke2, crio, containerd, docker) - config, service (a unit,
      or the units one of which runs it - k3s or k3s-agent, rke2-server or rke2-agent).
    type: dict
    required: true
  rke2_bin:
    description: RKE2's binary directory (searched after PATH).
    type: path
    required: true
  runtime:
    description: For sections status and loaded, the runtime gpustack wires - kind (empty -
      preflight's choice), containerd_config, nvidia_name, nvidia_binary, crio_dropin, socket,
      restart_marker.
    type: dict
    default: {}
  status:
    description: For section status - driver_pin, toolkit_pin, reboot_required, initramfs_marker
      (the driver role's marker of an initramfs regeneration not yet done).
    type: dict
    default: {}
  converged:
    description: For section converged - apt_lists (apt's update stamp, lists), dir (the stamps;
      default that of gpustack_converged).
    type: dict
    default: {}
author: gpustack
"""

EXAMPLES = r"""
- name: Preflight facts and what gpustack left on the host
  gpustack.gpustack.gpustack_host_probe:
    sections: [status]
    runtimes:
      k3s:
        config: /var/lib/rancher/k3s/agent/etc/containerd/config.toml
        service: [k3s, k3s-agent]
      containerd: {config: /etc/containerd/config.toml, service: containerd}
      docker: {config: /etc/docker/daemon.json, service: docker}
    rke2_bin: /var/lib/rancher/rke2/bin

- name: Show the GPUs found
  ansible.builtin.debug:
    msg: "{{ gpustack_preflight.gpus }}"
"""

RETURN = r"""
ansible_facts:
  description: C(gpustack_preflight) (keys os, kernel, arch, gpus, nvswitch, secure_boot, systemd,
    nouveau_loaded, nvidia_module_loaded, kernel_headers, driver, runtimes, runtime, kubelet,
    cri_dockerd); with section status C(gpustack_status) (driver, toolkit, runtime,
    reboot_required_file); with section converged C(gpustack_converged_probe) (stamps,
    apt_lists_age); with section loaded, on containerd, C(gpustack_runtime_loaded) (kind,
    available, error, differences, restart_pending; on Docker kind, available, error,
    runtime_loaded); with section dpkg, on a dpkg host, C(gpustack_dpkg_probe) (holders, audit,
    python_apt, ready). roles/gpu_preflight/README.md documents them.
  returned: always
  type: dict
"""

import glob
import json
import os
import platform
import re
import shlex

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_containerd import (
    loaded_state,
)
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_dpkg import (
    audit,
    lock_holders,
    python_apt,
)
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_host import (
    EXTRA_PATH,
    effective_dump,
    first_version,
    holds,
    packages,
    pinned_version,
    pins,
    process,
    read,
    run,
    service_active,
    service_states,
    toml_enable_cdi,
    toml_has_runtime,
    which,
)
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_k3s import (
    TEMPLATES,
    k3s_templates,
)
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_kubelet import (
    cri_dockerd,
    kubelet,
)
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_stamps import (
    docker_loaded,
)
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_stamps import (
    probe as probe_stamps,
)

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA controller, 3D controller
NVSWITCH_CLASS = "0x0680"  # bridge (other): how NVSwitch enumerates
SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
DEB_DRIVER_PATTERNS = [
    "nvidia-driver",
    "nvidia-driver-*",
    "nvidia-headless-*",
    "cuda-drivers",
    "nvidia-kernel-dkms",
    "nvidia-kernel-open-dkms",
    "nvidia-open-kernel-dkms",
    "nvidia-dkms-*",
]
# What status lists as the driver's and the toolkit's packages (dpkg patterns).
DRIVER_PACKAGES = ["nvidia-*", "libnvidia-*", "libcuda1", "cuda-drivers*", "firmware-nvidia-*"]
TOOLKIT_PACKAGES = [
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
    "libnvidia-container-tools",
    "libnvidia-container1",
]
RPM_DRIVER_PACKAGES = [
    "nvidia-driver",
    "kmod-nvidia-open-dkms",
    "kmod-nvidia-latest-dkms",
    "nvidia-driver-cuda",
    "cuda-drivers",
]


def os_release():
    data = {}
    for line in (read("/etc/os-release", "") or "").splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            data[key.strip()] = value.strip().strip('"')
    like = data.get("ID_LIKE", "").split()
    os_id = data.get("ID", "unknown")
    if os_id in ("debian", "ubuntu") or "debian" in like:
        family = "Debian"
    elif os_id in ("rhel", "centos", "rocky", "almalinux", "fedora") or "rhel" in like:
        family = "RedHat"
    else:
        family = "unknown"
    return {
        "id": os_id,
        "version_id": data.get("VERSION_ID", ""),
        "codename": data.get("VERSION_CODENAME", ""),
        "pretty_name": data.get("PRETTY_NAME", os_id),
        "family": family,
    }


def pci_devices():
    """NVIDIA GPUs and NVSwitches from sysfs; model names from lspci when it is there."""
    gpus, switches = [], []
    for dev in sorted(glob.glob("/sys/bus/pci/devices/*")):
        if (read(os.path.join(dev, "vendor"), "") or "").strip() != NVIDIA_VENDOR:
            continue
        pci_class = (read(os.path.join(dev, "class"), "") or "").strip()[:6]
        entry = {
            "pci_address": os.path.basename(dev),
            "device_id": (read(os.path.join(dev, "device"), "") or "").strip(),
            "class": pci_class,
            "model": "",
        }
        if pci_class in GPU_CLASSES:
            gpus.append(entry)
        elif pci_class == NVSWITCH_CLASS:
            switches.append(entry)
    names = lspci_names() if gpus or switches else {}
    for entry in gpus + switches:
        short = entry["pci_address"].split(":", 1)[-1]
        entry["model"] = (
            names.get(entry["pci_address"])
            or names.get(short)
            or ("NVIDIA device " + entry["device_id"])
        )
    return gpus, switches


def lspci_names():
    lspci = which("lspci")
    if not lspci:
        return {}
    rc, out, _ = run([lspci, "-D", "-mm", "-d", "10de:"])
    names = {}
    if rc != 0:
        return names
    for line in out.splitlines():
        try:
            fields = shlex.split(line)
        except ValueError:
            continue
        if len(fields) >= 4:
            names[fields[0]] = fields[3]
    return names


def secure_boot():
    if not os.path.isdir("/sys/firmware/efi"):
        return "unsupported"  # legacy BIOS boot: no Secure Boot
    try:
        with open(SECURE_BOOT_VAR, "rb") as fh:
            data = bytearray(fh.read())
    except (IOError, OSError):
        return "unknown"
    if not data:
        return "unknown"
    return "enabled" if data[-1] == 1 else "disabled"


def loaded_modules():
    names = set()
    for line in (read("/proc/modules", "") or "").splitlines():
        if line:
            names.add(line.split()[0])
    return names


def kernel_headers(kernel, family, ask=True):
    package = ("kernel-devel-" if family == "RedHat" else "linux-headers-") + kernel
    installed = os.path.isdir("/lib/modules/%s/build" % kernel)
    available = True if installed else None
    # Installed headers answer the question: apt-cache loads the whole package cache (about a
    # quarter of this module's time on a lab node), so it is asked only when they are missing,
    # and only where the answer is used (section headers: doctor).
    if (
        ask
        and not installed
        and family == "Debian"
        and which("apt-cache")
        and glob.glob("/var/lib/apt/lists/*_Packages*")
    ):
        rc, out, _ = run(["apt-cache", "policy", package])
        match = re.search(r"Candidate:\s*(\S+)", out)
        available = bool(rc == 0 and match and match.group(1) != "(none)")
    return {
        "package": package,
        "installed": installed,
        # None: unknown (no package lists to ask, e.g. before the first apt-get update)
        "available": available,
        "modules_dir": os.path.isdir("/lib/modules/%s" % kernel),
    }


def installed_driver(family):
    if family == "Debian":
        found = sorted(packages(DEB_DRIVER_PATTERNS).items())
    elif family == "RedHat":
        found = sorted(packages(RPM_DRIVER_PACKAGES).items())
    else:
        found = []
    if not found:
        return {"package": None, "version": None, "kernel_modules": None}
    # Prefer the driver meta package over kernel-module packages.
    found.sort(
        key=lambda item: (not item[0].startswith(("nvidia-driver", "cuda-drivers")), item[0])
    )
    return {
        "package": found[0][0],
        "version": found[0][1],
        "kernel_modules": kernel_module_kind([name for name, _ in found]),
    }


def kernel_module_kind(names):
    """'open' or 'proprietary': which kernel modules the installed driver packages carry (the
    open ones' packages say so in their names: nvidia-open-kernel-dkms, nvidia-kernel-open-dkms,
    nvidia-headless-580-server-open, kmod-nvidia-open-dkms); None when no module package is
    among them."""
    if any("open" in name for name in names):
        return "open"
    proprietary = re.compile(
        r"^(nvidia-kernel-dkms|kmod-nvidia-latest-dkms|cuda-drivers.*"
        r"|nvidia-dkms-\d+(-server)?|nvidia-headless-\d+(-server)?)$"
    )
    if any(proprietary.match(name) for name in names):
        return "proprietary"
    return None


def loaded_driver():
    return parse_nvrm_version(read("/proc/driver/nvidia/version"))


def parse_nvrm_version(text):
    """Version from /proc/driver/nvidia/version's NVRM line (proprietary or open modules)."""
    if not text:
        return None
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    return match.group(1) if match else text.splitlines()[0].strip()


def containerd_config_version(path):
    text = read(path)
    if text is None:
        return None
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("["):
            break  # top-level keys come before the first table
        match = re.match(r"version\s*=\s*(\d+)", stripped)
        if match:
            return int(match.group(1))
    return 1  # no version key: containerd reads it as version 1


def runtime_unit(units):
    """The unit that runs a runtime: the first active one of the candidates, else the first one
    installed, else the first (a k3s server runs k3s.service, an agent k3s-agent.service)."""
    units = [units] if isinstance(units, str) else list(units)
    if len(units) == 1:
        return units[0]
    states = service_states([unit + ".service" for unit in units])
    for unit in units:
        if states[unit + ".service"]["active"] == "active":
            return unit
    for unit in units:
        if states[unit + ".service"]["enabled"] not in ("", "not-found"):
            return unit
    return units[0]


def k3s_template_check(config_path, config_version, name):
    """k3s/RKE2: the containerd template k3s reads next to its generated config_path, and what
    gpustack's install would refuse in it (module_utils/gpustack_k3s.py); doctor reports it."""
    directory = os.path.dirname(config_path)
    files = dict((file, read(os.path.join(directory, file))) for file in TEMPLATES)
    check = k3s_templates(files, name, False, config_version or 2)
    return {
        "template": os.path.join(directory, check["active"]) if check["active"] else None,
        "error": check["error"],
        "hint": check["hint"],
    }


def runtimes(where, rke2_bin, nvidia_name="nvidia"):
    """The container runtimes on the host; where: {kind: {config, service}} (role vars)."""
    found = []

    def add(kind, binary):
        rc, out, _ = run([binary, "--version"])
        config_path = where[kind]["config"]
        unit = runtime_unit(where[kind]["service"])
        entry = {
            "kind": kind,
            "binary": binary,
            "version": first_version(out) if rc == 0 else None,
            "config_path": config_path,
            "config_exists": os.path.exists(config_path),
            "config_version": None,
            "service": unit,
            "active": service_active(unit),
        }
        if kind not in ("crio", "docker"):  # containerd's TOML, k3s and RKE2 included
            entry["config_version"] = containerd_config_version(config_path)
        if kind in ("k3s", "rke2"):
            entry["template_check"] = k3s_template_check(
                config_path, entry["config_version"], nvidia_name
            )
        found.append(entry)

    k3s = which("k3s")
    if k3s:
        add("k3s", k3s)
    rke2 = which("rke2")
    if rke2 or os.path.isdir(rke2_bin):
        add("rke2", rke2 or os.path.join(rke2_bin, "containerd"))
    crio = which("crio")
    if crio:
        add("crio", crio)
    containerd = which("containerd")
    if containerd and not (k3s or rke2):
        add("containerd", containerd)
    dockerd = which("dockerd")
    if dockerd:
        add("docker", dockerd)
    return found


def primary_runtime(found, kubelet_cri=None):
    """The runtime gpustack will wire: Kubernetes distributions first, then the runtime the
    kubelet talks to, then CRI runtimes."""
    kinds = [entry["kind"] for entry in found]
    for kind in ("k3s", "rke2", "crio"):
        if kind in kinds:
            return kind
    # A kubelet behind cri-dockerd runs its pods in Docker, whatever containerd is there.
    if kubelet_cri == "cri-dockerd" and "docker" in kinds:
        return "docker"
    if "docker" in kinds and "containerd" in kinds:
        # containerd next to Docker is Docker's unless it serves CRI to a kubelet.
        return "containerd" if which("kubelet") else "docker"
    return kinds[0] if kinds else None


def preflight(params):
    """Section preflight (always): fact gpustack_preflight; section headers asks apt whether
    missing kernel headers are offered."""
    osinfo = os_release()
    kernel = platform.release()
    modules = loaded_modules()
    gpus, switches = pci_devices()
    found = runtimes(
        params["runtimes"], params["rke2_bin"], params["runtime"].get("nvidia_name") or "nvidia"
    )
    kube = kubelet()
    return {
        "os": osinfo,
        "kernel": kernel,
        "arch": platform.machine(),
        "gpus": {"count": len(gpus), "devices": gpus},
        "nvswitch": {"present": bool(switches), "count": len(switches)},
        "secure_boot": secure_boot(),
        # sd_booted(3): systemd is the running init (the runtime's restart needs it)
        "systemd": os.path.isdir("/run/systemd/system"),
        "nouveau_loaded": "nouveau" in modules,
        "nvidia_module_loaded": "nvidia" in modules,
        "kernel_headers": kernel_headers(kernel, osinfo["family"], "headers" in params["sections"]),
        "driver": {
            "installed": installed_driver(osinfo["family"]),
            "loaded_version": loaded_driver(),
        },
        "runtimes": found,
        "runtime": primary_runtime(found, kube["cri"]),
        "kubelet": kube,
        "cri_dockerd": cri_dockerd(kube["cri"], kube["present"]),
    }


def runtime_wiring(kind, spec, where):
    """Whether the runtime's configuration holds the nvidia runtime (spec: containerd_config,
    nvidia_name, nvidia_binary, crio_dropin; where: {kind: {config}} as for preflight)."""
    name, binary = spec["nvidia_name"], spec["nvidia_binary"]
    result = {
        "kind": kind or None,
        "wired": None,
        "binary_present": os.path.exists(binary),
        "detail": "",
        "cdi": None,  # containerd: enable_cdi in force (None: no such setting, or not containerd)
    }
    if not kind or kind == "none":
        result["detail"] = "no container runtime"
        return result
    if kind == "containerd":
        config = spec["containerd_config"]
        rc, out, err = effective_dump(config)
        if rc != 0:
            result["detail"] = "containerd config dump failed: " + " ".join(err.split())[:300]
            result["wired"] = False
            return result
        result["wired"] = toml_has_runtime(out, name, binary)
        result["cdi"] = toml_enable_cdi(out)
        result["detail"] = "effective configuration (containerd config dump)"
    elif kind == "docker":
        path = where["docker"]["config"]
        try:
            data = json.loads(read(path, "") or "{}")
        except ValueError:
            data = {}
            result["detail"] = "%s is not valid JSON" % path
        entry = (data.get("runtimes") or {}).get(name) or {}
        result["wired"] = entry.get("path") == binary
        result["detail"] = result["detail"] or path
    elif kind == "crio":
        text = read(spec["crio_dropin"], "") or ""
        result["wired"] = ("runtimes.%s" % name) in text and binary in text
        result["detail"] = spec["crio_dropin"]
    elif kind in ("k3s", "rke2"):
        # What containerd runs: the file k3s/RKE2 generated at its last start (a template only
        # takes effect at the next one).
        path = where[kind]["config"]
        result["wired"] = toml_has_runtime(read(path, "") or "", name, binary)
        result["detail"] = path
    return result


def status(params, kind):
    """Section status: fact gpustack_status - what the host roles left (pins, holds, wiring)."""
    spec = params["status"]
    # One dpkg-query: DRIVER_PACKAGES' patterns match the toolkit's packages too.
    nvidia = packages(DRIVER_PACKAGES)
    driver_pkgs = dict(
        (k, v)
        for k, v in nvidia.items()
        if not k.startswith(("nvidia-container", "libnvidia-container"))
    )
    toolkit_pkgs = dict((k, nvidia[k]) for k in TOOLKIT_PACKAGES if k in nvidia)
    held = holds()
    driver_pin = read(spec["driver_pin"])
    toolkit_pin = read(spec["toolkit_pin"])
    # The driver role enables it; masked (runtime) only during its apt transaction, so a mask
    # seen here was left by a run stopped inside that transaction.
    unit = "nvidia-persistenced.service"
    persistenced = service_states([unit])[unit] if "nvidia-persistenced" in driver_pkgs else None
    return {
        "driver": {
            "packages": driver_pkgs,
            "held": [p for p in held if p in driver_pkgs],
            "pinned_version": pinned_version(driver_pin),
            "pins": pins(driver_pin),
            "persistenced": persistenced,
            "initramfs_pending": bool(spec.get("initramfs_marker"))
            and os.path.exists(spec["initramfs_marker"]),
        },
        "toolkit": {
            "installed_version": toolkit_pkgs.get("nvidia-container-toolkit"),
            "packages": toolkit_pkgs,
            "held": [p for p in held if p in toolkit_pkgs],
            "pinned_version": pinned_version(toolkit_pin),
        },
        "runtime": runtime_wiring(kind, params["runtime"], params["runtimes"]),
        "reboot_required_file": os.path.exists(spec["reboot_required"]),
    }


def looks_converged(facts):
    """Every stamp section converged read shows no problem: the host most likely ends its play
    at the converged check, and dpkg's state is not needed (where it goes on, dpkg_ready reads it
    as before: no fact, no shortcut)."""
    stamps = (facts.get("gpustack_converged_probe") or {}).get("stamps") or {}
    return bool(stamps) and all(not entry.get("problems") for entry in stamps.values())


def dpkg_state():
    """What roles/dpkg_ready's call would find, without its wait: `ready` when no lock is held,
    no interrupted run left anything and python3-apt is there for Ansible's apt module."""
    holders = [process(pid) for pid in lock_holders()]
    found = "" if holders else audit()
    apt = python_apt()
    return {"holders": holders, "audit": found, "python_apt": apt,
            "ready": not holders and not found and apt}  # fmt: skip


def main():
    module = AnsibleModule(
        argument_spec=dict(
            sections=dict(
                type="list",
                elements="str",
                default=[],
                choices=["status", "converged", "loaded", "headers", "dpkg"],
            ),
            runtimes=dict(type="dict", required=True),
            rke2_bin=dict(type="path", required=True),
            runtime=dict(type="dict", default={}),
            status=dict(type="dict", default={}),
            converged=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    params = module.params
    EXTRA_PATH.append(params["rke2_bin"])
    facts = {"gpustack_preflight": preflight(params)}
    # The runtime gpustack wires: the input, else preflight's choice (as container_runtime does).
    kind = params["runtime"].get("kind") or facts["gpustack_preflight"]["runtime"]
    if "status" in params["sections"]:
        facts["gpustack_status"] = status(params, kind)
    if "converged" in params["sections"]:
        facts["gpustack_converged_probe"] = probe_stamps(params["converged"])
    if "loaded" in params["sections"] and kind == "containerd":
        spec = params["runtime"]
        state = loaded_state(spec["containerd_config"], spec["socket"], spec["restart_marker"])
        facts["gpustack_runtime_loaded"] = {
            "kind": kind,
            "available": state["loaded"]["available"],
            "error": state["loaded"]["error"],
            "differences": state["differences"],
            "restart_pending": state["restart_pending"],
        }
    if "loaded" in params["sections"] and kind == "docker":
        spec = params["runtime"]
        loaded = docker_loaded(spec["nvidia_name"], spec["nvidia_binary"])
        facts["gpustack_runtime_loaded"] = {
            "kind": kind,
            "available": loaded is not None,
            "error": "" if loaded is not None else "docker info did not answer",
            "runtime_loaded": bool(loaded),
        }
    if "dpkg" in params["sections"] and which("dpkg") and not looks_converged(facts):
        facts["gpustack_dpkg_probe"] = dpkg_state()
    module.exit_json(changed=False, ansible_facts=facts)


if __name__ == "__main__":
    main()
