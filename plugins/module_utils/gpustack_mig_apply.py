# -*- coding: utf-8 -*-
"""Apply a MIG layout on one host: read, plan, refuse or change, verify, record (stdlib only).

Used twice, with the same settings: by the nvidia_mig role's module (library/gpustack_mig.py) and,
at boot, by gpustack-mig.service (`python3 gpustack_mig_apply.py --settings FILE --source boot`),
because MIG instances do not survive a reboot (MIG User Guide, "Getting Started with MIG").

Two appliers:
* nvidia-mig-parted (when installed, or asked for): `assert` decides whether anything must change,
  then the sequence of NVIDIA/mig-parted@bd7160f4 deployments/systemd/service.sh: `apply
  --mode-only` (with `--skip-reset` when resets are not allowed), `assert --mode-only`, `apply`.
* nvidia-smi: gpustack_mig_plan decides the steps; `nvidia-smi mig -dci/-dgi`, `-i N -mig 0|1`,
  `-r -i N`, `mig -cgi IDS -C` carry them out. Instances are cleared before re-creation and
  orderings are retried, as pkg/mig/config/config.go@bd7160f4 does through NVML.

Before any change: every GPU must be covered by the layout and fit it, and no process may use a
GPU that changes (the processes are named; gpustack does not kill them). The host's GPU clients
(systemd units, e.g. nvidia-dcgm) that are active are stopped for the change and started again,
as the GPU Operator's mig-manager does with its default-gpu-clients list.
"""

from __future__ import absolute_import, division, print_function

import json
import os
import shutil
import subprocess
import sys
import time

try:
    from ansible_collections.gpustack.gpustack.plugins.module_utils import (
        gpustack_mig_plan as mig_plan,
    )
    from ansible_collections.gpustack.gpustack.plugins.module_utils import gpustack_mig_smi as smi
except ImportError:  # on the host, run by gpustack-mig.service next to its siblings
    import gpustack_mig_plan as mig_plan  # type: ignore[no-redef]
    import gpustack_mig_smi as smi  # type: ignore[no-redef]

__metaclass__ = type


class Host:
    """The commands this applier runs; tests substitute the binaries, never the logic."""

    def __init__(self, settings):
        self.smi = settings.get("nvidia_smi") or "nvidia-smi"
        self.parted = settings.get("mig_parted") or "nvidia-mig-parted"
        self.calls = []  # mutating commands run, for the report

    def run(self, argv, record=False):
        try:
            # no capture_output/text: EL 8's platform-python is 3.6
            proc = subprocess.run(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                universal_newlines=True,
                check=False,
                timeout=600,
            )
            rc, out = proc.returncode, (proc.stdout + proc.stderr).strip()
        except OSError as exc:
            rc, out = 127, str(exc)
        if record:
            self.calls.append({"argv": argv, "rc": rc, "output": out[-2000:]})
        return rc, out

    def which(self, binary):
        return shutil.which(binary)

    def active(self, unit):
        return self.run(["systemctl", "is-active", "--quiet", unit])[0] == 0

    def systemctl(self, verb, unit):
        return self.run(["systemctl", verb, unit], record=True)


def assess(gpus, layout):
    """Plan every GPU; -> (plans by index, problems)."""
    plans, problems = {}, []
    for gpu in gpus:
        plan = mig_plan.plan_gpu(
            gpu, mig_plan.select_entry(layout, gpu), (gpu["instances"], gpu["empty_gis"])
        )
        if not plan["problem"] and plan["desired"] and gpu["mode_current"] == mig_plan.ENABLED:
            plan["problem"] = smi.profile_problem(gpu, plan["desired"])
        if plan["problem"]:
            problems.append(plan["problem"])
        plans[gpu["index"]] = plan
    return plans, problems


def gpu_report(gpu, plan):
    return {
        "index": gpu["index"],
        "uuid": gpu["uuid"],
        "name": gpu["name"],
        "device_id": gpu["device_id"],
        "mig_capable": gpu["mig_capable"],
        "mode_current": gpu["mode_current"],
        "mode_pending": gpu["mode_pending"],
        "desired_mode": plan["desired_mode"],
        "desired": plan["desired"],
        "applied": gpu["instances"] if gpu["mode_current"] == mig_plan.ENABLED else None,
        "in_layout": plan["in_layout"],
        "matches": not plan["steps"] and not plan["problem"],
        "steps": plan["steps"],
    }


