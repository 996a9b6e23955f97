"""Builders of SIMULATED host facts, play results and inventories, for tests of gpustack's
Kubernetes flows against the real control plane (tests/kube/).

SIMULATED HOST FACTS: this machine has no GPU, so the success path is driven by facts built
here in the shape gpu_preflight (`gpustack_preflight`) and nvidia_driver (`gpustack_driver`)
publish on a real GPU node. They stand in for hosts; they prove nothing about real GPUs.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from gpustack.ansible.inventory import Inventory, load_inventory
from gpustack.ansible.results import HostResult, RunResult

DRIVER = "580.95.05"


def uuids_for(host: str, count: int) -> list[str]:
    tag = hashlib.sha1(host.encode()).hexdigest()[:8]
    return [f"GPU-{tag}-1111-2222-3333-{i:012d}" for i in range(count)]


def gpu_facts(host: str, count: int, uuids: list[str] | None = None) -> dict:
    """Simulated facts of a GPU host with a loaded driver (see the module doc)."""
    uuids = uuids if uuids is not None else uuids_for(host, count)
    return {
        "gpustack_preflight": {
            "gpus": {
                "count": count,
                "devices": [
                    {"pci": f"0000:{i + 1:02x}:00.0", "device": "20b5", "class": "0302"}
                    for i in range(count)
                ],
            },
            "driver": {
                "installed": {"package": "nvidia-driver-580", "version": f"{DRIVER}-1"},
                "loaded_version": DRIVER,
            },
        },
        "gpustack_driver": {
            "state": f"loaded {DRIVER}",
            "nvidia_smi": {"rc": 0, "message": "ok"},
            "gpus": [
                {"name": "NVIDIA A100-SXM4-80GB", "uuid": u, "memory_mib": 81920} for u in uuids
            ],
        },
    }


def no_gpu_facts() -> dict:
    """Simulated facts of a host with the driver package but no NVIDIA device."""
    return {
        "gpustack_preflight": {
            "gpus": {"count": 0, "devices": []},
            "driver": {
                "installed": {"package": "nvidia-driver", "version": "535.261.03-1"},
                "loaded_version": None,
            },
        }
    }


def run_result(facts: dict[str, dict], failed: tuple[str, ...] = ()) -> RunResult:
    """A host play result as the runner builds it: every host ok unless listed in `failed`."""
    hosts = {}
    for name, host_facts in facts.items():
        host = HostResult(name=name, ok=3, started=True, facts=host_facts)
        if name in failed:
            from gpustack.ansible.results import TaskFailure

            host.failed = 1
            host.failures.append(TaskFailure("Install the driver", "nvidia_driver", "apt failed"))
        hosts[name] = host
    return RunResult("site.yml", "successful", 0, "/nonexistent", hosts)


def inventory(
    directory: Path, hosts: list[str], hostvars: dict | None = None, **group
) -> Inventory:
    """A real INI inventory file (local connection; flows here never run a play on it)."""
    lines = ["[gpu_nodes]"]
    for host in hosts:
        extra = " ".join(f"{k}={v}" for k, v in (hostvars or {}).get(host, {}).items())
        lines.append(f"{host} ansible_connection=local {extra}".strip())
    if group:
        lines += ["", "[gpu_nodes:vars]", *(f"{k}={v}" for k, v in group.items())]
    path = directory / "inventory.ini"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return load_inventory(path)


def smi_output(uuids: list[str]) -> str:
    return "".join(f"GPU {i}: NVIDIA A100-SXM4-80GB (UUID: {u})\n" for i, u in enumerate(uuids))
