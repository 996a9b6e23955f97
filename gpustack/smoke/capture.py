"""Real outputs become test data: what NVIDIA's tools printed on a host, masked, one directory.

`gpustack smoke --capture DIR` writes, per host, `DIR/<date>-<gpu>/` with one file per command
(`COMMANDS.md` names the command and exit code that produced each file) and the host's smoke
report. Hostnames and serial numbers are masked (`Masker`); GPU UUIDs are kept because the
checks compare them across nvidia-smi, CDI and the container. tests/fixtures/real-gpu/README.md
describes the layout; tests/unit/test_smoke_fixtures.py parses every directory committed there.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import date
from pathlib import Path
from typing import Any

from gpustack.smoke.model import HostSmoke

HOST_MASK = "gpu-host"
SERIAL_MASK = "SERIAL-MASKED-{}"
UNMASKED = {"", "localhost", "localhost.localdomain", "ip6-localhost"}
# Too generic to replace blindly (they occur in the tools' own output); reported, not masked.
GENERIC = {"gpu", "gpus", "host", "node", "nvidia", "cuda", "linux", "debian", "ubuntu", "server"}
_SERIAL = re.compile(r"<serial>\s*([^<]*?)\s*</serial>")


def serials_in(text: str) -> list[str]:
    """Serial numbers in nvidia-smi XML, in order, without N/A."""
    found: list[str] = []
    for value in _SERIAL.findall(text or ""):
        if value and value not in ("N/A", "[N/A]") and value not in found:
            found.append(value)
    return found


@dataclass(frozen=True)
class Masker:
    """Replaces each hostname with `gpu-host` and each serial with SERIAL-MASKED-<n>."""

    hostnames: tuple[str, ...] = ()
    serials: tuple[str, ...] = ()
    not_masked: tuple[str, ...] = ()  # names judged too generic to replace (reported)

    @classmethod
    def build(cls, names: list[str | None], serials: list[str]) -> Masker:
        hosts, generic = [], []
        for name in names:
            name = (name or "").strip()
            if name.lower() in UNMASKED or name in hosts or name in generic:
                continue
            (generic if len(name) < 3 or name.lower() in GENERIC else hosts).append(name)
        hosts.sort(key=len, reverse=True)  # the FQDN before the short name it contains
        return cls(tuple(hosts), tuple(serials), tuple(generic))

    def apply(self, text: str) -> str:
        for number, serial in enumerate(self.serials, start=1):
            text = re.sub(
                rf"(?<![A-Za-z0-9]){re.escape(serial)}(?![A-Za-z0-9])",
                SERIAL_MASK.format(number),
                text,
            )
        for name in self.hostnames:
            text = re.sub(
                rf"(?<![A-Za-z0-9-]){re.escape(name)}(?![A-Za-z0-9-])",
                HOST_MASK,
                text,
                flags=re.IGNORECASE,
            )
        return text

    def describe(self) -> str:
        parts = [
            f"{len(self.hostnames)} hostname(s) replaced by `{HOST_MASK}`",
            f"{len(self.serials)} serial number(s) replaced by `{SERIAL_MASK.format('<n>')}`",
        ]
        if self.not_masked:
            parts.append(
                "NOT masked (too generic to replace safely; check the files by hand): "
                + ", ".join(f"`{n}`" for n in self.not_masked)
            )
        return "; ".join(parts)


def masker_for(host: str, facts: dict[str, Any]) -> Masker:
    smoke = facts.get("gpustack_smoke") or {}
    xml = (smoke.get("nvidia_smi") or {}).get("stdout") or ""
    return Masker.build([smoke.get("fqdn"), smoke.get("hostname"), host], serials_in(xml))


def _slug(text: str) -> str:
    text = re.sub(r"^nvidia\s+", "", text.strip(), flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


def directory_name(day: date, report: HostSmoke, facts: dict[str, Any]) -> str:
    """<date>-<gpu>: the first GPU's name (nvidia-smi, else lspci), ×N; no-gpu without one."""
    names = [g.get("name") for g in report.gpus if g.get("name")]
    if not names:
        devices = ((facts.get("gpustack_preflight") or {}).get("gpus") or {}).get("devices") or []
        names = [d.get("model") for d in devices if d.get("model")]
    if not names:
        return f"{day.isoformat()}-no-gpu"
    suffix = f"-x{len(names)}" if len(names) > 1 else ""
    return f"{day.isoformat()}-{_slug(names[0])}{suffix}"


