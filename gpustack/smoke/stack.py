"""Checks of the container stack: toolkit, libnvidia-container, CDI, runtime wiring, a container."""

from __future__ import annotations

import re
from typing import Any

from gpustack.smoke import parse
from gpustack.smoke.model import (
    ABSENT,
    FAIL,
    NO_DEVICE,
    PASS,
    SKIPPED,
    WARN,
    Check,
    HostFacts,
    first_line,
    ran,
)
from gpustack.smoke.parse import cdi_list_devices, cdi_spec_devices, cli_info_uuids, version_in


def toolkit(h: HostFacts) -> Check:
    tools = h.smoke.get("toolkit") or {}
    versions = {}
    detail: dict[str, Any] = {"package": (h.status.get("toolkit") or {}).get("installed_version")}
    for name in ("nvidia-ctk", "nvidia-container-runtime", "nvidia-container-cli"):
        result = tools.get(name)
        if result is None:
            continue
        detail[name] = {
            "rc": result.get("rc"),
            "output": first_line(result.get("stdout"), result.get("stderr")),
        }
        if result.get("rc") == 0:
            versions[name] = version_in(result.get("stdout")) or "?"
    if not detail.keys() - {"package"}:
        text = "NVIDIA container toolkit not installed"
        if detail["package"]:
            text += f" (package {detail['package']} without its tools)"
        return Check("toolkit", ABSENT, text, detail)
    present = [
        n for n in ("nvidia-ctk", "nvidia-container-runtime", "nvidia-container-cli") if n in detail
    ]
    broken = [n for n in present if n not in versions]
    summary = ", ".join(f"{n} {v}" for n, v in versions.items()) or "no tool answered --version"
    if detail["package"]:
        summary += f" (package {detail['package']})"
    if broken:
        return Check("toolkit", FAIL, f"{summary}; {', '.join(broken)} --version failed", detail)
    mismatch = _cli_mismatch(versions)
    if mismatch:
        return Check("toolkit", WARN, f"{summary}; {mismatch}", detail)
    return Check("toolkit", PASS, summary, detail)


def _release(version: str | None) -> str | None:
    match = re.match(r"\d+\.\d+\.\d+", version or "")
    return match.group(0) if match else None


def _cli_mismatch(versions: dict[str, str]) -> str | None:
    """NVIDIA ships libnvidia-container at the toolkit's version (its package requires
    `libnvidia-container-tools (= VERSION)`), and the toolkit's hook passes the CLI options of
    that version: a 1.20 hook gives `--cuda-compat-mode`, which a 1.15 CLI refuses, so legacy mode
    and Docker's `--gpus` fail while CDI mode works (seen on a real H100, 2026-11-27)."""
    cli = _release(versions.get("nvidia-container-cli"))
    toolkit = _release(versions.get("nvidia-container-runtime") or versions.get("nvidia-ctk"))
    if not cli or not toolkit or cli == toolkit:
        return None
    return (
        f"nvidia-container-cli {cli} is not at the toolkit's {toolkit} (NVIDIA ships them at one "
        "version; the toolkit's hook passes options an older CLI refuses: legacy mode and "
        "Docker's --gpus fail)"
    )


def container_cli(h: HostFacts) -> Check:
    result = (h.smoke.get("toolkit") or {}).get("nvidia-container-cli info")
    if result is None:
        return Check("container_cli", ABSENT, "nvidia-container-cli is not installed")
    uuids = cli_info_uuids(result.get("stdout"))
    detail = {"rc": result.get("rc"), "uuids": uuids}
    if result.get("rc") != 0:
        return Check("container_cli", h.gpu_dependent(FAIL), ran(result), detail)
    if not h.has_gpu:
        return Check(
            "container_cli", ABSENT, f"{NO_DEVICE}; info listed {len(uuids)} GPU(s)", detail
        )
    expected = h.smi.uuids if h.smi else []
    if not uuids or (expected and sorted(uuids) != sorted(expected)):
        return Check(
            "container_cli",
            FAIL,
            f"libnvidia-container sees {len(uuids)} GPU(s), nvidia-smi {len(expected)}",
            detail,
        )
    return Check("container_cli", PASS, f"libnvidia-container sees {len(uuids)} GPU(s)", detail)


