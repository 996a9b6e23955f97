# -*- coding: utf-8 -*-
"""What the host's nvidia-smi says and does for gpustack's MIG applier (stdlib only).

Reads GPUs, instances, offered profiles and processes (`--query-gpu`, `mig -lgi/-lci/-lgip`,
`--query-compute-apps`) and carries out gpustack_mig_plan's steps: `mig -dci/-dgi`, `-i N -mig 0|1`,
`-r -i N`, `mig -cgi IDS -C`. Command forms and outputs: the MIG User Guide, "Getting Started with
MIG". Instances are cleared before re-creation and orderings retried, as
NVIDIA/mig-parted@bd7160f4 pkg/mig/config/config.go does through NVML.
"""

from __future__ import absolute_import, division, print_function

import os

try:
    from ansible_collections.gpustack.gpustack.plugins.module_utils import (
        gpustack_mig_plan as mig_plan,
    )
except ImportError:  # on the host, run by gpustack-mig.service next to gpustack_mig_plan.py
    import gpustack_mig_plan as mig_plan  # type: ignore[no-redef]

__metaclass__ = type

NOT_FOUND = 6  # nvidia-smi's "not found", e.g. "No GPU instances found"


def nvidia_devices(sysfs="/sys/bus/pci/devices"):
    """PCI functions of NVIDIA GPUs (vendor 0x10de, class 0x0300xx/0x0302xx)."""
    found = []
    for dev in sorted(os.listdir(sysfs)) if os.path.isdir(sysfs) else []:
        try:
            with (
                open(os.path.join(sysfs, dev, "vendor")) as v,
                open(os.path.join(sysfs, dev, "class")) as c,
            ):
                if v.read().strip() == "0x10de" and c.read().strip()[:6] in ("0x0300", "0x0302"):
                    found.append(dev)
        except OSError:
            continue
    return found


def reset_available(bus_id, sysfs="/sys/bus/pci/devices"):
    """False when the GPU's PCI function exists but offers no reset (GPU passthrough in a VM), as
    mig-parted's deployments/systemd/utils.sh assert_gpu_reset_available checks."""
    try:
        domain, rest = bus_id.split(":", 1)
        name = ("%04x:%s" % (int(domain, 16), rest)).lower()
    except ValueError:
        return True
    path = os.path.join(sysfs, name)
    return not os.path.isdir(path) or os.path.exists(os.path.join(path, "reset"))


def waiting_for_reboot(plan, can_reset):
    """Only a reset (and what follows it) is left, and no reset may be done: a reboot must do it."""
    steps = set(plan["steps"])
    return "reset" in steps and not can_reset and steps <= {"reset", "create"}


def read_gpus(host):
    """-> (GPUs with their MIG mode, instances and offered profiles, error message or None)."""
    rc, out = host.run(
        [host.smi, "--query-gpu=" + ",".join(mig_plan.GPU_FIELDS), "--format=csv,noheader,nounits"]
    )
    if rc != 0:
        return [], out or "nvidia-smi exited %d" % rc
    gpus = mig_plan.parse_query_gpu(out)
    for gpu in gpus:
        gpu["instances"], gpu["empty_gis"], gpu["profiles"] = {}, 0, {}
    if not any(g["mode_current"] == mig_plan.ENABLED for g in gpus):
        return gpus, None
    texts = []
    for flag in ("-lgi", "-lci", "-lgip"):  # one call each for all MIG-enabled GPUs
        code, text = host.run([host.smi, "mig", flag])
        if code not in (0, NOT_FOUND):
            return gpus, "nvidia-smi mig %s: %s" % (flag, text)
        texts.append(text if code == 0 else "")
    gis, cis, profiles = (
        mig_plan.parse_lgi(texts[0]),
        mig_plan.parse_lci(texts[1]),
        mig_plan.parse_lgip(texts[2]),
    )
    for gpu in gpus:
        if gpu["mode_current"] == mig_plan.ENABLED:
            gpu["instances"], gpu["empty_gis"] = mig_plan.current_devices(gpu["index"], gis, cis)
            gpu["profiles"] = profiles.get(gpu["index"], {})
    return gpus, None


def read_processes(host, gpus):
    """Compute processes, each with the index of its GPU ("gpu"); a process on a MIG device names
    the device's UUID, which `nvidia-smi -L` maps to its GPU."""
    rc, out = host.run(
        [host.smi, "--query-compute-apps=pid,gpu_uuid,process_name", "--format=csv,noheader"]
    )
    procs = mig_plan.parse_compute_apps(out) if rc == 0 else []
    owner = {g["uuid"]: g["index"] for g in gpus}
    if any(p["gpu_uuid"] not in owner for p in procs):
        rc, listing = host.run([host.smi, "-L"])
        owner.update(mig_plan.parse_list(listing) if rc == 0 else {})
    for proc in procs:
        proc["gpu"] = owner.get(proc["gpu_uuid"])
    return procs


