"""Turn one host's smoke facts into checks and a verdict (pure; no host, no Ansible).

Input: the facts the smoke play published (`gpustack_preflight`, `gpustack_status`,
`gpustack_smoke`). Each check ends in one status: pass, warn, fail, absent (the thing is not
there: no GPU, tool not installed, nothing configured), skipped (a prerequisite is missing) or
info. Something absent is reported as absent, never as a pass. A host passes only when it has an
NVIDIA device, the driver is loaded at the installed version and nvidia-smi answers, and no check
failed; without a device the verdict is "no NVIDIA device" (exit 3), whatever else is there.
"""

from __future__ import annotations

from typing import Any

from gpustack.driver_version import loaded_is_installed, upstream_version
from gpustack.errors import ExitCode
from gpustack.fleet import doctor
from gpustack.smoke import parse, stack
from gpustack.smoke.model import (
    ABSENT,
    ESSENTIAL,
    FAIL,
    INFO,
    NO_DEVICE,
    PASS,
    SKIPPED,
    WARN,
    Check,
    HostFacts,
    HostSmoke,
    ran,
)
from gpustack.smoke.parse import systemctl_show

__all__ = ["Check", "HostSmoke", "exit_code", "host_smoke"]


def _gpu_pci(h: HostFacts) -> Check:
    devices = (h.pf.get("gpus") or {}).get("devices") or []
    lspci = (h.smoke.get("lspci") or {}).get("stdout", "")
    detail = {"devices": devices, "lspci": [line for line in lspci.splitlines() if line.strip()]}
    if not h.has_gpu:
        return Check("gpu_pci", ABSENT, f"{NO_DEVICE} (PCI vendor 10de, class 0300/0302)", detail)
    return Check("gpu_pci", PASS, doctor.gpu_summary(h.pf), detail)


def _nvswitch(h: HostFacts) -> Check:
    nvswitch = h.pf.get("nvswitch") or {}
    if nvswitch.get("present"):
        return Check("nvswitch", INFO, f"{nvswitch.get('count')} NVSwitch device(s)")
    return Check("nvswitch", INFO, "none")


def _nouveau(h: HostFacts) -> Check:
    if h.pf.get("nouveau_loaded"):
        return Check("nouveau", FAIL if h.has_gpu else WARN, "nouveau is loaded")
    return Check("nouveau", PASS, "not loaded")


def _secure_boot(h: HostFacts) -> Check:
    state = h.pf.get("secure_boot", "unknown")
    if state == "enabled" and h.has_gpu and not h.loaded:
        return Check(
            "secure_boot", WARN, "enabled and the driver is not loaded: unsigned modules refused"
        )
    return Check("secure_boot", INFO, state)


def _kernel_headers(h: HostFacts) -> Check:
    headers = h.pf.get("kernel_headers") or {}
    package = headers.get("package") or "kernel headers"
    if headers.get("installed"):
        return Check("kernel_headers", PASS, f"{package} installed")
    if h.loaded:
        return Check("kernel_headers", INFO, f"{package} not installed (not needed while loaded)")
    return Check("kernel_headers", ABSENT, f"{package} not installed")


def _driver_package(h: HostFacts) -> Check:
    if h.installed:
        return Check("driver_package", PASS, f"{h.package} {h.installed}")
    return Check("driver_package", ABSENT, "no NVIDIA driver package installed")


def _driver_loaded(h: HostFacts) -> Check:
    phrase = doctor.driver_state(h.pf)
    detail = {"proc_driver_nvidia_version": h.smoke.get("proc_driver_version")}
    if h.loaded:
        if h.installed and not loaded_is_installed(h.installed, h.loaded):
            return Check("driver_loaded", FAIL, phrase, detail)
        return Check("driver_loaded", PASS, phrase, detail)  # "(no driver package)" when so
    if not h.has_gpu:
        text = f"driver installed, not loaded: {NO_DEVICE}" if h.installed else NO_DEVICE
        return Check("driver_loaded", ABSENT, text, detail)
    return Check("driver_loaded", FAIL if h.installed else ABSENT, phrase, detail)


