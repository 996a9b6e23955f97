# -*- coding: utf-8 -*-
"""The kubelet and cri-dockerd as the host probe sees them (gpustack_host_probe, section
preflight): the kubelet's version and the CRI endpoint it talks to (its running process's flags,
its --config file, kubeadm-flags.env, /etc/default or /etc/sysconfig/kubelet, config.yaml), and
cri-dockerd (Mirantis), the shim through which a kubelet runs its pods in Docker.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import glob
import os
import re
import shlex

from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_host import (
    first_version,
    read,
    run,
    service_active,
    which,
)

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
        rc, out, err = run([binary, "--version"])
        version = first_version(out + err) if rc == 0 else None
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
        rc, out, _ = run([binary, "--version"])
        version = first_version(out) if rc == 0 else None
    endpoint, source = kubelet_runtime_endpoint(kubelet_process_args())
    return {
        "present": bool(binary or unit),
        "version": version,
        "runtime_endpoint": endpoint,
        "runtime_endpoint_source": source,
        "cri": cri_of(endpoint),
    }
