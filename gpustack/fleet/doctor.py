"""Turn preflight facts into a fleet view and a list of problems with hints (pure)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpustack.ansible.input_specs import is_true
from gpustack.driver_version import loaded_is_installed

SUPPORTED_FAMILIES = ("Debian", "RedHat")


@dataclass(frozen=True)
class Problem:
    host: str
    severity: str  # error | warning | info
    message: str
    hint: str


def gpu_absence_expected(pf: dict[str, Any], require_gpu: bool) -> bool:
    """No NVIDIA device on the host and none required: doctor calls it expected (lab or CPU
    nodes), and status lists what is not installed there as notes, not drift."""
    return not int((pf.get("gpus") or {}).get("count") or 0) and not require_gpu


def preflight(facts: dict[str, Any]) -> dict[str, Any]:
    return facts.get("gpustack_preflight") or {}


def gpu_summary(pf: dict[str, Any]) -> str:
    devices = (pf.get("gpus") or {}).get("devices") or []
    if not devices:
        return "0"
    models: dict[str, int] = {}
    for dev in devices:
        models[dev.get("model") or "NVIDIA GPU"] = (
            models.get(dev.get("model") or "NVIDIA GPU", 0) + 1
        )
    return ", ".join(f"{count}× {model}" for model, count in models.items())


def driver_state(pf: dict[str, Any]) -> str:
    """One phrase for the driver, never hiding a missing GPU."""
    driver = pf.get("driver") or {}
    installed = (driver.get("installed") or {}).get("version")
    loaded = driver.get("loaded_version")
    gpus = (pf.get("gpus") or {}).get("count", 0)
    if loaded:
        if installed and not loaded_is_installed(installed, loaded):
            return f"installed {installed}, loaded {loaded}: reboot required"
        return f"loaded {loaded}" if installed else f"loaded {loaded} (no driver package)"
    if installed:
        if not gpus:
            return f"installed {installed}, not loaded: no NVIDIA device"
        return f"installed {installed}, not loaded"
    return "not installed"


def runtime_summary(pf: dict[str, Any]) -> str:
    kind = pf.get("runtime")
    if not kind:
        return "none"
    entry = next((r for r in pf.get("runtimes") or [] if r.get("kind") == kind), {})
    text = f"{kind} {entry.get('version') or '?'}"
    if entry.get("config_version"):
        text += f" (config v{entry['config_version']})"
    elif kind in ("containerd", "k3s", "rke2") and not entry.get("config_exists"):
        text += " (no config file)"
    return text


def cri_dockerd_refusal(pf: dict[str, Any], runtime_class: str = "nvidia") -> Problem | None:
    """A node whose kubelet reaches Docker through cri-dockerd and pods need a RuntimeClass:
    an error when that cri-dockerd cannot run one (before 0.4.0, Mirantis/cri-dockerd#350),
    a warning when its version is unknown; None otherwise. docs/runtime.md, "Docker nodes"."""
    shim = pf.get("cri_dockerd") or {}
    if not shim.get("serves_kubelet") or not runtime_class or shim.get("runtime_handlers"):
        return None
    hint = (
        "upgrade cri-dockerd to 0.4.0 or later; or move the node to containerd; or make nvidia "
        "Docker's default runtime (container_runtime_nvidia_default=true) and set "
        'gpustack_k8s_runtime_class="" (docs/runtime.md, Docker nodes)'
    )
    if shim.get("runtime_handlers") is None:
        return Problem(
            "",
            "warning",
            "the kubelet runs pods in Docker through cri-dockerd of unknown version: "
            f"RuntimeClass handler {runtime_class!r} works only with cri-dockerd 0.4.0 or later",
            "check `cri-dockerd --version`; " + hint,
        )
    return Problem(
        "",
        "error",
        f"the kubelet runs pods in Docker through cri-dockerd {shim.get('version')}, which "
        f"refuses RuntimeClass handler {runtime_class!r} (handlers other than Docker's default "
        "need cri-dockerd 0.4.0 or later), so no GPU pod would start",
        hint,
    )


def containerd_v1_ignored(entry: dict[str, Any]) -> Problem | None:
    """A warning where containerd 2.0-2.2 runs a version-1 config.toml: those releases ignore
    its whole CRI table (their CRI plugins' migration never runs for a version-1 file; fixed in
    containerd 2.3.0, containerd PR 12608). docs/runtime.md, "Version-1 files"."""
    if entry.get("kind") != "containerd" or entry.get("config_version") != 1:
        return None
    parts = str(entry.get("version") or "").split(".")
    if len(parts) < 2 or not (parts[0] == "2" and parts[1].isdigit() and int(parts[1]) < 3):
        return None
    return Problem(
        "",
        "warning",
        f"containerd {entry['version']} ignores the CRI settings of a version-1 config.toml (no "
        "`version` key): its sandbox_image, registry and runtimes have no effect (containerd "
        "fixed this in 2.3.0); gpustack's nvidia runtime is not affected (its drop-in is "
        "version 3)",
        "rewrite the file as version 3 (`version = 3`, plugins io.containerd.cri.v1.runtime and "
        "io.containerd.cri.v1.images); this containerd's `config migrate` reads the file the same "
        "way and drops those settings too",
    )


def cdi_needed(inputs: dict[str, Any]) -> str:
    """The setting that makes install turn CDI on in containerd ("" when none), as
    roles/container_runtime/vars/main.yml decides (__container_runtime_cdi)."""
    value = str(inputs.get("container_runtime_enable_cdi", "auto")).lower()
    if value == "auto":
        dra = inputs.get("gpustack_k8s_gpu_allocation") == "dra"
        return "gpustack_k8s_gpu_allocation=dra" if dra else ""
    return "container_runtime_enable_cdi=true" if is_true(value) else ""


def containerd_without_cdi(pf: dict[str, Any], needed: str) -> Problem | None:
    """An error where install would turn CDI on (`needed`, cdi_needed's answer) in a containerd
    older than 1.7, which has none: install refuses the host (roles/container_runtime/tasks/
    cdi_check.yml; docs/runtime.md, "CDI (NVIDIA's DRA driver)")."""
    if not needed or pf.get("runtime") != "containerd":
        return None
    entry = next((r for r in pf.get("runtimes") or [] if r.get("kind") == "containerd"), {})
    match = re.match(r"(\d+)\.(\d+)", str(entry.get("version") or ""))
    if not match or (int(match.group(1)), int(match.group(2))) >= (1, 7):
        return None
    return Problem(
        "",
        "error",
        f"containerd {entry['version']} has no CDI support, which {needed} needs (NVIDIA's DRA "
        "driver hands GPUs to containerd as CDI devices; containerd has CDI from 1.7): install "
        "refuses this host",
        "upgrade containerd to 1.7 or newer; or use gpustack_k8s_gpu_allocation=device-plugin "
        "(docs/runtime.md, CDI)",
    )


def find_problems(
    host: str,
    facts: dict[str, Any],
    require_gpu: bool = False,
    runtime_class: str = "nvidia",
    cdi: str = "",
) -> list[Problem]:
    """Problems with hints for one host. `runtime_class` is gpustack_k8s_runtime_class
    ("" when pods use the node's default runtime); `cdi` the setting that needs CDI in
    containerd (cdi_needed; "" when none)."""
    pf = preflight(facts)
    if not pf:
        return [
            Problem(
                host,
                "error",
                "no preflight facts were gathered",
                "see the run's failure above; `-v` shows more",
            )
        ]
    out: list[Problem] = []

    def add(severity: str, message: str, hint: str) -> None:
        out.append(Problem(host, severity, message, hint))

    osinfo = pf.get("os") or {}
    if osinfo.get("family") not in SUPPORTED_FAMILIES:
        add(
            "warning",
            f"unsupported OS {osinfo.get('pretty_name', '?')}",
            "gpustack supports Debian, Ubuntu and RHEL-family hosts",
        )
    gpus = (pf.get("gpus") or {}).get("count", 0)
    installed = ((pf.get("driver") or {}).get("installed") or {}).get("version")
    if not gpus:
        message = (
            f"driver installed, not loaded: no NVIDIA device (package {installed})"
            if installed
            else "no NVIDIA device (PCI vendor 10de) on this host"
        )
        add(
            "error" if require_gpu else "warning",
            message,
            "expected on lab or CPU nodes; set gpustack_require_gpu=true to make it fatal"
            if not require_gpu
            else "check that the GPU is passed through to this machine",
        )
    if pf.get("nouveau_loaded"):
        add(
            "warning",
            "the nouveau driver is loaded",
            "gpustack install blacklists nouveau and rebuilds the initramfs; reboot afterwards",
        )
    if pf.get("secure_boot") == "enabled":
        add(
            "warning",
            "Secure Boot is enabled: unsigned NVIDIA modules will not load",
            "use signed precompiled modules (Ubuntu linux-modules-nvidia-*) or enroll a MOK key",
        )
    headers = pf.get("kernel_headers") or {}
    if not headers.get("installed"):
        if headers.get("available"):
            add(
                "info",
                f"kernel headers {headers.get('package')} are not installed",
                "gpustack install installs them for DKMS",
            )
        elif headers.get("available") is None:
            add(
                "info",
                f"kernel headers {headers.get('package')} are not installed; "
                "whether the package sources have them is unknown (no apt lists yet)",
                "gpustack install refreshes the lists and installs them when they exist",
            )
        else:
            add(
                "warning",
                f"no kernel headers for the running kernel {pf.get('kernel')} "
                f"({headers.get('package')} is not installed and not in the package sources)",
                "DKMS builds no NVIDIA module without them: boot a distribution kernel or "
                "provide the headers package",
            )
    driver_phrase = driver_state(pf)
    if "reboot required" in driver_phrase:
        add(
            "warning",
            f"driver {driver_phrase}",
            "reboot, or unload the nvidia modules when no GPU process runs",
        )
    if (pf.get("nvswitch") or {}).get("present"):
        add(
            "info",
            "NVSwitch present: nvidia-fabricmanager is needed at the driver's version",
            "gpustack install adds it",
        )
    runtime = pf.get("runtime")
    if not runtime:
        add(
            "info",
            "no container runtime found",
            "install containerd, Docker or CRI-O; gpustack wires the runtime it finds",
        )
    else:
        entry = next((r for r in pf.get("runtimes") or [] if r.get("kind") == runtime), {})
        if entry.get("active") is False:
            add(
                "warning",
                f"{runtime} is installed but not running",
                f"start it: systemctl enable --now {entry.get('service') or runtime}",
            )
        # k3s/RKE2: a containerd template install refuses (docs/runtime.md, "k3s and RKE2")
        check = entry.get("template_check") or {}
        if check.get("error"):
            add("error", f"{check.get('template')}: {check['error']}", check.get("hint", ""))
        ignored = containerd_v1_ignored(entry)
        if ignored:
            add(ignored.severity, ignored.message, ignored.hint)
    if runtime and runtime != "none" and pf.get("systemd") is False:
        add(
            "error",
            f"the host does not run systemd, and install restarts {runtime} through systemd "
            "after wiring the nvidia runtime: install refuses it",
            f"boot the host with systemd; or wire {runtime} yourself (docs/runtime.md) and run "
            "install with --skip-tags container_runtime",
        )
    for refusal in (cri_dockerd_refusal(pf, runtime_class), containerd_without_cdi(pf, cdi)):
        if refusal:
            add(refusal.severity, refusal.message, refusal.hint)
    if (pf.get("kubelet") or {}).get("present") and not runtime:
        add(
            "warning",
            "kubelet present but no container runtime",
            "the kubelet needs a CRI runtime (containerd or CRI-O)",
        )
    return out


def run_problems(hosts: dict[str, Any]) -> list[Problem]:
    """A host doctor could not read is a problem, never "no problems" (HostResult-like values)."""
    found = []
    for name, host in hosts.items():
        if getattr(host, "unreachable", False):
            found.append(
                Problem(
                    name,
                    "error",
                    f"unreachable: {' '.join(str(host.unreachable_message).split())[:300]}",
                    "check the address, SSH user and key in the inventory "
                    f"(`ssh` to it by hand); nothing was read from {name}",
                )
            )
        elif getattr(host, "failed", 0):
            last = host.failures[-1] if host.failures else None
            found.append(
                Problem(
                    name,
                    "error",
                    "preflight failed: "
                    + (f"{last.task}: {last.message}" if last else "see the artifacts"),
                    "see the run's artifacts (printed below) for the full error",
                )
            )
    return found