def profile_problem(gpu, wanted):
    if any("c." in name for name in wanted):
        return (
            "GPU %d: compute-instance profiles (%s) need nvidia-mig-parted; the nvidia-smi applier "
            "creates whole GPU instances only" % (gpu["index"], ", ".join(sorted(wanted)))
        )
    why = mig_plan.check_profiles(wanted, gpu["profiles"])
    return "GPU %d (%s): %s" % (gpu["index"], gpu["name"], why) if why else None


# ---------------------------------------------------------------- the nvidia-smi applier
def _destroy(host, index):
    for flag in ("-dci", "-dgi"):
        rc, out = host.run([host.smi, "mig", "-i", str(index), flag], record=True)
        if rc not in (0, NOT_FOUND):
            return out
    return None


def _create(host, gpu, wanted):
    """Create `wanted` on a MIG-enabled GPU, retrying orderings; -> error or None."""
    rc, lgip = host.run([host.smi, "mig", "-i", str(gpu["index"]), "-lgip"])
    available = mig_plan.parse_lgip(lgip).get(gpu["index"], {}) if rc == 0 else {}
    problem = profile_problem(dict(gpu, profiles=available), wanted)
    if problem:
        return problem
    last = ""
    for order in mig_plan.creation_orders(wanted, available):
        rc, last = host.run(
            [host.smi, "mig", "-i", str(gpu["index"]), "-cgi", ",".join(map(str, order)), "-C"],
            record=True,
        )
        if rc == 0:
            return None
        error = _destroy(host, gpu["index"])  # a partial layout must not stay behind
        if error:
            return error
    return "GPU %d: creating %s failed: %s" % (gpu["index"], wanted, last)


def apply_with_smi(host, gpus, plans, can_reset):
    """Carry the plans out; -> (reboot-required reasons, errors)."""
    reboot, errors = [], []
    for gpu in gpus:
        if plans[gpu["index"]]["steps"]:
            wait, error = _apply_gpu(host, gpu, plans[gpu["index"]], can_reset[gpu["index"]])
            reboot += [wait] if wait else []
            errors += [error] if error else []
    return reboot, errors


def _apply_gpu(host, gpu, plan, can_reset):
    """One GPU's steps; -> (reboot-required reason, error)."""
    index = gpu["index"]
    if waiting_for_reboot(plan, can_reset):
        return "GPU %d: MIG mode change pending (no reset allowed or available)" % index, None
    if "destroy" in plan["steps"]:
        error = _destroy(host, index)
        if error:
            return None, "GPU %d: %s" % (index, error)
    now, wait, error = _switch_mode(host, gpu, plan["desired_mode"], can_reset)
    if wait or error or "create" not in plan["steps"]:
        return wait, error
    error = _create(host, now, plan["desired"])
    if error and now["mode_current"] != gpu["mode_current"]:
        # This run enabled MIG for a layout the GPU cannot hold (its profiles are only known once
        # MIG is on): leave the GPU in the mode it had.
        _, wait, back = _switch_mode(host, now, gpu["mode_current"], can_reset)
        error += "; MIG mode %s" % (
            "set back to " + gpu["mode_current"]
            if not (wait or back)
            else "could not be set back: %s" % (wait or back)
        )
    return None, error


def _switch_mode(host, gpu, want, can_reset):
    """Set the MIG mode, made effective by a reset where allowed; -> (gpu now, wait, error)."""
    index = str(gpu["index"])
    if gpu["mode_pending"] != want:
        rc, out = host.run(
            [host.smi, "-i", index, "-mig", "1" if want == mig_plan.ENABLED else "0"], record=True
        )
        if rc != 0:
            return gpu, None, "GPU %s: setting MIG mode failed: %s" % (index, out)
    now = _reread(host, gpu)
    if now["mode_current"] == want:
        return now, None, None
    if not can_reset:
        return now, "GPU %s: MIG mode change pending (no reset allowed or available)" % index, None
    rc, out = host.run([host.smi, "-r", "-i", index], record=True)
    now = _reread(host, gpu)
    if now["mode_current"] != want:
        return (
            now,
            "GPU %s: MIG mode change pending, the reset did not apply it (%s)" % (index, out),
            None,
        )
    return now, None, None


def _reread(host, gpu):
    rc, out = host.run(
        [
            host.smi,
            "-i",
            str(gpu["index"]),
            "--query-gpu=" + ",".join(mig_plan.GPU_FIELDS),
            "--format=csv,noheader,nounits",
        ]
    )
    rows = mig_plan.parse_query_gpu(out) if rc == 0 else []
    return rows[0] if rows else gpu
