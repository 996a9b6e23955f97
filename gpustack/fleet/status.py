"""`gpustack status`: what each node runs, what install would make of it, and the drift (pure).

Input is plain data: the facts of the read-only status play (`gpustack_preflight`,
`gpustack_status`, `gpustack_converged_desired`), optionally the Kubernetes view of the node and the
upgrade state; output is one row per node with a list naming every desired/actual difference.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from gpustack import paths
from gpustack.ansible.input_specs import is_true
from gpustack.driver_version import (
    branch_of,
    loaded_is_installed,
    on_branch,
    same_version,
)
from gpustack.errors import BadInput
from gpustack.fleet import converged, doctor

UNSET = ""


@cache
def role_defaults() -> dict[str, Any]:
    """Every role's defaults/main.yml, merged: what install uses when nobody set an input."""
    merged: dict[str, Any] = {}
    for path in sorted(paths.roles_dir().glob("*/defaults/main.yml")):
        merged.update(paths.load_yaml(path) or {})
    return merged


@dataclass
class DriverDesired:
    """What install would put on the host for the driver."""

    version: str = ""
    branch: str = ""
    pinned: str = ""

    def describe(self) -> str:
        if self.version:
            return self.version
        if self.pinned and (not self.branch or on_branch(self.pinned, self.branch)):
            return f"{self.pinned} (pinned)"
        return f"newest of {self.branch}" if self.branch else "newest available"


def desired_driver(inputs: dict[str, Any], pinned: str | None) -> DriverDesired:
    version = str(inputs.get("nvidia_driver_version") or "").strip()
    branch = str(inputs.get("nvidia_driver_branch") or "").strip()
    if not branch and version:
        branch = branch_of(version)
    if not branch and inputs.get("nvidia_driver_source") != "distro":
        branch = str(inputs.get("nvidia_driver_default_branch") or "").strip()
    return DriverDesired(version=version, branch=branch, pinned=pinned or "")


