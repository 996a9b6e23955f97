#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Read-only probe of everything gpustack needs to know about a GPU host, in one pass."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_preflight_facts
short_description: Gather GPU host facts for gpustack in a single round trip
description:
  - Reads OS, kernel, NVIDIA PCI devices, NVSwitch, Secure Boot, nouveau, kernel headers,
    installed and loaded NVIDIA driver, container runtimes, cri-dockerd and the kubelet
    (with the CRI endpoint it talks to).
  - Changes nothing on the host; supports check mode.
  - Publishes the fact C(gpustack_preflight).
options: {}
author: gpustack
"""

RETURN = r"""
ansible_facts:
  description: C(gpustack_preflight) with the keys os, kernel, arch, gpus, nvswitch,
    secure_boot, nouveau_loaded, kernel_headers, driver, runtimes, runtime, kubelet,
    cri_dockerd.
  returned: always
  type: dict
"""

import glob
import os
import platform
import re
import shlex
import subprocess

from ansible.module_utils.basic import AnsibleModule

NVIDIA_VENDOR = "0x10de"
GPU_CLASSES = ("0x0300", "0x0302")  # VGA controller, 3D controller
NVSWITCH_CLASS = "0x0680"  # bridge (other): how NVSwitch enumerates
SECURE_BOOT_VAR = "/sys/firmware/efi/efivars/SecureBoot-8be4df61-93ca-11d2-aa0d-00e098032b8c"
EXTRA_PATH = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
    "/var/lib/rancher/rke2/bin",
]
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
RPM_DRIVER_PACKAGES = [
    "nvidia-driver",
    "kmod-nvidia-open-dkms",
    "kmod-nvidia-latest-dkms",
    "nvidia-driver-cuda",
    "cuda-drivers",
]


def read(path, default=None):
    try:
        with open(path, "r") as fh:
            return fh.read()
    except (IOError, OSError):
        return default


def run(args, with_stderr=False):
    """Run a probe; return (rc, stdout[+stderr]). A missing binary is rc 127."""
    try:
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        out, err = proc.communicate()
        text = out + err if with_stderr else out
        return proc.returncode, text.decode("utf-8", "replace")
    except OSError:
        return 127, ""


def which(name):
    for directory in os.environ.get("PATH", "").split(os.pathsep) + EXTRA_PATH:
        candidate = os.path.join(directory, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


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
    rc, out = run([lspci, "-D", "-mm", "-d", "10de:"])
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


def kernel_headers(kernel, family):
    package = ("kernel-devel-" if family == "RedHat" else "linux-headers-") + kernel
    installed = os.path.isdir("/lib/modules/%s/build" % kernel)
    available = None
    if family == "Debian" and which("apt-cache") and glob.glob("/var/lib/apt/lists/*_Packages*"):
        rc, out = run(["apt-cache", "policy", package])
        match = re.search(r"Candidate:\s*(\S+)", out)
        available = bool(rc == 0 and match and match.group(1) != "(none)")
    return {
        "package": package,
        "installed": installed,
        # None: unknown (no package lists to ask, e.g. before the first apt-get update)
        "available": True if installed else available,
        "modules_dir": os.path.isdir("/lib/modules/%s" % kernel),
    }


def installed_driver(family):
    if family == "Debian" and which("dpkg-query"):
        fmt = "${Package}\t${Version}\t${db:Status-Abbrev}\n"
        _, out = run(["dpkg-query", "-W", "-f", fmt] + DEB_DRIVER_PATTERNS)
        found = []
        for line in out.splitlines():
            parts = line.split("\t")
            if len(parts) == 3 and parts[2][:2] in ("ii", "hi"):  # installed, maybe held
                found.append((parts[0], parts[1]))
    elif family == "RedHat" and which("rpm"):
        _, out = run(
            ["rpm", "-q", "--qf", "%{NAME}\t%{VERSION}-%{RELEASE}\n"] + RPM_DRIVER_PACKAGES
        )
        found = [tuple(line.split("\t")) for line in out.splitlines() if "\t" in line]
    else:
        found = []
    if not found:
        return {"package": None, "version": None}
    # Prefer the driver meta package over kernel-module packages.
    found.sort(
        key=lambda item: (not item[0].startswith(("nvidia-driver", "cuda-drivers")), item[0])
    )
    return {"package": found[0][0], "version": found[0][1]}


def loaded_driver():
    return parse_nvrm_version(read("/proc/driver/nvidia/version"))


def parse_nvrm_version(text):
    """Version from /proc/driver/nvidia/version's NVRM line (proprietary or open modules)."""
    if not text:
        return None
    match = re.search(r"Kernel Module(?: for \S+)?\s+(\d+(?:\.\d+)+)", text)
    return match.group(1) if match else text.splitlines()[0].strip()