def cdi(h: HostFacts) -> Check:
    cdi = h.smoke.get("cdi")
    if cdi is None:
        if not (h.smoke.get("tools") or {}).get("nvidia-ctk"):
            return Check("cdi", ABSENT, "nvidia-ctk is not installed")
        return Check("cdi", SKIPPED, "disabled (gpu_smoke_cdi=false)")
    generate, listing = cdi.get("generate") or {}, cdi.get("list") or {}
    spec_devices = cdi_spec_devices(cdi.get("specs") or {})
    listed = cdi_list_devices(listing.get("stdout")) if listing.get("rc") == 0 else []
    devices = listed or spec_devices
    detail = {
        "generate_rc": generate.get("rc"),
        "spec_files": sorted(cdi.get("specs") or {}),
        "list_rc": listing.get("rc"),
        "devices": devices,
        "devices_from": "nvidia-ctk cdi list" if listed else "the generated specification",
    }
    if generate.get("rc") != 0:
        return Check(
            "cdi", h.gpu_dependent(FAIL), "nvidia-ctk cdi generate: " + ran(generate), detail
        )
    if not cdi.get("specs"):
        return Check(
            "cdi",
            h.gpu_dependent(FAIL),
            "nvidia-ctk cdi generate exited 0 but wrote no specification",
            detail,
        )
    if not devices:
        return Check(
            "cdi", h.gpu_dependent(FAIL), "the generated specification names no device", detail
        )
    if not h.has_gpu:
        return Check("cdi", ABSENT, f"{NO_DEVICE}; generated {len(devices)} device(s)", detail)
    missing = [
        u for u in (h.smi.uuids if h.smi else []) if not any(d.endswith("=" + u) for d in devices)
    ]
    detail["uuids_without_device"] = missing
    shown = ", ".join(devices[:4]) + (" …" if len(devices) > 4 else "")
    return Check("cdi", PASS, f"{len(devices)} CDI device(s): {shown}", detail)


def runtime_config(h: HostFacts) -> Check:
    runtime = h.status.get("runtime") or {}
    kind = runtime.get("kind")
    detail = dict(runtime)
    if not kind:
        return Check("runtime_config", ABSENT, "no container runtime", detail)
    if runtime.get("wired"):
        note = "" if runtime.get("binary_present") else " (its binary is missing)"
        status = PASS if runtime.get("binary_present") else FAIL
        return Check(
            "runtime_config",
            status,
            f"{kind}: nvidia runtime in {runtime.get('detail')}{note}",
            detail,
        )
    if "failed" in (runtime.get("detail") or ""):
        return Check("runtime_config", FAIL, f"{kind}: {runtime.get('detail')}", detail)
    return Check(
        "runtime_config", ABSENT, f"{kind}: no nvidia runtime in {runtime.get('detail')}", detail
    )


def container(h: HostFacts) -> Check:
    box = h.smoke.get("container") or {}
    detail = {
        k: box.get(k) for k in ("runtime", "image", "image_choice", "namespace") if box.get(k)
    }
    if box.get("skipped") or not box.get("run"):
        return Check("container", SKIPPED, box.get("skipped") or "not run", detail)
    run = box["run"]
    detail["argv"] = run.get("argv")
    detail["rc"] = run.get("rc")
    started = (box.get("marker") or "gpustack-smoke-ok") in (run.get("stdout") or "")
    seen = [d["uuid"] for d in parse.parse_list(run.get("stdout")) if d["kind"] == "GPU"]
    detail["started"], detail["uuids_seen"] = started, seen
    image = box.get("image")
    if not started:
        return Check(
            "container", h.gpu_dependent(FAIL), f"did not start ({image}): {ran(run)}", detail
        )
    if not h.has_gpu:
        return Check(
            "container",
            ABSENT,
            f"started through the nvidia runtime ({image}); {NO_DEVICE} to expose",
            detail,
        )
    expected = h.smi.uuids if h.smi else []
    if not seen or (expected and sorted(seen) != sorted(expected)):
        return Check(
            "container",
            FAIL,
            f"started ({image}) but sees {len(seen)} of {len(expected)} GPU(s)",
            detail,
        )
    return Check(
        "container",
        PASS,
        f"{image}: nvidia-smi -L inside sees {len(seen)} GPU(s), UUIDs match",
        detail,
    )
