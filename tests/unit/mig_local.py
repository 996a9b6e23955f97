"""The MIG test fixture run on the controller (a temporary root), and the role's applier loaded
from the role as Ansible ships it. Nothing here is a stand-in for gpustack's own code."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.conftest import ROOT

UTILS = ROOT / "plugins/module_utils"
FIXTURE = ROOT / "tests/fixtures/nvidia_smi_mig.py"
LAYOUTS = yaml.safe_load((ROOT / "roles/nvidia_mig/files/mig-layouts.yaml").read_text())[
    "mig-configs"
]


def _load(name: str, path: Path):
    if str(UTILS) not in sys.path:  # gpustack_mig_apply imports its sibling, as on a host
        sys.path.insert(0, str(UTILS))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


plan = _load("gpustack_mig_plan", UTILS / "gpustack_mig_plan.py")
apply = _load("gpustack_mig_apply", UTILS / "gpustack_mig_apply.py")
fixture = _load("nvidia_smi_mig", FIXTURE)

# A test double of nvidia-mig-parted's CLI contract (flags of cmd/nvidia-mig-parted/apply/apply.go
# and assert/assert.go @bd7160f4): it records argv and keeps "mode" and "config" flags in a file.
# It refuses unknown flags and a missing -f/-c, like the real CLI. It models no GPU.
FAKE_PARTED = """#!{python}
import json, os, sys
state_path = {state!r}
argv = sys.argv[1:]
with open(state_path + ".log", "a") as log:
    log.write(json.dumps(argv) + "\\n")
state = json.load(open(state_path)) if os.path.exists(state_path) else {{"mode": False, "config": False}}
cmd, rest = argv[0], argv[1:]
flags = {{"--mode-only", "--skip-reset"}}
args = [a for a in rest if a not in flags]
if cmd not in ("assert", "apply") or len(args) != 4 or args[0] != "-f" or args[2] != "-c" or not os.path.exists(args[1]):
    print("Incorrect Usage"); sys.exit(1)
mode_only = "--mode-only" in rest
if cmd == "assert":
    ok = state["mode"] if mode_only else state["mode"] and state["config"]
    sys.exit(0 if ok else 1)
if not state["mode"]:
    state["mode"] = "--skip-reset" not in rest or {resets_apply_mode!r}
if not mode_only:
    if not state["mode"]:
        print("error asserting MIG enabled"); sys.exit(1)
    state["config"] = True
json.dump(state, open(state_path, "w"))
print("MIG configuration applied successfully")
"""


class InProcessHost(apply.Host):
    """The applier's Host, with the fixture's nvidia-smi served in this process (no interpreter
    start per call). The argv, the output text and the exit code are the same as through exec."""

    def __init__(self, settings, root: Path):
        super().__init__(settings)
        self.root = root

    def run(self, argv, record=False):
        if argv[0] != self.smi:
            return super().run(argv, record)
        fixture.configure(str(self.root))
        rc, out = fixture.serve(list(argv[1:]))
        if record:
            self.calls.append({"argv": list(argv), "rc": rc, "output": out.strip()[-2000:]})
        return rc, out.strip()


class FixtureNode:
    """A fixture 'node' under tmp_path: declared GPUs, the stand-in nvidia-smi, the applier's settings."""

    def __init__(self, tmp_path: Path, gpus: list[str], reset: str = "allowed"):
        self.root = tmp_path / "node"
        self.bin = tmp_path / "bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        self.declare(gpus, reset)
        self.smi_path = self.bin / "nvidia-smi"
        self.smi_path.write_text(
            f'#!/bin/sh\nGPUSTACK_FIXTURE_ROOT={self.root} exec {sys.executable} {FIXTURE} "$@"\n'
        )
        self.smi_path.chmod(0o755)
        self.state_file = tmp_path / "state/state.json"
        self.config_file = tmp_path / "config.yaml"
        self.config_file.write_text("version: v1\n")

    def declare(self, gpus: list[str], reset: str = "allowed") -> None:
        hw = self.root / "etc/gpustack-fixture/nvidia-smi.json"
        hw.parent.mkdir(parents=True, exist_ok=True)
        hw.write_text(json.dumps({"gpus": gpus, "reset": reset}))

    def smi(self, *args: str) -> tuple[int, str]:
        proc = subprocess.run(
            [str(self.smi_path), *args], capture_output=True, text=True, check=False
        )
        return proc.returncode, proc.stdout

    def calls(self) -> list[list[str]]:
        log = self.root / "var/log/gpustack-fixture-nvidia-smi.log"
        return (
            [json.loads(line)["argv"] for line in log.read_text().splitlines()]
            if log.exists()
            else []
        )

    def mutating_calls(self) -> list[list[str]]:
        return [a for a in self.calls() if {"-mig", "-r", "-cgi", "-dgi", "-dci"} & set(a)]

    def reboot(self) -> None:
        """What a node restart does to the fixture: /run is gone."""
        subprocess.run(["rm", "-rf", str(self.root / "run")], check=True)

    def use_gpu(self, gpu: int, mig: int | None = None) -> subprocess.Popen:
        proc = subprocess.Popen(["sleep", "60"])
        # The fixture names users from /proc/PID/comm: wait until the child shows as `sleep`
        # (under load the parent's name was read once, before the exec was visible).
        comm = Path(f"/proc/{proc.pid}/comm")
        deadline = time.monotonic() + 10
        while comm.read_text().strip() != "sleep" and time.monotonic() < deadline:
            time.sleep(0.01)
        procs = self.root / "run/gpustack-fixture/nvidia-smi/processes.json"
        procs.parent.mkdir(parents=True, exist_ok=True)
        entry = {"gpu": gpu, "pid": proc.pid, **({"mig": mig} if mig is not None else {})}
        procs.write_text(json.dumps([entry]))
        return proc

    def settings(self, layout, **extra) -> dict:
        name, entries = (layout, LAYOUTS[layout]) if isinstance(layout, str) else ("custom", layout)
        return {"config": name, "config_file": str(self.config_file), "layout": entries, "applier": "nvidia-smi",
                "reset": True, "clients": [], "state_file": str(self.state_file), "nvidia_smi": str(self.smi_path),
                "mig_parted": str(self.bin / "no-such-nvidia-mig-parted"), "sysfs": str(self.root / "sys"),
                **extra}  # fmt: skip

    def apply(self, layout, check_mode=False, source="ansible", **extra) -> dict:
        settings = self.settings(layout, **extra)
        host = InProcessHost(settings, self.root)
        return apply.run(settings, check_mode=check_mode, source=source, host=host)

    def fake_parted(self, resets_apply_mode: bool = True) -> Path:
        path = self.bin / "nvidia-mig-parted"
        state = str(self.bin / "parted-state.json")
        path.write_text(
            FAKE_PARTED.format(
                python=sys.executable, state=state, resets_apply_mode=resets_apply_mode
            )
        )
        path.chmod(0o755)
        return path

    def parted_calls(self) -> list[list[str]]:
        log = self.bin / "parted-state.json.log"
        return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