def first_version(text):
    match = re.search(r"v?(\d+\.\d+(?:\.\d+)?(?:[-+~][0-9A-Za-z.+~-]*)?)", text or "")
    return match.group(1) if match else None


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


def service_active(name):
    if not which("systemctl"):
        return None
    rc, _ = run(["systemctl", "is-active", "--quiet", name])
    return rc == 0


def runtimes():
    found = []

    def add(kind, binary, version_args, config_path, service, containerd_config):
        rc, out = run([binary] + version_args)
        entry = {
            "kind": kind,
            "binary": binary,
            "version": first_version(out) if rc == 0 else None,
            "config_path": config_path,
            "config_exists": os.path.exists(config_path),
            "config_version": None,
            "active": service_active(service),
        }
        if containerd_config:
            entry["config_version"] = containerd_config_version(config_path)
        found.append(entry)

    k3s = which("k3s")
    if k3s:
        add(
            "k3s",
            k3s,
            ["--version"],
            "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
            "k3s",
            True,
        )
    rke2 = which("rke2")
    if rke2 or os.path.isdir("/var/lib/rancher/rke2/bin"):
        add(
            "rke2",
            rke2 or "/var/lib/rancher/rke2/bin/containerd",
            ["--version"],
            "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
            "rke2-server",
            True,
        )
    crio = which("crio")
    if crio:
        add("crio", crio, ["--version"], "/etc/crio/crio.conf", "crio", False)
    containerd = which("containerd")
    if containerd and not (k3s or rke2):
        add(
            "containerd",
            containerd,
            ["--version"],
            "/etc/containerd/config.toml",
            "containerd",
            True,
        )
    dockerd = which("dockerd")
    if dockerd:
        add("docker", dockerd, ["--version"], "/etc/docker/daemon.json", "docker", False)
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


KUBELET_FLAG_FILES = (
    "/var/lib/kubelet/kubeadm-flags.env",
    "/etc/default/kubelet",
    "/etc/sysconfig/kubelet",
)
KUBELET_CONFIG_FILES = ("/var/lib/kubelet/config.yaml",)
CRI_DOCKERD_SOCKETS = ("/run/cri-dockerd.sock", "/var/run/cri-dockerd.sock")


def flag_value(args, name):
    """The value of --name=V or --name V in an argument list (the last one wins)."""
    value = None
    for index, arg in enumerate(args):
        if arg.startswith("--" + name + "="):
            value = arg.split("=", 1)[1]
        elif arg == "--" + name and index + 1 < len(args):
            value = args[index + 1]
    return value


def flags_from_env_file(text):
    """Arguments of a kubelet environment file: KUBELET_KUBEADM_ARGS="--a=b --c d"."""
    args = []
    for line in (text or "").splitlines():
        line = line.strip()
        if line.startswith("#") or "=" not in line:
            continue
        try:
            words = shlex.split(line.split("=", 1)[1])
        except ValueError:
            continue
        for word in words:
            args.extend(word.split())
    return args


def config_runtime_endpoint(text):
    """containerRuntimeEndpoint of a KubeletConfiguration file (Kubernetes 1.27 and later)."""
    match = re.search(r"^containerRuntimeEndpoint:\s*[\"']?([^\"'\s#]+)", text or "", re.M)
    return match.group(1) if match else None


def kubelet_process_args():
    """The running kubelet's arguments, read from /proc (None when no kubelet runs)."""
    for cmdline in sorted(glob.glob("/proc/[0-9]*/cmdline")):
        try:
            with open(cmdline, "rb") as fh:
                argv = fh.read().split(b"\0")
        except (IOError, OSError):
            continue
        if argv and os.path.basename(argv[0].decode("utf-8", "replace")) == "kubelet":
            return [a.decode("utf-8", "replace") for a in argv[1:] if a]
    return None


def kubelet_runtime_endpoint(process_args=None, read_file=read):
    """(endpoint, where it was read) of the kubelet's container runtime endpoint."""
    if process_args is not None:
        endpoint = flag_value(process_args, "container-runtime-endpoint")
        if endpoint:
            return endpoint, "kubelet process"
        config = flag_value(process_args, "config")
        if config:
            endpoint = config_runtime_endpoint(read_file(config))
            if endpoint:
                return endpoint, config
    for path in KUBELET_FLAG_FILES:
        endpoint = flag_value(flags_from_env_file(read_file(path)), "container-runtime-endpoint")
        if endpoint:
            return endpoint, path
    for path in KUBELET_CONFIG_FILES:
        endpoint = config_runtime_endpoint(read_file(path))
        if endpoint:
            return endpoint, path
    return None, None