@dataclass
class NodeStatus:
    """One row of `gpustack status`."""

    host: str
    reachable: bool = True
    os: str = ""
    kernel: str = ""
    gpus: str = ""
    gpu_count: int = 0
    driver: dict[str, Any] = field(default_factory=dict)
    toolkit: dict[str, Any] = field(default_factory=dict)
    runtime: dict[str, Any] = field(default_factory=dict)
    reboot_required: bool = False
    mig: dict[str, Any] | None = None  # the MIG layout (nvidia_mig's check mode), when one is set
    kubernetes: dict[str, Any] | None = None
    upgrade_state: str | None = None
    drift: list[str] = field(default_factory=list)
    # What is not installed on a host without a GPU where none is required (doctor: expected):
    # install would add it, but nothing there needs it, so it is not drift.
    notes: list[str] = field(default_factory=list)
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def node_status(
    host: str,
    facts: dict[str, Any],
    kubernetes: dict[str, Any] | None = None,
    upgrade_state: str | None = None,
    k8s_expected: bool = False,
) -> NodeStatus:
    """Fold one host's facts (and its Kubernetes view) into a row with its drift."""
    pf = doctor.preflight(facts)
    st = facts.get("gpustack_status") or {}
    row = NodeStatus(host=host, kubernetes=kubernetes, upgrade_state=upgrade_state)
    if not pf or not st:
        row.reachable = False
        row.error = "no status facts (unreachable or failed)"
        return row
    resolved = facts.get("gpustack_converged_desired") or {}  # roles/gpu_converged
    inputs = {**role_defaults(), **{k: v for k, v in resolved.items() if v != converged.UNSET}}
    osinfo = pf.get("os") or {}
    row.os = f"{osinfo.get('id', '?')} {osinfo.get('version_id') or osinfo.get('codename', '')}"
    row.kernel = pf.get("kernel", "")
    row.gpus = doctor.gpu_summary(pf)
    row.gpu_count = int((pf.get("gpus") or {}).get("count") or 0)
    drift = row.drift
    # Components absent from the host: drift, except on a host without a GPU where none is
    # required (gpustack_require_gpu false), which doctor calls expected.
    absent: list[str] = []
    cpu_only = doctor.gpu_absence_expected(pf, is_true(inputs.get("gpustack_require_gpu")))

    # Driver
    installed_pkg = ((pf.get("driver") or {}).get("installed") or {}).get("package")
    installed = ((pf.get("driver") or {}).get("installed") or {}).get("version")
    loaded = (pf.get("driver") or {}).get("loaded_version")
    st_driver = st.get("driver") or {}
    want = desired_driver(inputs, st_driver.get("pinned_version"))
    held = installed_pkg in (st_driver.get("held") or []) if installed_pkg else False
    row.driver = {
        "installed": installed,
        "package": installed_pkg,
        "loaded": loaded,
        "desired": want.describe(),
        "held": held,
        "pinned": want.pinned or None,
        "state": doctor.driver_state(pf),  # never hides a missing GPU
    }
    if not installed and loaded:
        # A .run install or a machine image's driver: install stops there unless it is kept.
        if inputs.get("nvidia_driver_preinstalled") != "keep":
            drift.append(
                f"driver {loaded} loaded without a driver package (preinstalled, or removed and "
                "not yet unloaded): install stops before any change; "
                "nvidia_driver_preinstalled=keep leaves it alone"
            )
    elif not installed:
        absent.append(f"driver not installed (desired {want.describe()})")
        drift.append(absent[-1])
    else:
        if want.version and not same_version(installed, want.version):
            drift.append(f"driver installed {installed}, desired {want.version}")
        elif want.branch and not on_branch(installed, want.branch):
            drift.append(f"driver installed {installed}, desired branch {want.branch}")
        elif not want.version and want.pinned and not same_version(installed, want.pinned):
            drift.append(f"driver installed {installed}, pinned {want.pinned}")
        if not held:
            drift.append(f"driver package {installed_pkg} not held")
        row.driver["companions"] = companions(installed, st_driver)
        for name, entry in row.driver["companions"].items():
            if not entry["ok"]:
                drift.append(f"companion {name} {entry['installed']}: {entry['problem']}")
        unit = st_driver.get("persistenced") or {}
        wanted = is_true(inputs.get("nvidia_driver_persistenced"))
        # Without systemd the role leaves the unit to the host's init (roles/nvidia_driver
        # configure.yml): no drift that install would never repair.
        systemd = pf.get("systemd") is not False
        if unit.get("enabled") not in (None, "enabled") and wanted and systemd:
            left = " (left by a run stopped in the driver's apt transaction)"
            drift.append(
                f"nvidia-persistenced {unit['enabled'] or 'unknown'}: install enables it"
                + (left if unit["enabled"] == "masked-runtime" else "")
            )
        if st_driver.get("initramfs_pending"):
            drift.append(
                "initramfs not regenerated since the nouveau blacklist changed (the last run's "
                "update-initramfs failed or was stopped): install regenerates it"
            )
        if row.gpu_count and not loaded:
            drift.append(f"driver {installed} not loaded")
        elif loaded and not loaded_is_installed(installed, loaded):
            drift.append(f"driver loaded {loaded}, installed {installed}: reboot required")
            row.reboot_required = True

    # Container toolkit
    st_tk = st.get("toolkit") or {}
    tk_installed = st_tk.get("installed_version")
    tk_version = str(inputs.get("nvidia_container_toolkit_version") or "").strip()
    tk_pinned = st_tk.get("pinned_version") or ""
    row.toolkit = {
        "installed": tk_installed,
        "desired": tk_version or (f"{tk_pinned} (pinned)" if tk_pinned else "newest available"),
        "held": "nvidia-container-toolkit" in (st_tk.get("held") or []),
    }
    if not tk_installed:
        absent.append("toolkit not installed")
        drift.append(absent[-1])
    else:
        if tk_version and not same_version(tk_installed, tk_version):
            drift.append(f"toolkit installed {tk_installed}, desired {tk_version}")
        elif not tk_version and tk_pinned and not same_version(tk_installed, tk_pinned):
            drift.append(f"toolkit installed {tk_installed}, pinned {tk_pinned}")
        if not row.toolkit["held"]:
            drift.append("toolkit packages not held")

    # Runtime wiring
    rt = st.get("runtime") or {}
    kind = rt.get("kind")
    name = inputs.get("container_runtime_nvidia_name") or "nvidia"
    row.runtime = {"kind": kind, "wired": rt.get("wired"), "detail": rt.get("detail", "")}
    if kind and kind != "none":
        if not rt.get("wired"):
            unwired = f"{kind}: runtime {name!r} not in the effective configuration"
            drift.append(unwired)
            if not tk_installed:
                absent.append(unwired)
        if tk_installed and not rt.get("binary_present"):
            binary = inputs.get("container_runtime_nvidia_binary") or ""
            drift.append(f"runtime binary {binary} missing")

    needs_cdi = doctor.cdi_needed(inputs)
    if kind == "containerd" and rt.get("wired") and rt.get("cdi") is False and needs_cdi:
        drift.append(f"containerd: CDI off (enable_cdi = false), which {needs_cdi} needs")

    loaded = facts.get("gpustack_runtime_loaded") or {}
    if kind == "containerd" and loaded:
        row.runtime["restart_needed"] = bool(
            loaded.get("restart_pending") or loaded.get("differences")
        )
        row.runtime["loaded"] = loaded
        if loaded.get("restart_pending"):
            drift.append("containerd: restart pending (gpustack wrote its files, no restart since)")
        for difference in loaded.get("differences") or []:
            drift.append(f"containerd runs another configuration than its files: {difference}")

    if kind == "docker" and loaded.get("available") and rt.get("wired"):
        # daemon.json holds the runtime; the running dockerd must have loaded it (a reload lost)
        row.runtime["restart_needed"] = not loaded.get("runtime_loaded")
        row.runtime["loaded"] = loaded
        if not loaded.get("runtime_loaded"):
            drift.append(
                f"docker: runtime {name!r} in daemon.json, not loaded by the running daemon"
            )

    if st.get("reboot_required_file"):
        row.reboot_required = True

    row.mig = mig_status(facts.get("gpustack_mig"))
    if row.mig and row.mig["drift"]:
        drift.append(f"MIG layout {row.mig['config']}: {row.mig['drift']}")

    if cpu_only and absent:
        row.notes.append(
            "no NVIDIA GPU and gpustack_require_gpu is false (expected on lab or CPU nodes): "
            + "; ".join(absent)
        )
        drift[:] = [d for d in drift if d not in absent]

    # Kubernetes side (only with a kubeconfig)
    if k8s_expected:
        drift.extend(kubernetes_drift(row.gpu_count, kubernetes))
    return row


