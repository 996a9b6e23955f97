"""Parse what NVIDIA's tools print (pure): `nvidia-smi -q -x` (XML, nvsmi_device_v*.dtd),
`nvidia-smi -L`, `nvidia-container-cli info`, CDI specifications and `nvidia-ctk cdi list`.

Field names follow NVIDIA's device DTD as nvidia-smi prints it (`nvidia-smi --dtd`); fields that
older DTDs lack (cuda_version before v10, mig_mode before v11) come back as None, never as a
guessed value. Values are kept as nvidia-smi prints them ("Enabled", "Disabled", "N/A").
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import asdict, dataclass, field
from typing import Any

import yaml

NOT_AVAILABLE = ("N/A", "[N/A]", "Not Supported", "[Not Supported]", "Unknown Error")


class NvsmiParseError(ValueError):
    """The text is not `nvidia-smi -q -x` output."""


@dataclass(frozen=True)
class MigDevice:
    index: int | None
    gpu_instance_id: int | None
    compute_instance_id: int | None
    memory_total_mib: int | None


@dataclass(frozen=True)
class Gpu:
    pci_bus_id: str
    name: str | None
    architecture: str | None
    uuid: str | None
    serial: str | None
    minor_number: int | None
    memory_total_mib: int | None
    memory_used_mib: int | None
    persistence_mode: str | None
    mig_current: str | None
    mig_pending: str | None
    mig_devices: tuple[MigDevice, ...] = ()
    ecc_current: str | None = None
    ecc_pending: str | None = None
    compute_mode: str | None = None
    virtualization_mode: str | None = None

    @property
    def mig_enabled(self) -> bool:
        return self.mig_current == "Enabled"

    @property
    def mig_change_pending(self) -> bool:
        return _known(self.mig_pending) and self.mig_pending != self.mig_current

    @property
    def ecc_change_pending(self) -> bool:
        return _known(self.ecc_pending) and self.ecc_pending != self.ecc_current

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["mig_devices"] = [asdict(d) for d in self.mig_devices]
        data["mig_change_pending"] = self.mig_change_pending
        data["ecc_change_pending"] = self.ecc_change_pending
        return data


@dataclass(frozen=True)
class SmiLog:
    timestamp: str | None
    driver_version: str | None
    cuda_version: str | None
    attached_gpus: int | None
    gpus: tuple[Gpu, ...] = field(default_factory=tuple)
    dtd: str | None = None

    @property
    def uuids(self) -> list[str]:
        return [g.uuid for g in self.gpus if g.uuid]

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["gpus"] = [g.to_dict() for g in self.gpus]
        return data


def _known(value: str | None) -> bool:
    return value is not None and value not in NOT_AVAILABLE


def _text(node: ET.Element, path: str) -> str | None:
    found = node.find(path)
    if found is None or found.text is None:
        return None
    return found.text.strip()


def _int(text: str | None) -> int | None:
    match = re.match(r"\s*(-?\d+)", text or "")
    return int(match.group(1)) if match else None


def _mib(text: str | None) -> int | None:
    """'40960 MiB' -> 40960; 'N/A' -> None."""
    match = re.match(r"\s*(\d+)\s*MiB\s*$", text or "")
    return int(match.group(1)) if match else None


def _mig_devices(gpu: ET.Element) -> tuple[MigDevice, ...]:
    devices = []
    for dev in gpu.findall("mig_devices/mig_device"):
        devices.append(
            MigDevice(
                index=_int(_text(dev, "index")),
                gpu_instance_id=_int(_text(dev, "gpu_instance_id")),
                compute_instance_id=_int(_text(dev, "compute_instance_id")),
                memory_total_mib=_mib(_text(dev, "fb_memory_usage/total")),
            )
        )
    return tuple(devices)


def _gpu(node: ET.Element) -> Gpu:
    return Gpu(
        pci_bus_id=node.get("id") or _text(node, "pci/pci_bus_id") or "",
        name=_text(node, "product_name"),
        architecture=_text(node, "product_architecture"),
        uuid=_text(node, "uuid"),
        serial=_text(node, "serial"),
        minor_number=_int(_text(node, "minor_number")),
        memory_total_mib=_mib(_text(node, "fb_memory_usage/total")),
        memory_used_mib=_mib(_text(node, "fb_memory_usage/used")),
        persistence_mode=_text(node, "persistence_mode"),
        mig_current=_text(node, "mig_mode/current_mig"),
        mig_pending=_text(node, "mig_mode/pending_mig"),
        mig_devices=_mig_devices(node),
        ecc_current=_text(node, "ecc_mode/current_ecc"),
        ecc_pending=_text(node, "ecc_mode/pending_ecc"),
        compute_mode=_text(node, "compute_mode"),
        virtualization_mode=_text(node, "gpu_virtualization_mode/virtualization_mode"),
    )


def parse_xml(text: str) -> SmiLog:
    """`nvidia-smi -q -x` -> SmiLog. Raises NvsmiParseError for anything else."""
    if not (text or "").strip():
        raise NvsmiParseError("empty output")
    try:
        root = ET.fromstring(text.strip().encode("utf-8"))
    except ET.ParseError as exc:
        raise NvsmiParseError(f"not XML: {exc}") from None
    if root.tag != "nvidia_smi_log":
        raise NvsmiParseError(f"root element is <{root.tag}>, not <nvidia_smi_log>")
    dtd = re.search(r'<!DOCTYPE\s+nvidia_smi_log\s+SYSTEM\s+"([^"]+)"', text)
    return SmiLog(
        timestamp=_text(root, "timestamp"),
        driver_version=_text(root, "driver_version"),
        cuda_version=_text(root, "cuda_version"),
        attached_gpus=_int(_text(root, "attached_gpus")),
        gpus=tuple(_gpu(node) for node in root.findall("gpu")),
        dtd=dtd.group(1) if dtd else None,
    )


_LIST_GPU = re.compile(r"^GPU (\d+): (.*?) \(UUID: (GPU-[0-9A-Fa-f-]+)\)\s*$")
_LIST_MIG = re.compile(r"^\s+MIG (\S+)\s+Device\s+(\d+): \(UUID: (MIG-[0-9A-Za-z/-]+)\)\s*$")


def parse_list(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi -L` -> [{kind: GPU|MIG, index, name, uuid}] (other lines are ignored)."""
    found: list[dict[str, Any]] = []
    for line in (text or "").splitlines():
        gpu = _LIST_GPU.match(line)
        if gpu:
            found.append({"kind": "GPU", "index": int(gpu[1]), "name": gpu[2], "uuid": gpu[3]})
            continue
        mig = _LIST_MIG.match(line)
        if mig:
            found.append({"kind": "MIG", "index": int(mig[2]), "name": mig[1], "uuid": mig[3]})
    return found