def _nvidia_smi(h: HostFacts) -> Check:
    result = h.smoke.get("nvidia_smi")
    if not result:
        return Check("nvidia_smi", ABSENT, "nvidia-smi is not installed")
    detail = {"rc": result.get("rc")}
    if result.get("rc") != 0:
        summary = ran(result) + ("" if h.has_gpu else f" ({NO_DEVICE})")
        return Check("nvidia_smi", h.gpu_dependent(FAIL), summary, detail)
    if h.smi is None:
        return Check("nvidia_smi", FAIL, f"cannot parse nvidia-smi -q -x: {h.smi_error}", detail)
    smi = h.smi
    detail.update(
        driver_version=smi.driver_version,
        cuda_version=smi.cuda_version,
        attached_gpus=smi.attached_gpus,
        dtd=smi.dtd,
    )
    problems = []
    pci = (h.pf.get("gpus") or {}).get("count", 0)
    if smi.attached_gpus is not None and smi.attached_gpus != len(smi.gpus):
        problems.append(f"attached_gpus {smi.attached_gpus} but {len(smi.gpus)} <gpu> entries")
    if not pci and smi.gpus:
        problems.append(f"lists {len(smi.gpus)} GPU(s) but no NVIDIA device is on PCI")
    if pci and len(smi.gpus) < pci:
        problems.append(f"sees {len(smi.gpus)} of the {pci} NVIDIA GPUs on PCI")
    if h.loaded and smi.driver_version and smi.driver_version != h.loaded:
        problems.append(f"reports driver {smi.driver_version}, the kernel module is {h.loaded}")
    cuda = f", CUDA {smi.cuda_version}" if smi.cuda_version else ""
    summary = f"{len(smi.gpus)} GPU(s), driver {smi.driver_version}{cuda}"
    if problems:
        return Check("nvidia_smi", FAIL, summary + ": " + "; ".join(problems), detail)
    return Check("nvidia_smi", PASS, summary, detail)


def _gpu_modes(h: HostFacts) -> list[Check]:
    """Persistence, MIG and ECC modes per GPU, from the parsed XML."""
    if not h.smi or not h.smi.gpus:
        reason = "no nvidia-smi data" if h.has_gpu else NO_DEVICE
        return [Check(name, SKIPPED, reason) for name in ("persistence", "mig", "ecc")]
    gpus = list(enumerate(h.smi.gpus))
    off = [i for i, g in gpus if g.persistence_mode == "Disabled"]
    persistence = (
        Check("persistence", WARN, f"disabled on GPU {_ids(off)} (is nvidia-persistenced running?)")
        if off
        else Check("persistence", PASS, "enabled on every GPU")
        if all(g.persistence_mode == "Enabled" for _, g in gpus)
        else Check("persistence", INFO, _modes(gpus, "persistence_mode"))
    )
    pending = [i for i, g in gpus if g.mig_change_pending]
    if pending:
        mig = Check(
            "mig",
            WARN,
            f"MIG mode change pending on GPU {_ids(pending)} (applies after a GPU reset or reboot)",
        )
    elif any(g.mig_enabled for _, g in gpus):
        parts = [f"GPU {i}: {len(g.mig_devices)} MIG device(s)" for i, g in gpus if g.mig_enabled]
        mig = Check("mig", INFO, "enabled - " + ", ".join(parts))
    else:
        mig = Check("mig", INFO, _modes(gpus, "mig_current"))
    ecc_pending = [i for i, g in gpus if g.ecc_change_pending]
    ecc = (
        Check(
            "ecc", WARN, f"ECC mode change pending on GPU {_ids(ecc_pending)} (reboot applies it)"
        )
        if ecc_pending
        else Check("ecc", INFO, _modes(gpus, "ecc_current"))
    )
    return [persistence, mig, ecc]


def _ids(indexes: list[int]) -> str:
    return ", ".join(str(i) for i in indexes)