def mig_status(fact: dict[str, Any] | None) -> dict[str, Any] | None:
    """The MIG row of a host from the nvidia_mig role's check-mode `gpustack_mig` (None: no
    layout set). `layout` is per GPU what it holds now; `drift` what the layout wants changed
    (the role's own words), '' when it matches."""
    if not fact:
        return None
    layout = []
    for gpu in fact.get("gpus") or []:
        applied = gpu.get("applied")
        if gpu.get("mode_current") != "Enabled":
            layout.append(f"GPU {gpu.get('index')}: MIG {gpu.get('mode_current') or '?'}")
        else:
            held = ", ".join(f"{n} x {p}" for p, n in sorted((applied or {}).items())) or "none"
            layout.append(f"GPU {gpu.get('index')}: {held}")
    state, reason = fact.get("state"), str(fact.get("reason") or "")
    drift = ""
    if state != "success":
        drift = reason.removeprefix("would change: ") or str(state)
    return {"config": fact.get("config"), "state": state, "layout": layout, "drift": drift}


# Packages of the driver's release that come from other source packages (Debian, Ubuntu,
# NVIDIA's repositories); install pins and holds those installed (roles/nvidia_driver vars).
COMPANIONS = ("nvidia-persistenced", "nvidia-modprobe", "nvidia-settings", "nvidia-xconfig")


