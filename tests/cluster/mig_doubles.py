"""TEST DOUBLE of the host side of a MIG change, for the label-driven flow on the emulator.

`FixtureMigApplier` stands in for running the nvidia_mig role through Ansible on a host: it
runs the role's own applier (plugins/module_utils/gpustack_mig_apply.py, unchanged)
against the MIG test fixture `nvidia-smi` in a temporary root (tests/unit/mig_local.py), then
gives the emulated node the MIG devices the fixture now has, as a real host's GPUs would show
them to the device plugin. It is as strict as a host: a GPU pod still running on the node when
the layout changes is a process on the GPU, and the fixture refuses the change (the role then
fails naming it). It proves gpustack's sequence and labels on the emulator and the fixture's
model only — nothing about NVIDIA's nvidia-smi, the GPU Operator or a real cluster.
"""

from __future__ import annotations

import json
import subprocess

from gpustack.fleet.mig import MigOutcome
from tests.unit.mig_local import FixtureNode


class FixtureMigApplier:
    def __init__(self, emu, nodes: dict[str, FixtureNode], **settings):
        self.emu = emu
        self.settings = settings  # the role's settings besides the layout (reset=False, ...)
        self.nodes = nodes  # host (= node name here) -> its fixture
        self.calls: list[tuple[str, str, bool]] = []
        self._users: list[subprocess.Popen] = []

    def _gpu_pods_running(self, host: str) -> list[dict]:
        from gpustack.k8s.cluster.upgrade import is_gpu_pod

        return [
            p
            for p in self.emu.pods_on(host)
            if is_gpu_pod(p)
            and (p.get("status") or {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]

    def __call__(self, host: str, layout: str, check: bool) -> MigOutcome:
        self.calls.append((host, layout, check))
        node = self.nodes[host]
        if not check:
            for _ in self._gpu_pods_running(host)[:1]:  # a busy GPU: the fixture sees a process
                self._users.append(node.use_gpu(0))
        try:
            fact = node.apply(layout, check_mode=check, **self.settings)
        finally:
            for proc in self._users:
                proc.kill()
                proc.wait()
            self._users.clear()
        if not check:
            self._show_to_node(host, fact)
        return MigOutcome.from_fact(fact)

    def reboot(self, host: str, layout: str, takes: bool = True) -> MigOutcome:
        """What the role does with nvidia_mig_reboot=if_needed: record `rebooting` in the
        host's state file, reboot (the fixture loses /run: instances gone, the pending mode
        effective), and report what gpustack-mig.service recorded at boot (the role's applier,
        source boot, same settings). takes=False: the host came back with the mode change still
        pending (the fixture was not restarted)."""
        self.calls.append((host, layout, "reboot"))
        node = self.nodes[host]
        recorded = json.loads(node.state_file.read_text())
        node.state_file.write_text(json.dumps({**recorded, "state": "rebooting"}))
        if takes:
            node.reboot()
        fact = node.apply(layout, source="boot", **self.settings)
        self._show_to_node(host, fact)
        return MigOutcome.from_fact(fact)

    def _show_to_node(self, host: str, fact: dict) -> None:
        hardware = self.emu.hardware(host)
        for gpu in fact.get("gpus") or []:
            emulated = hardware.gpus[gpu["index"]]
            applied = gpu.get("applied")
            if gpu.get("mode_current") != "Enabled":
                emulated.mig = None
            else:
                emulated.mig = [p for p, n in sorted((applied or {}).items()) for _ in range(n)]
        self.emu.hardware_changed()