def version_in(text: str | None) -> str | None:
    """The first version number in a tool's --version output."""
    match = re.search(r"(\d+\.\d+(?:\.\d+)?(?:[-~+][0-9A-Za-z.~+-]*)?)", text or "")
    return match.group(1) if match else None


def systemctl_show(text: str | None) -> dict[str, str]:
    """`systemctl show --property=…` KEY=VALUE lines."""
    return dict(line.split("=", 1) for line in (text or "").splitlines() if "=" in line)


def cli_info_uuids(text: str | None) -> list[str]:
    """GPU UUIDs from `nvidia-container-cli info` ("GPU UUID:   GPU-…")."""
    return re.findall(r"^GPU UUID:\s*(GPU-[0-9A-Fa-f-]+)\s*$", text or "", re.MULTILINE)


CDI_DEVICE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*=\S+$")


def cdi_spec_devices(specs: dict[str, str]) -> list[str]:
    """Fully qualified device names ("nvidia.com/gpu=0") from CDI spec files (YAML or JSON)."""
    names: list[str] = []
    for text in specs.values():
        try:
            spec = yaml.safe_load(text) or {}
        except yaml.YAMLError:
            continue
        if not isinstance(spec, dict):
            continue
        kind = spec.get("kind")
        for device in spec.get("devices") or []:
            if kind and isinstance(device, dict) and device.get("name") is not None:
                names.append(f"{kind}={device['name']}")
    return names


def cdi_list_devices(text: str | None) -> list[str]:
    """Device names `nvidia-ctk cdi list` printed (its log lines go to stderr)."""
    return [line.strip() for line in (text or "").splitlines() if CDI_DEVICE.match(line.strip())]
