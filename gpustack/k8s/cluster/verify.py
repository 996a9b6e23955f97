"""Per-node verification: GPUs on the host, capacity in the node, a GPU pod, labels, metrics.

Checks per node, in order (a failed check skips the later ones for that node):
  node      the inventory host maps to a Node object
  gpus      host facts show NVIDIA GPUs with a loaded driver
  operands  each DaemonSet that selects the node has a Ready pod of its template there
  capacity  allocatable `nvidia.com/gpu` equals GPUs × gpus_per_device; with MIG, any GPU
            resource of either family (`nvidia.com/gpu*`, `nvidia.com/mig-*`) counts
  pod       a pod pinned to the node asks for ONE free unit (a MIG resource first, as the GPU
            Operator's validator does) and runs `nvidia-smi -L`; it must see exactly one GPU,
            one of the host's. When every unit is held by other pods, no pod is started
            (skipped): verification never disturbs running workloads. Under HAMi the pod also
            asks for gpustack_k8s_hami_verify_memory MiB, and nvidia-smi in it must report
            that as the GPU's total memory (HAMi-core's limit)
  share     gpustack_k8s_gpu_allocation=volcano only: a Volcano Job of two pods pinned to the
            node, each asking one volcano.sh/vgpu-number and gpustack_k8s_volcano_verify_memory
            MiB of GPU memory (volcano.sh/vgpu-memory), lists the GPUs it sees with their total
            memory; each must see exactly one of the host's GPUs (the same one unless Volcano's
            policy spread them over the node's GPUs) reporting that many MiB as its total
            (HAMi-core's limit). Skipped with fewer than two free volcano.sh/vgpu-number
  vectoradd optional (gpustack_k8s_vector_add_image): the CUDA vectorAdd sample Succeeds
  dcgm      optional (gpustack_k8s_dcgm_scrape): dcgm-exporter reports DCGM_FI_DEV_GPU_TEMP
            for each of the node's GPUs (through the API server's service proxy)
  gfd       GFD's labels on the node; skipped when NFD is not installed (gfd.py)
With gpustack_k8s_gpu_allocation=dra, `capacity` and `pod` are dra.py's `devices` and `pod`
(ResourceSlices, a ResourceClaimTemplate); vectoradd is not run there.
Verification pods are deleted whatever happens (also on Ctrl-C).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from gpustack.fleet import doctor
from gpustack.fleet.mig import expected_resources, resource_drift
from gpustack.k8s.cluster import dra, gfd, gpu_resources, metrics
from gpustack.k8s.cluster.checks import FAILED, PASSED, SKIPPED, NodeReport
from gpustack.k8s.cluster.connect import Clock, Cluster, poll
from gpustack.k8s.cluster.pods import (
    POLL_SECONDS,
    job_name,
    pod_name,
    run_pods,
    run_volcano_jobs,
)
from gpustack.k8s.manifests import ClusterConfig, render_verify_pod, render_verify_volcano_job
from gpustack.k8s.volcano import VGPU_MEMORY, VGPU_NUMBER


@dataclass
class HostGpus:
    count: int
    uuids: list[str] | None  # None: no driver facts on this run
    driver_state: str
    loaded: bool


def host_gpus(facts: dict[str, Any]) -> HostGpus:
    """Pure: what the host facts say about GPUs (gpustack_preflight + gpustack_driver)."""
    pf = facts.get("gpustack_preflight") or {}
    count = int((pf.get("gpus") or {}).get("count") or 0)
    driver = facts.get("gpustack_driver") or {}
    smi = facts.get("gpustack_smi") or {}  # from playbooks/verify.yml
    uuids = None
    if driver.get("gpus") is not None and str(driver.get("nvidia_smi", {}).get("rc", "0")) == "0":
        uuids = [g["uuid"] for g in driver["gpus"] if str(g.get("uuid", "")).startswith("GPU-")]
    elif str(smi.get("rc")) == "0":
        uuids = csv_uuids(str(smi.get("stdout") or ""))
    state = doctor.driver_state(pf) if pf else "unknown (no preflight facts)"
    if driver.get("state"):
        state = str(driver["state"])
    return HostGpus(
        count, uuids, state, bool(pf and (pf.get("driver") or {}).get("loaded_version"))
    )


def csv_uuids(text: str) -> list[str]:
    """Pure: UUIDs from `nvidia-smi --query-gpu=name,uuid,... --format=csv,noheader`."""
    found = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[1].startswith("GPU-"):
            found.append(parts[1])
    return found


_MIB = re.compile(r"^(\d+) MiB$")


def csv_memory(text: str) -> dict[str, int | None]:
    """Pure: UUID -> total memory in MiB (None when not a number, e.g. [N/A]) from
    `nvidia-smi --query-gpu=name,uuid,memory.total --format=csv,noheader`."""
    found = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 3 and parts[1].startswith("GPU-"):
            match = _MIB.match(parts[2])
            found[parts[1]] = int(match.group(1)) if match else None
    return found


def hami_memory(asked: int, memory: dict[str, int | None]) -> tuple[bool, str]:
    """Pure: under HAMi the one GPU the pod sees must report the MiB it asked for as its total
    memory (HAMi-core's limit); the message names the limit either way."""
    return _memory_limit(asked, memory, "the pod", "HAMi", "nvidia.com/gpumem", "HAMi's")


def volcano_memory(asked: int, memory: dict[str, int | None]) -> tuple[bool, str]:
    """Pure: a pod of the share Job sees one GPU, which must report the MiB the pod asked
    Volcano's vGPU device plugin for as its total memory: the plugin passes the request to the
    container as CUDA_DEVICE_MEMORY_LIMIT_0=<MiB>m (Project-HAMi/volcano-vgpu-device-plugin
    pkg/plugin/server.go@afefcc2ff7944e9e68275e83217cf5eb7fb4a585, Allocate) and mounts
    HAMi-core, whose NVML hook reports that limit as the total."""
    return _memory_limit(
        asked, memory, "a pod of the Volcano Job", "Volcano's vGPU device plugin", VGPU_MEMORY,
        "the plugin's",
    )  # fmt: skip


def _memory_limit(
    asked: int, memory: dict[str, int | None], pod: str, plugin: str, resource: str, whose: str
) -> tuple[bool, str]:
    [(uuid, total)] = memory.items()
    if total == asked:
        return True, f"GPU memory limit {asked} MiB in effect (nvidia-smi's total in the pod)"
    shown = "no number" if total is None else f"{total} MiB"
    return False, (
        f"{pod} asked {plugin} for {asked} MiB ({resource}) but nvidia-smi in it reports "
        f"{shown} as {uuid}'s total memory: HAMi-core's memory limit is not in effect (is "
        f"{whose} interposer, /usr/local/vgpu/libvgpu.so, loaded in the container?)"
    )


_SMI_GPU = re.compile(r"^GPU \d+: .*\(UUID: (GPU-[0-9a-fA-F-]+)\)\s*$")


def smi_uuids(text: str) -> list[str]:
    """Pure: GPU UUIDs from `nvidia-smi -L` output (MIG lines are ignored)."""
    return [m.group(1) for line in text.splitlines() if (m := _SMI_GPU.match(line.strip()))]


_SMI_MIG = re.compile(r"^MIG .*\(UUID: (MIG-[0-9a-fA-F-]+)\)\s*$")


def smi_mig_uuids(text: str) -> list[str]:
    """Pure: MIG device UUIDs from `nvidia-smi -L` output."""
    return [m.group(1) for line in text.splitlines() if (m := _SMI_MIG.match(line.strip()))]


def compare_uuids(expected: list[str] | None, seen: list[str]) -> tuple[bool, str]:
    """Pure: the pod asked for one unit, so it must see exactly one GPU, one of the host's."""
    if not seen:
        return False, "nvidia-smi in the pod listed no GPU"
    if len(seen) > 1:
        return False, (
            f"the pod asked for one unit but nvidia-smi in it listed {len(seen)} GPUs "
            f"({', '.join(seen)}): GPU isolation is not in effect (the container sees GPUs "
            "the device plugin did not allocate to it)"
        )
    if expected is None:
        return True, f"1 GPU seen ({seen[0]}); host UUIDs unknown (no driver facts)"
    if seen[0] not in expected:
        return False, (
            f"GPU UUID mismatch: not on the host {seen[0]}; the host has {', '.join(expected)}"
        )
    return True, f"GPU {seen[0]} seen, UUID matches one of the host's {len(expected)}"


def pod_verdict(config: ClusterConfig, expected: list[str] | None, log: str) -> tuple[bool, str]:
    """Pure: the `pod` check on what nvidia-smi printed in a verification pod that asked for
    one unit (render_verify_pod): exactly one GPU, one of `expected` (the host's UUIDs; None:
    unknown), and under HAMi the memory limit it asked for. Also the upgrade's validation."""
    if config.hami:
        return _limited_gpu(expected, csv_memory(log), hami_memory, config.hami_verify_memory)
    return compare_uuids(expected, smi_uuids(log))


def _limited_gpu(
    expected: list[str] | None, memory: dict[str, int | None], judge, asked: int
) -> tuple[bool, str]:
    """Pure: a pod that asked for one GPU with `asked` MiB of its memory (`memory`: its
    csv_memory) sees exactly one GPU, one of `expected`, and `judge` (hami_memory,
    volcano_memory) finds that limit in effect; the message names both."""
    ok, message = compare_uuids(expected, list(memory))
    if not ok:
        return False, message
    ok, limit = judge(asked, memory)
    return ok, f"{message}; {limit}" if ok else limit


def dra_pod_verdict(
    expected: list[str] | None, log: str, devices: list[dict[str, Any]]
) -> tuple[bool, str]:
    """Pure: the `pod` check under DRA: `nvidia-smi -L` in the pod given a claim lists exactly
    one GPU, one of `expected`, and one the node's ResourceSlices (`devices`) publish. Also the
    upgrade's validation."""
    seen = smi_uuids(log)
    ok, message = compare_uuids(expected, seen)
    if ok and seen[0] not in dra.published_uuids(devices):
        return False, (
            f"nvidia-smi in the pod listed {seen[0]}, which the node's ResourceSlices of "
            f"{dra.DRA_DRIVER} do not publish: the GPU did not come from the DRA driver"
        )
    if ok:
        message += f"; one of the devices {dra.DRA_DRIVER} publishes for the node"
    return ok, message


@dataclass
class Target:
    """One inventory host to verify: its node (if found) and its facts."""

    host: str
    node_name: str
    node: dict[str, Any] | None
    facts: dict[str, Any]
    error: str = ""  # why this host cannot be verified (no node, host stack failed)


def verify(
    cluster: Cluster,
    config: ClusterConfig,
    targets: list[Target],
    *,
    operands: dict[str, tuple[bool, str]] | None = None,
    nfd_api: bool = False,
    clock: Clock | None = None,
) -> list[NodeReport]:
    """Run every check on every target; return one report per host (never raises per node).

    `operands`: node name -> (ready, message) of the DaemonSets that select the node; a node
    whose operands are not ready fails there and skips the later checks. `nfd_api`: whether
    the cluster serves NFD's NodeFeature API (for the `gfd` check's wording).
    """
    clock = clock or Clock()
    reports: dict[str, NodeReport] = {}
    candidates: dict[str, tuple[NodeReport, HostGpus]] = {}
    for target in targets:
        report = NodeReport(target.host, target.node_name)
        reports[target.host] = report
        if target.error:
            report.add("host" if target.error.startswith("host") else "node", FAILED, target.error)
            continue
        report.add("node", PASSED, target.node_name)
        gpus = host_gpus(target.facts)
        report.gpus = gpus.count
        report.uuids = gpus.uuids or []
        if gpus.count == 0:  # never hidden: a GPU node without a GPU fails verification
            state = gpus.driver_state
            suffix = "" if "no NVIDIA device" in state else ": no NVIDIA device"
            report.add("gpus", FAILED, f"driver {state}{suffix}")
            continue
        if not gpus.loaded and not gpus.driver_state.startswith("loaded"):
            report.add("gpus", FAILED, f"{gpus.count} GPU(s), driver {gpus.driver_state}")
            continue
        report.add("gpus", PASSED, f"{gpus.count} GPU(s), driver {gpus.driver_state}")
        if operands is not None:
            ok, message = operands.get(target.node_name, (False, "no DaemonSet selects this node"))
            report.add("operands", PASSED if ok else FAILED, message)
            if not ok:
                continue
        candidates[target.host] = (report, gpus)
    if config.dra:  # NVIDIA's DRA driver: ResourceSlices and a claim instead (dra.py)
        names = {t.host: t.node_name for t in targets if t.host in candidates}
        ready = dra.wait_devices(cluster, config, names, candidates, clock)
        _dra_pods(cluster, config, reports, candidates, ready, clock)
        units: dict[str, str] = {}
    else:
        ready = _wait_capacity(cluster, config, targets, candidates, clock)
        units = _verify_pods(cluster, config, reports, candidates, ready, clock)
        if config.volcano and units:
            _volcano_share(cluster, config, reports, candidates, list(units), ready, clock)
    if config.vector_add_image and units:
        _vectoradd(cluster, config, reports, units, clock)
    passing = [reports[h] for h in ready if not reports[h].failed()]
    if config.dcgm_scrape and passing:
        metrics.check_dcgm(cluster, config, passing, clock)
    gfd.check_labels(cluster, config, [r for r in passing if not r.failed()], nfd_api, clock)
    return [reports[t.host] for t in targets]


def mig_layouts(targets: list[Target], config: ClusterConfig) -> dict[str, dict[str, int]]:
    """host -> the GPU resources its MIG layout gives under the configured strategy, for hosts
    whose nvidia_mig role ran (its `gpustack_mig` fact, state success): the device plugin must
    advertise exactly these. Hosts without the fact keep the "some capacity" check."""
    out = {}
    for target in targets:
        mig = target.facts.get("gpustack_mig") or {}
        if mig.get("state") == "success" and mig.get("gpus"):
            out[target.host] = expected_resources(mig["gpus"], config.mig_strategy, desired=False)
    return out


def _wait_capacity(cluster, config, targets, candidates, clock) -> dict[str, dict[str, Any]]:
    """Poll nodes until each candidate shows its GPU capacity; returns host -> Node object.

    Without MIG the configured resource must equal GPUs × gpus_per_device; with MIG any unit of
    either family counts (mixed strategy on an all-MIG node advertises only nvidia.com/mig-*).
    """
    if not candidates:
        return {}
    resource = config.resource_name
    per = config.gpus_per_device
    expected = {h: g.count * per for h, (_, g) in candidates.items()}
    names = {t.host: t.node_name for t in targets if t.host in candidates}
    layouts = mig_layouts(targets, config) if config.mig_strategy != "none" else {}

    def observe():
        nodes = {n["metadata"]["name"]: n for n in cluster.list_all("/api/v1/nodes", "list nodes")}
        seen = {h: gpu_resources.gpu_allocatable(nodes.get(names[h]) or {}) for h in candidates}
        if config.capacity_predictable:
            done = {h for h in candidates if seen[h].get(resource, 0) == expected[h]}
        else:
            done = {h for h in candidates if sum(seen[h].values()) > 0}
        done = {h for h in done if h not in layouts or not resource_drift(layouts[h], seen[h])}
        return (nodes, seen, done), len(done) == len(candidates)

    (nodes, seen, done), elapsed = poll(observe, config.capacity_timeout, POLL_SECONDS, clock)
    ready = {}
    for host, (report, gpus) in candidates.items():
        shown = ", ".join(f"{k}: {v}" for k, v in seen[host].items() if v) or f"{resource}: 0"
        if host in done:
            report.add("capacity", PASSED, shown, elapsed)
            ready[host] = nodes[names[host]]
            continue
        hint = (f"is the device plugin running there? `kubectl -n {config.namespace} logs "
                "ds/nvidia-device-plugin`")  # fmt: skip
        if config.capacity_predictable:
            sharing = f" × {per} ({config.sharing})" if per > 1 else ""
            message = (f"allocatable {resource} is {seen[host].get(resource, 0)} after "
                       f"{config.capacity_timeout} s, expected {expected[host]} "
                       f"({gpus.count} GPU(s){sharing}); {hint}")  # fmt: skip
        elif host in layouts:
            message = (f"advertised {resource_drift(layouts[host], seen[host])} after "
                       f"{config.capacity_timeout} s with MIG strategy {config.mig_strategy}; "
                       f"{hint}")  # fmt: skip
        else:
            message = (f"no allocatable GPU resource (nvidia.com/gpu or nvidia.com/mig-*) after "
                       f"{config.capacity_timeout} s with MIG strategy {config.mig_strategy}; "
                       f"{hint}")  # fmt: skip
        report.add("capacity", FAILED, message, elapsed)
    return ready


def _node_units(cluster: Cluster, node: dict[str, Any]) -> dict[str, gpu_resources.Units]:
    name = node["metadata"]["name"]
    pods = cluster.list_all(
        "/api/v1/pods", f"list pods on {name}", fieldSelector=f"spec.nodeName={name}"
    )
    return gpu_resources.units(node, pods)


def _verify_pods(cluster, config, reports, candidates, ready, clock) -> dict[str, str]:
    """The `pod` check; returns host -> the GPU resource its verification unit came from."""
    chosen: dict[str, gpu_resources.Units] = {}
    pods = {}
    for host, node in ready.items():
        found = _node_units(cluster, node)
        unit = gpu_resources.choose(found, config.resource_name)
        if unit is None:
            reports[host].add("pod", SKIPPED, gpu_resources.busy_message(found))
            continue
        chosen[host] = unit
        pods[host] = render_verify_pod(
            config,
            node_name=reports[host].node,
            gpus=1,
            name=pod_name("smi", reports[host].node),
            resource=unit.resource,
        )
    for host, outcome in run_pods(cluster, pods, config.verify_timeout, clock).items():
        report, unit = reports[host], chosen[host]
        if outcome.phase != "Succeeded":
            report.add("pod", FAILED, outcome.message, outcome.seconds)
            continue
        ok, message = pod_verdict(config, candidates[host][1].uuids, outcome.log)
        mig = smi_mig_uuids(outcome.log)
        detail = f"; 1 {unit.resource} of {unit.free} free" + (
            f" (MIG device {mig[0]})" if mig else ""
        )
        report.add(
            "pod", PASSED if ok else FAILED, message + (detail if ok else ""), outcome.seconds
        )
    return {h: u.resource for h, u in chosen.items() if not reports[h].failed()}


def share_verdict(
    expected: list[str] | None, asked: int, seen: list[dict[str, int | None]]
) -> tuple[bool, str]:
    """Pure: each pod of the share Job asked for one vGPU with `asked` MiB of its memory, so each
    must see exactly one of the host's GPUs (`seen`: each pod's csv_memory) with that many MiB as
    its total; the same GPU in both shows it shared."""
    for memory in seen:
        ok, message = _limited_gpu(expected, memory, volcano_memory, asked)
        if not ok:
            return False, message
    gpus = sorted({next(iter(memory)) for memory in seen})
    if len(gpus) == 1:
        return True, (
            f"the Volcano Job's {len(seen)} pods were placed together on GPU {gpus[0]}; "
            f"GPU memory limit {asked} MiB in effect in each (nvidia-smi's total in the pod)"
        )
    return True, (
        f"the Volcano Job's pods got different GPUs ({', '.join(gpus)}), GPU memory limit "
        f"{asked} MiB in effect in each: Volcano's deviceshare.SchedulePolicy spread them, so "
        "one GPU shared was not exercised"
    )


def _volcano_share(cluster, config, reports, candidates, hosts, ready, clock) -> None:
    """The `share` check under gpu_allocation=volcano (a Volcano Job, two pods, one node)."""
    jobs = {}
    for host in hosts:
        if reports[host].failed():
            continue
        unit = _node_units(cluster, ready[host]).get(VGPU_NUMBER)
        if unit is None or unit.free < 2:
            free = 0 if unit is None else unit.free
            reports[host].add(
                "share", SKIPPED,
                f"{free} free {VGPU_NUMBER}, the share check needs 2; no Job was started",
            )  # fmt: skip
            continue
        node = reports[host].node
        jobs[host] = render_verify_volcano_job(config, node_name=node, name=job_name(node))
    done = run_volcano_jobs(cluster, jobs, 2, config.verify_timeout, clock)
    for host, outcome in done.items():
        report = reports[host]
        if isinstance(outcome, str):
            report.add("share", FAILED, outcome)
            continue
        seconds = max(o.seconds for o in outcome)
        failed = [o.message for o in outcome if o.phase != "Succeeded"]
        if failed:
            report.add("share", FAILED, "; ".join(failed), seconds)
            continue
        ok, message = share_verdict(
            candidates[host][1].uuids,
            config.volcano_verify_memory,
            [csv_memory(o.log) for o in outcome],
        )
        report.add("share", PASSED if ok else FAILED, message, seconds)


def _dra_pods(cluster, config, reports, candidates, ready, clock) -> None:
    """The `pod` check under DRA: exactly one GPU, the host's, one the node's slices publish."""
    outcomes, classes = dra.run_verify_pods(cluster, config, reports, ready, clock)
    for host, outcome in outcomes.items():
        report = reports[host]
        if outcome.phase != "Succeeded":
            report.add("pod", FAILED, outcome.message, outcome.seconds)
            continue
        ok, message = dra_pod_verdict(candidates[host][1].uuids, outcome.log, ready[host])
        if ok:
            message += f" ({classes[host]})"
        report.add("pod", PASSED if ok else FAILED, message, outcome.seconds)


def _vectoradd(cluster, config, reports, units: dict[str, str], clock) -> None:
    pods = {
        host: render_verify_pod(
            config,
            node_name=reports[host].node,
            gpus=1,
            name=pod_name("vectoradd", reports[host].node),
            kind="vectoradd",
            resource=resource,
        )
        for host, resource in units.items()
    }
    for host, outcome in run_pods(cluster, pods, config.verify_timeout, clock).items():
        ok = outcome.phase == "Succeeded"
        reports[host].add("vectoradd", PASSED if ok else FAILED, outcome.message, outcome.seconds)