def companions(driver_installed: str, st_driver: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per installed companion package: its version, its pin, and whether it matches the driver
    (pinned by gpustack to the version released with the driver, held, on the driver's branch)."""
    packages = st_driver.get("packages") or {}
    pinned = st_driver.get("pins") or {}
    held = set(st_driver.get("held") or [])
    branch = branch_of(driver_installed)
    found: dict[str, dict[str, Any]] = {}
    for name in COMPANIONS:
        version = packages.get(name)
        if not version:
            continue
        pin = pinned.get(name)
        problem = ""
        if branch_of(version) != branch:
            problem = f"not of the driver's branch {branch}"
        elif not pin:
            problem = f"not pinned with driver {driver_installed}"
        elif not same_version(pin, version):
            problem = f"pinned {pin} (released with the driver)"
        elif name not in held:
            problem = "not held"
        found[name] = {"installed": version, "pinned": pin, "ok": not problem, "problem": problem}
    return found


# gpustack_k8s_gpu_allocation -> its device plugin, in drift lines
_PLUGIN_WORDS = {"hami": "HAMi device plugin", "volcano": "Volcano vGPU device plugin"}


def kubernetes_drift(gpu_count: int, k8s: dict[str, Any] | None) -> list[str]:
    if k8s is None or not k8s.get("node"):
        return [(k8s or {}).get("error") or "no Kubernetes node for this host"]
    out = []
    if gpu_count and k8s.get("allocator") == "dra":  # gpustack_k8s_gpu_allocation=dra
        if not k8s.get("allocatable_gpus"):
            out.append("no GPU in the node's ResourceSlices (DRA driver gpu.nvidia.com)")
        if k8s.get("device_plugin_ready") is not True:
            out.append("DRA kubelet plugin pod not ready on the Kubernetes node")
    elif gpu_count:
        allocator = k8s.get("allocator")  # gpustack_k8s_gpu_allocation=hami or volcano
        resource = "volcano.sh/vgpu-number" if allocator == "volcano" else "nvidia.com/gpu"
        if not k8s.get("allocatable_gpus"):
            out.append(f"{resource} not allocatable on the Kubernetes node")
        if k8s.get("device_plugin_ready") is not True:
            plugin = _PLUGIN_WORDS.get(allocator, "device plugin")
            out.append(f"{plugin} pod not ready on the Kubernetes node")
    reasons: dict[str, list[str]] = {}
    for component, why in sorted((k8s.get("paused_clients") or {}).items()):
        reasons.setdefault(why, []).append(component)
    for why, components in sorted(reasons.items()):  # a run in progress, or one interrupted
        out.append(f"GPU clients paused for {why}: {', '.join(components)}")
    return out


def status_rows(
    hosts: dict[str, Any],
    kubernetes: dict[str, dict[str, Any]] | None = None,
    upgrade_states: dict[str, str] | None = None,
    upgrade_target: Any = None,
) -> list[NodeStatus]:
    """Rows for every host of a run (`hosts`: name -> HostResult-like with `.facts`)."""
    rows = []
    for name, host in hosts.items():
        k8s = (kubernetes or {}).get(name) if kubernetes is not None else None
        state = (upgrade_states or {}).get(name)
        if k8s and k8s.get("upgrade_state"):
            state = k8s["upgrade_state"]
        row = node_status(name, host.facts, k8s, state, k8s_expected=kubernetes is not None)
        installed = row.driver.get("installed")
        moved = upgrade_target is not None and installed and not upgrade_target.matches(installed)
        if state == "upgrade-done" and moved:  # e.g. another run changed it since
            row.drift.append(
                f"upgrade to {upgrade_target.describe()} recorded done, "
                f"driver installed {installed}"
            )
        if getattr(host, "unreachable", False):
            row.reachable = False
            row.error = host.unreachable_message or "unreachable"
        rows.append(row)
    return rows


def upgrade_target(inventory: Path):
    """The target (gpustack.upgrade.state.Target) of this inventory's recorded host-only upgrade."""
    from gpustack.upgrade.state import FileStateStore, state_path_for

    try:
        run = FileStateStore(state_path_for(inventory)).load()
    except BadInput:
        return None
    return run.target if run else None


def upgrade_states(inventory: Path) -> dict[str, str]:
    """Per-node state of a host-only rolling upgrade of this inventory, when one was recorded."""
    from gpustack.upgrade.state import FileStateStore, state_path_for

    try:
        run = FileStateStore(state_path_for(inventory)).load()
    except BadInput:  # an unreadable state file is `upgrade`'s to report, not status's
        return {}
    return {name: str(node.state) for name, node in run.nodes.items()} if run else {}