def _modes(gpus: list[tuple[int, parse.Gpu]], attr: str) -> str:
    values: dict[str, list[int]] = {}
    for i, gpu in gpus:
        values.setdefault(getattr(gpu, attr) or "not reported", []).append(i)
    if len(values) == 1:
        return next(iter(values)).lower() if next(iter(values)) != "N/A" else "N/A (not supported)"
    return "; ".join(f"{v} on GPU {_ids(ids)}" for v, ids in values.items())


def _fabric_manager(h: HostFacts) -> Check:
    if not (h.pf.get("nvswitch") or {}).get("present"):
        return Check("fabric_manager", SKIPPED, "no NVSwitch")
    result = h.smoke.get("fabric_manager")
    if not result:
        return Check("fabric_manager", ABSENT, "systemctl not found: cannot read the unit")
    unit = systemctl_show(result.get("stdout"))
    detail = {"unit": unit}
    packages = (h.status.get("driver") or {}).get("packages") or {}
    fm = {
        k: v
        for k, v in packages.items()
        if k.startswith(("nvidia-fabricmanager", "nvidia-fabric-manager"))
    }
    detail["packages"] = fm
    if unit.get("LoadState") != "loaded":
        return Check(
            "fabric_manager",
            FAIL,
            "NVSwitch present but nvidia-fabricmanager is not installed",
            detail,
        )
    if unit.get("ActiveState") != "active":
        state = f"{unit.get('ActiveState')}/{unit.get('SubState')}"
        return Check("fabric_manager", FAIL, f"nvidia-fabricmanager is {state}", detail)
    versions = sorted({upstream_version(v) for v in fm.values()})
    if h.loaded and versions and versions != [h.loaded]:
        return Check(
            "fabric_manager",
            FAIL,
            f"Fabric Manager {', '.join(versions)} but driver {h.loaded}",
            detail,
        )
    at = f" {versions[0]}" if versions else ""
    return Check("fabric_manager", PASS, f"nvidia-fabricmanager{at} active", detail)


def host_smoke(host: str, facts: dict[str, Any]) -> HostSmoke:
    """Checks and verdict for one host that ran the smoke play."""
    h = HostFacts(facts)
    if not h.pf or not h.smoke:
        return HostSmoke(host, "not run", "no smoke facts (the host failed or was unreachable)")
    checks = [_gpu_pci(h), _nvswitch(h), _nouveau(h), _secure_boot(h), _kernel_headers(h)]
    checks += [_driver_package(h), _driver_loaded(h), _nvidia_smi(h), *_gpu_modes(h)]
    checks += [_fabric_manager(h), stack.toolkit(h), stack.container_cli(h), stack.cdi(h)]
    checks += [stack.runtime_config(h), stack.container(h)]
    gpus = [dict(index=i, **g.to_dict()) for i, g in enumerate(h.smi.gpus)] if h.smi else []
    failed = [c.name for c in checks if c.status == FAIL]
    absent = [c.name for c in checks if c.status == ABSENT]
    warned = [c.name for c in checks if c.status == WARN]
    if not h.has_gpu:
        verdict = NO_DEVICE
        summary = (
            f"driver installed, not loaded: {NO_DEVICE} (package {h.installed})"
            if h.installed
            else f"{NO_DEVICE}; no NVIDIA driver installed"
        )
    elif failed or any(c.status != PASS for c in checks if c.name in ESSENTIAL):
        verdict = FAIL
        essential = [c.name for c in checks if c.name in ESSENTIAL and c.status != PASS]
        summary = "failed: " + ", ".join(dict.fromkeys(failed + essential))
    else:
        verdict = PASS
        summary = f"{len(gpus)} GPU(s) passed"
    if verdict != NO_DEVICE and absent:
        summary += "; absent: " + ", ".join(absent)
    if warned:
        summary += "; warnings: " + ", ".join(warned)
    return HostSmoke(host, verdict, summary, checks, gpus)


def exit_code(run_code: int, hosts: list[HostSmoke]) -> int:
    """The run's own code first (failed 1, unreachable 4, canceled 130), then the verdicts."""
    if run_code != ExitCode.OK:
        return int(run_code)
    if not hosts or any(not h.passed for h in hosts):
        return int(ExitCode.VERIFY_FAILED)
    return int(ExitCode.OK)