# ---------------------------------------------------------------- the nvidia-mig-parted applier
def apply_with_parted(host, settings, allow_reset):
    base = ["-f", settings["config_file"], "-c", settings["config"]]
    if host.run([host.parted, "assert", "--mode-only"] + base)[0] != 0:
        rc, out = host.run(
            [host.parted, "apply", "--mode-only"]
            + (["--skip-reset"] if not allow_reset else [])
            + base,
            record=True,
        )
        if rc != 0:
            return [], ["nvidia-mig-parted apply --mode-only: %s" % out[-500:]]
        if host.run([host.parted, "assert", "--mode-only"] + base)[0] != 0:
            return ["MIG mode change pending after nvidia-mig-parted apply --mode-only"], []
    rc, out = host.run([host.parted, "apply"] + base, record=True)
    return [], ([] if rc == 0 else ["nvidia-mig-parted apply: %s" % out[-500:]])


def parted_asserts(host, settings):
    return (
        host.run([host.parted, "assert", "-f", settings["config_file"], "-c", settings["config"]])[
            0
        ]
        == 0
    )


# ---------------------------------------------------------------- one run
def previous_state(path):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def run(settings, check_mode=False, source="ansible", host=None):
    """Bring the host to settings['config']; return the gpustack_mig document (and record it)."""
    host = host or Host(settings)
    applier = settings.get("applier") or "auto"
    if applier == "auto":
        applier = "nvidia-mig-parted" if host.which(host.parted) else "nvidia-smi"
    result = {
        "config": settings["config"],
        "applier": applier,
        "source": source,
        "check_mode": check_mode,
        "changed": False,
        "reboot_required": False,
        "state": "success",
        "reason": "",
        "gpus": [],
        "processes": [],
        "clients_stopped": [],
        "commands": host.calls,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if applier == "nvidia-mig-parted" and not host.which(host.parted):
        return _finish(
            settings,
            result,
            "failed",
            "nvidia_mig_applier=nvidia-mig-parted but %s is not installed" % host.parted,
            check_mode,
        )
    gpus, error = smi.read_gpus(host)
    if error:
        devices = smi.nvidia_devices(settings.get("sysfs", "/sys/bus/pci/devices"))
        if devices:
            return _finish(
                settings,
                result,
                "pending",
                "NVIDIA driver not loaded (%s): gpustack-mig.service "
                "applies the layout at boot" % error.splitlines()[0],
                check_mode,
            )
        return _finish(
            settings,
            result,
            "failed",
            "no NVIDIA device (nvidia-smi: %s)" % error.splitlines()[0],
            check_mode,
        )
    try:
        plans, problems = assess(gpus, settings["layout"])
    except mig_plan.LayoutError as exc:
        return _finish(settings, result, "failed", str(exc), check_mode)
    result["gpus"] = [gpu_report(g, plans[g["index"]]) for g in gpus]
    if problems:
        return _finish(
            settings, result, "failed", "; ".join(problems) + ": nothing was changed", check_mode
        )
    todo = [g for g in gpus if plans[g["index"]]["steps"]]
    if applier == "nvidia-mig-parted":
        todo = [] if parted_asserts(host, settings) else (todo or gpus)
    if not todo:
        return _finish(
            settings, result, "success", "layout %s applied" % settings["config"], check_mode
        )
    return _change(settings, result, host, (gpus, plans, todo), check_mode)


def _change(settings, result, host, seen, check_mode):
    """Something differs: refuse, wait for a reboot, say what would change, or change it."""
    gpus, plans, todo = seen
    words = "; ".join(
        mig_plan.describe(g, plans[g["index"]]) for g in todo if plans[g["index"]]["steps"]
    )
    last = previous_state(settings["state_file"])
    if (
        last.get("state") == "rebooting"
        and last.get("config") == settings["config"]
        and any(
            g["mig_capable"] and g["mode_current"] != plans[g["index"]]["desired_mode"]
            for g in todo
        )
    ):
        return _finish(
            settings,
            result,
            "failed",
            "MIG mode change did not take effect after rebooting",
            check_mode,
        )
    sysfs = settings.get("sysfs", "/sys/bus/pci/devices")
    can_reset = {
        g["index"]: bool(settings.get("reset", True)) and smi.reset_available(g["bus_id"], sysfs)
        for g in gpus
    }
    if result["applier"] == "nvidia-smi" and all(
        smi.waiting_for_reboot(plans[g["index"]], can_reset[g["index"]]) for g in todo
    ):
        result["reboot_required"] = True
        return _finish(
            settings,
            result,
            "pending",
            words + ": waiting for a reboot (no reset allowed or "
            "available); gpustack-mig.service applies the layout at boot",
            check_mode,
        )
    if check_mode:
        result["changed"] = True
        return _finish(
            settings,
            result,
            "pending",
            "would change: " + (words or "nvidia-mig-parted apply"),
            True,
        )
    changing = {g["index"] for g in todo}
    # A process whose GPU cannot be told counts as using every GPU: never change under it.
    busy = [p for p in smi.read_processes(host, gpus) if p["gpu"] in changing or p["gpu"] is None]
    if busy:
        result["processes"] = busy
        names = ", ".join(
            "pid %d (%s) on GPU %s (%s)" % (p["pid"], p["name"], p["gpu"], p["gpu_uuid"])
            for p in busy
        )
        return _finish(
            settings,
            result,
            "failed",
            "GPU in use by %s: stop these processes, then re-run; nothing was changed" % names,
            check_mode,
        )
    stopped = [u for u in settings.get("clients", []) if host.active(u)]
    reboot, errors = [], []
    try:
        for unit in stopped:
            rc, out = host.systemctl("stop", unit)
            if rc != 0:
                errors.append("stopping %s: %s" % (unit, out))
        result["clients_stopped"] = stopped
        if not errors and result["applier"] == "nvidia-mig-parted":
            reboot, errors = apply_with_parted(host, settings, all(can_reset.values()))
        elif not errors:
            reboot, errors = smi.apply_with_smi(host, gpus, plans, can_reset)
    finally:
        for unit in stopped:
            rc, out = host.systemctl("start", unit)
            if rc != 0:
                errors.append("starting %s again: %s" % (unit, out))
    result["changed"] = bool(host.calls)
    return _verify(settings, result, host, reboot, errors)


def _verify(settings, result, host, reboot, errors):
    after, error = smi.read_gpus(host)
    if error:
        errors.append(error)
    else:
        plans, _ = assess(after, settings["layout"])
        result["gpus"] = [gpu_report(g, plans[g["index"]]) for g in after]
    if errors:
        return _finish(settings, result, "failed", "; ".join(errors), False)
    if reboot:
        result["reboot_required"] = True
        return _finish(
            settings,
            result,
            "pending",
            "; ".join(reboot) + ": reboot required; "
            "gpustack-mig.service applies the layout at boot",
            False,
        )
    if (
        not parted_asserts(host, settings)
        if result["applier"] == "nvidia-mig-parted"
        else any(not g["matches"] for g in result["gpus"])
    ):
        return _finish(
            settings,
            result,
            "failed",
            "layout %s still differs after applying it" % settings["config"],
            False,
        )
    return _finish(settings, result, "success", "layout %s applied" % settings["config"], False)


def _finish(settings, result, state, reason, check_mode):
    result["state"], result["reason"] = state, reason
    if not check_mode and settings.get("state_file"):
        directory = os.path.dirname(settings["state_file"])
        if not os.path.isdir(directory):
            os.makedirs(directory, 0o755)
        tmp = settings["state_file"] + ".tmp"
        with open(tmp, "w") as handle:
            json.dump(result, handle, indent=2, sort_keys=True)
        os.replace(tmp, settings["state_file"])
    return result


def main(argv):
    """gpustack-mig.service: re-apply the recorded layout; exit 1 when the state is 'failed'."""
    settings_file, source = "/etc/gpustack/mig/settings.json", "boot"
    args = list(argv)
    while args:
        flag = args.pop(0)
        if flag == "--settings" and args:
            settings_file = args.pop(0)
        elif flag == "--source" and args:
            source = args.pop(0)
        else:
            sys.stderr.write(
                "usage: gpustack_mig_apply.py [--settings FILE] [--source boot|manual]\n"
            )
            return 2
    with open(settings_file) as handle:
        settings = json.load(handle)
    result = run(settings, source=source)
    sys.stdout.write("gpustack-mig: %s: %s\n" % (result["state"], result["reason"]))
    return 1 if result["state"] == "failed" else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