def _command(argv: list[str] | None, tmpdir: str | None) -> str:
    text = " ".join(argv or [])
    return text.replace(tmpdir, "<tmp>") if tmpdir else text


def capture_files(facts: dict[str, Any]) -> list[tuple[str, str, str, Any]]:
    """(file name, command, exit code, content) for every output the smoke probe returned."""
    smoke = facts.get("gpustack_smoke") or {}
    files: list[tuple[str, str, str, Any]] = []

    def add(name: str, result: dict | None) -> None:
        if not result:
            return
        command, rc = " ".join(result.get("argv") or []), str(result.get("rc"))
        files.append((name, command, rc, result.get("stdout") or ""))
        if (result.get("stderr") or "").strip():
            files.append((name.rsplit(".", 1)[0] + ".stderr.txt", command, rc, result["stderr"]))

    smi = smoke.get("nvidia_smi")
    add("nvidia-smi-q-x.xml" if smi and smi.get("rc") == 0 else "nvidia-smi-q-x.txt", smi)
    if smoke.get("proc_driver_version") is not None:
        files.append(
            (
                "proc-driver-nvidia-version.txt",
                "cat /proc/driver/nvidia/version",
                "0",
                smoke["proc_driver_version"],
            )
        )
    add("lspci-nn-D-d-10de.txt", smoke.get("lspci"))
    add("systemctl-show-nvidia-fabricmanager.txt", smoke.get("fabric_manager"))
    toolkit = smoke.get("toolkit") or {}
    add("nvidia-ctk-version.txt", toolkit.get("nvidia-ctk"))
    add("nvidia-container-runtime-version.txt", toolkit.get("nvidia-container-runtime"))
    add("nvidia-container-cli-version.txt", toolkit.get("nvidia-container-cli"))
    add("nvidia-container-cli-info.txt", toolkit.get("nvidia-container-cli info"))
    cdi = smoke.get("cdi")
    if cdi:
        tmpdir = cdi.get("dir")
        generate = cdi.get("generate") or {}
        for spec, text in sorted((cdi.get("specs") or {}).items()):
            command = _command(generate.get("argv"), tmpdir)
            files.append((f"cdi/{spec}", command, str(generate.get("rc")), text))
        for key, name in (("generate", "nvidia-ctk-cdi-generate.log"), ("list", None)):
            result = dict(cdi.get(key) or {})
            if not result:
                continue
            result["argv"] = _command(result.get("argv"), tmpdir).split(" ")
            if name:  # generate's own output: its log on stderr (the spec went to the file)
                text = (result.get("stdout") or "") + (result.get("stderr") or "")
                files.append((name, " ".join(result["argv"]), str(result.get("rc")), text))
            else:
                add("nvidia-ctk-cdi-list.txt", result)
    add("container-run.txt", (smoke.get("container") or {}).get("run"))
    return files


def write_capture(
    root: Path, host: str, facts: dict[str, Any], report: HostSmoke, version: str, day: date
) -> Path:
    """Write one host's masked capture under root/<date>-<gpu>/ (a new directory) and return it."""
    masker = masker_for(host, facts)
    base = directory_name(day, report, facts)
    target, n = root / base, 1
    while target.exists():
        n += 1
        target = root / f"{base}-{n}"
    target.mkdir(parents=True)
    rows = []
    for name, command, rc, content in capture_files(facts):
        path = target / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(masker.apply(str(content)), encoding="utf-8")
        rows.append(f"| `{name}` | `{masker.apply(command)}` | {rc} |")
    doc = {
        "host": host,
        "smoke": report.to_dict(),
        "facts": {k: facts.get(k) for k in ("gpustack_preflight", "gpustack_status")},
    }
    report_text = json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n"
    (target / "smoke-report.json").write_text(masker.apply(report_text), encoding="utf-8")
    rows.append("| `smoke-report.json` | `gpustack smoke` (this host's checks and facts) | - |")
    (target / "COMMANDS.md").write_text(
        f"# {target.name}\n\n"
        f"Captured on {day.isoformat()} by `gpustack smoke --capture` (gpustack {version}).\n"
        f"Masking: {masker.describe()}.\n\n"
        "| file | command | exit code |\n|---|---|---|\n" + "\n".join(rows) + "\n",
        encoding="utf-8",
    )
    return target