def cri_of(endpoint):
    """Which CRI implementation a kubelet endpoint names."""
    if not endpoint:
        return None
    name = endpoint.lower()
    for marker, kind in (
        ("cri-dockerd", "cri-dockerd"),
        ("dockershim", "dockershim"),
        ("crio", "crio"),
        ("containerd", "containerd"),
    ):
        if marker in name:
            return kind
    return "other"


def cri_dockerd(kubelet_cri, kubelet_present):
    """cri-dockerd (Mirantis), the CRI shim through which a kubelet runs its pods in Docker."""
    binary = which("cri-dockerd")
    socket = next((p for p in CRI_DOCKERD_SOCKETS if os.path.exists(p)), None)
    version = None
    if binary:
        rc, out = run([binary, "--version"], with_stderr=True)
        version = first_version(out) if rc == 0 else None
    present = bool(binary or socket)
    # Endpoint unknown (no kubelet flags found): a kubelet next to cri-dockerd uses it.
    serves = kubelet_cri == "cri-dockerd" or (kubelet_cri is None and present and kubelet_present)
    return {
        "present": present,
        "binary": binary,
        "version": version,
        "socket": socket,
        "active": service_active("cri-docker") if present else None,
        "serves_kubelet": bool(serves),
        "runtime_handlers": runtime_handlers(version),
    }


# cri-dockerd passes a RuntimeClass handler other than Docker's default to Docker only from
# 0.4.0 (Mirantis/cri-dockerd#350, core/sandbox_run.go); 0.3.x answers
# 'RuntimeHandler "nvidia" not supported'.
CRI_DOCKERD_HANDLERS_SINCE = (0, 4, 0)


def version_tuple(version):
    """'0.3.16' -> (0, 3, 16); '0.4.0-rc.1' -> (0, 4, 0); None without a leading number."""
    parts = []
    for piece in (version or "").split("."):
        match = re.match(r"\d+", piece)
        if not match:
            break
        parts.append(int(match.group(0)))
        if match.end() < len(piece):
            break
    return tuple(parts) or None


def runtime_handlers(version):
    """Whether this cri-dockerd runs RuntimeClass handlers (None: version unknown)."""
    parsed = version_tuple(version)
    return None if parsed is None else parsed >= CRI_DOCKERD_HANDLERS_SINCE


def kubelet():
    binary = which("kubelet")
    unit = any(
        os.path.exists(p)
        for p in (
            "/etc/systemd/system/kubelet.service",
            "/lib/systemd/system/kubelet.service",
            "/usr/lib/systemd/system/kubelet.service",
        )
    )
    version = None
    if binary:
        rc, out = run([binary, "--version"])
        version = first_version(out) if rc == 0 else None
    endpoint, source = kubelet_runtime_endpoint(kubelet_process_args())
    return {
        "present": bool(binary or unit),
        "version": version,
        "runtime_endpoint": endpoint,
        "runtime_endpoint_source": source,
        "cri": cri_of(endpoint),
    }


def gather():
    osinfo = os_release()
    kernel = platform.release()
    modules = loaded_modules()
    gpus, switches = pci_devices()
    found = runtimes()
    kube = kubelet()
    return {
        "os": osinfo,
        "kernel": kernel,
        "arch": platform.machine(),
        "gpus": {"count": len(gpus), "devices": gpus},
        "nvswitch": {"present": bool(switches), "count": len(switches)},
        "secure_boot": secure_boot(),
        "nouveau_loaded": "nouveau" in modules,
        "nvidia_module_loaded": "nvidia" in modules,
        "kernel_headers": kernel_headers(kernel, osinfo["family"]),
        "driver": {
            "installed": installed_driver(osinfo["family"]),
            "loaded_version": loaded_driver(),
        },
        "runtimes": found,
        "runtime": primary_runtime(found, kube["cri"]),
        "kubelet": kube,
        "cri_dockerd": cri_dockerd(kube["cri"], kube["present"]),
    }


def main():
    module = AnsibleModule(argument_spec={}, supports_check_mode=True)
    module.exit_json(changed=False, ansible_facts={"gpustack_preflight": gather()})


if __name__ == "__main__":
    main()
