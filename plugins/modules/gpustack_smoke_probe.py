#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Read-only smoke probe: run NVIDIA's own tools on a GPU host and return what they printed."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_smoke_probe
short_description: Run NVIDIA's tools read-only on a GPU host and return their raw output
version_added: 0.1.0
description:
  - Runs C(nvidia-smi -q -x), C(lspci -nn -D -d 10de:), C(systemctl show nvidia-fabricmanager),
    the toolkit's version commands and C(nvidia-container-cli info), C(nvidia-ctk cdi generate)
    into a temporary directory (then C(nvidia-ctk cdi list) on it; the directory is removed),
    and starts one container through the NVIDIA runtime when a runtime and a local image exist.
  - Returns the raw output of every command with its argv and exit code; interpreting it is the
    controller's job (gpustack/smoke/). A tool that is not installed is reported as absent.
  - Changes no package, file or setting on the host. The container check creates one container
    and removes it (C(ctr run --rm), C(docker run --rm)); it never pulls an image.
options:
  runtime_kind:
    description: The container runtime gpustack wires (preflight's choice); empty for none.
    type: str
    default: ""
  nvidia_binary:
    description: The NVIDIA runtime binary containerd's nvidia runtime starts.
    type: path
    default: /usr/bin/nvidia-container-runtime
  nvidia_name:
    description: Name of the nvidia runtime (Docker's --runtime).
    type: str
    default: nvidia
  image:
    description: Local image for the container check; empty picks one, C(none) skips the check.
    type: str
    default: ""
  snapshotter:
    description: containerd snapshotter for the container check (empty - containerd's default).
    type: str
    default: ""
  ctr_args:
    description: Extra C(ctr run) arguments.
    type: list
    elements: str
    default: []
  timeout:
    description: Seconds each command may run before it is stopped.
    type: int
    default: 120
  cdi:
    description: Generate a CDI specification into a temporary directory when nvidia-ctk exists.
    type: bool
    default: true
author: gpustack
"""

EXAMPLES = r"""
- name: Run NVIDIA's tools read-only and keep their raw output
  gpustack.gpustack.gpustack_smoke_probe:
    runtime_kind: containerd
    image: localhost/cuda-sample:latest
  register: smoke
"""

RETURN = r"""
ansible_facts:
  description: C(gpustack_smoke) - hostname, tools, nvidia_smi, proc_driver_version, lspci,
    fabric_manager, toolkit, cdi, container (raw command results - argv, rc, stdout, stderr).
  returned: always
  type: dict
"""

import os
import shutil
import socket
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_host import (
    EXTRA_PATH,
    read,
)

TOOLS = (
    "nvidia-smi",
    "nvidia-ctk",
    "nvidia-container-cli",
    "nvidia-container-runtime",
    "lspci",
    "systemctl",
    "ctr",
    "docker",
    "timeout",
)
MARKER = "gpustack-smoke-ok"
# The runtime mounts nvidia-smi at the path it has on the host (CDI keeps host paths below the
# driver root): /usr/bin for packaged drivers, /usr/local/nvidia/bin where the driver lives there
# (seen on a real H100 host, tests/fixtures/real-gpu/2026-11-26-*). CUDA images put that directory
# on PATH; an image without it must still find the tool.
CONTAINER_SCRIPT = (
    'echo %s; PATH="$PATH:/usr/local/nvidia/bin:/usr/bin:/bin"; nvidia-smi -L' % MARKER
)
FABRIC_MANAGER = "nvidia-fabricmanager"


class Probe(object):
    """Runs commands through AnsibleModule (no shell), each bounded by `timeout` when present."""

    def __init__(self, module):
        self.module = module
        self.seconds = module.params["timeout"]
        self.tools = dict((name, module.get_bin_path(name, opt_dirs=EXTRA_PATH)) for name in TOOLS)

    def command(self, argv, data=None):
        """{argv, rc, stdout, stderr} of one command; argv[0] is a tool name or a path."""
        binary = self.tools.get(argv[0]) or argv[0]
        full = [binary] + list(argv[1:])
        if self.tools.get("timeout"):
            full = [self.tools["timeout"], str(self.seconds)] + full
        rc, out, err = self.module.run_command(full, data=data, check_rc=False)
        return {"argv": list(argv), "rc": rc, "stdout": out, "stderr": err}

    def has(self, name):
        return bool(self.tools.get(name))


def nvidia_smi(probe):
    return probe.command(["nvidia-smi", "-q", "-x"]) if probe.has("nvidia-smi") else None


def lspci(probe):
    return probe.command(["lspci", "-nn", "-D", "-d", "10de:"]) if probe.has("lspci") else None


def fabric_manager(probe):
    if not probe.has("systemctl"):
        return None
    return probe.command(
        [
            "systemctl",
            "show",
            FABRIC_MANAGER,
            "--property=LoadState,ActiveState,SubState,UnitFileState",
        ]
    )


def toolkit(probe):
    found = {}
    for name, argv in (
        ("nvidia-ctk", ["nvidia-ctk", "--version"]),
        ("nvidia-container-runtime", ["nvidia-container-runtime", "--version"]),
        ("nvidia-container-cli", ["nvidia-container-cli", "--version"]),
        ("nvidia-container-cli info", ["nvidia-container-cli", "info"]),
    ):
        found[name] = probe.command(argv) if probe.has(argv[0]) else None
    return found


def cdi(probe):
    """`nvidia-ctk cdi generate` into a private temporary directory, listed, then removed."""
    if not probe.module.params["cdi"] or not probe.has("nvidia-ctk"):
        return None
    tmpdir = tempfile.mkdtemp(prefix="gpustack-smoke-cdi-")
    try:
        output = os.path.join(tmpdir, "nvidia.yaml")
        generated = probe.command(["nvidia-ctk", "cdi", "generate", "--output=" + output])
        specs = {}
        for name in sorted(os.listdir(tmpdir)):
            specs[name] = read(os.path.join(tmpdir, name)) or ""
        listed = probe.command(["nvidia-ctk", "cdi", "list", "--spec-dir=" + tmpdir])
        return {"dir": tmpdir, "generate": generated, "list": listed, "specs": specs}
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


def _lines(text):
    return [line.strip() for line in (text or "").splitlines() if line.strip()]


def containerd_images(probe):
    """{namespace: [image refs]} from every containerd namespace (refs, not bare digests)."""
    namespaces = probe.command(["ctr", "namespaces", "list", "--quiet"])
    found = {}
    if namespaces["rc"] != 0:
        return found, namespaces
    for namespace in _lines(namespaces["stdout"]):
        listed = probe.command(["ctr", "--namespace", namespace, "images", "list", "--quiet"])
        refs = [ref for ref in _lines(listed["stdout"]) if not ref.startswith("sha256:")]
        if refs:
            found[namespace] = refs
    return found, namespaces


def docker_images(probe):
    listed = probe.command(["docker", "image", "ls", "--format", "{{.Repository}}:{{.Tag}}"])
    refs = [ref for ref in _lines(listed["stdout"]) if "<none>" not in ref]
    return ({"": refs} if refs else {}), listed


def choose_image(wanted, images):
    """(namespace, ref, how): the wanted image if present; else a local CUDA image (it has a
    shell and glibc for the injected nvidia-smi; a random image such as pause may have neither)."""
    pairs = [(ns, ref) for ns in sorted(images) for ref in sorted(images[ns])]
    if wanted:
        for ns, ref in pairs:
            if ref == wanted or ref.endswith("/" + wanted):
                return ns, ref, "given"
        return None, None, "given"
    cuda = [pair for pair in pairs if "cuda" in pair[1].lower()]
    if cuda:
        return cuda[0][0], cuda[0][1], "picked: a local CUDA image"
    return None, None, "none"


def container(probe, kind):
    params = probe.module.params
    wanted = (params["image"] or "").strip()
    result = {"runtime": kind or None, "skipped": None}
    if wanted == "none":
        result["skipped"] = "disabled (image none)"
        return result
    if kind == "containerd":
        if not probe.has("ctr"):
            result["skipped"] = "containerd runs but ctr is not installed"
            return result
        if not os.path.exists(params["nvidia_binary"]):
            result["skipped"] = "no NVIDIA runtime binary at %s" % params["nvidia_binary"]
            return result
        images, listing = containerd_images(probe)
    elif kind == "docker":
        if not probe.has("docker"):
            result["skipped"] = "dockerd runs but the docker CLI is not installed"
            return result
        images, listing = docker_images(probe)
    elif kind:
        result["skipped"] = (
            "no standalone container check for %s (gpustack verify --kubeconfig runs a GPU pod)"
            % kind
        )
        return result
    else:
        result["skipped"] = "no container runtime"
        return result
    result["images"] = images
    if listing["rc"] != 0:
        result["skipped"] = (
            "cannot list images: %s"
            % " ".join((listing["stderr"] or listing["stdout"]).split())[:300]
        )
        return result
    namespace, ref, how = choose_image(wanted, images)
    result["image"], result["namespace"], result["image_choice"] = ref, namespace, how
    if not ref:
        result["skipped"] = (
            "image %s is not present locally (the smoke test never pulls)" % wanted
            if wanted
            else "no local CUDA image (never pulled; pass a local image with a shell: --image REF)"
        )
        return result
    name = "gpustack-smoke-%d" % os.getpid()
    if kind == "containerd":
        argv = ["ctr", "--namespace", namespace, "run", "--rm"]
        if params["snapshotter"]:
            argv += ["--snapshotter", params["snapshotter"]]
        argv += ["--runc-binary", params["nvidia_binary"]]
        argv += ["--env", "NVIDIA_VISIBLE_DEVICES=all"]
        argv += ["--env", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
        argv += list(params["ctr_args"]) + [ref, name, "sh", "-c", CONTAINER_SCRIPT]
    else:
        argv = ["docker", "run", "--rm", "--pull", "never", "--name", name]
        argv += ["--runtime", params["nvidia_name"], "--env", "NVIDIA_VISIBLE_DEVICES=all"]
        argv += ["--env", "NVIDIA_DRIVER_CAPABILITIES=compute,utility"]
        argv += [ref, "sh", "-c", CONTAINER_SCRIPT]
    result["run"] = probe.command(argv)
    result["marker"] = MARKER
    return result


def gather(module):
    probe = Probe(module)
    return {
        "hostname": socket.gethostname(),
        "fqdn": socket.getfqdn(),
        "tools": dict((name, path) for name, path in probe.tools.items() if name != "timeout"),
        "nvidia_smi": nvidia_smi(probe),
        "proc_driver_version": read("/proc/driver/nvidia/version"),
        "lspci": lspci(probe),
        "fabric_manager": fabric_manager(probe),
        "toolkit": toolkit(probe),
        "cdi": cdi(probe),
        "container": container(probe, module.params["runtime_kind"]),
    }


def main():
    module = AnsibleModule(
        argument_spec=dict(
            runtime_kind=dict(type="str", default=""),
            nvidia_binary=dict(type="path", default="/usr/bin/nvidia-container-runtime"),
            nvidia_name=dict(type="str", default="nvidia"),
            image=dict(type="str", default=""),
            snapshotter=dict(type="str", default=""),
            ctr_args=dict(type="list", elements="str", default=[]),
            timeout=dict(type="int", default=120),
            cdi=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    module.exit_json(changed=False, ansible_facts={"gpustack_smoke": gather(module)})


if __name__ == "__main__":
    main()
