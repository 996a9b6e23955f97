"""NVIDIA's DRA driver for GPUs (gpustack_k8s_gpu_allocation=dra): API check and verification.

Design: docs/dra.md. The cluster must serve `resource.k8s.io/v1` (DRA is GA in Kubernetes
1.34); `require_api` refuses it before anything is applied. Verification per node, in the
place of the device plugin's `capacity` and `pod` checks:
  devices   the DRA kubelet plugin published the node's GPUs: ResourceSlices of driver
            gpu.nvidia.com for the node name every GPU of the host, whole (`type=gpu`) or as
            the parent of MIG devices (`type=mig`)
  pod       a pod with a claim from a ResourceClaimTemplate (one device of DeviceClass
            gpu.nvidia.com, or mig.nvidia.com where only MIG devices are free), pinned to the
            node by node affinity, runs `nvidia-smi -L`; verify.py then wants exactly one GPU,
            one of the host's and one the node's ResourceSlices publish (the generated claim is
            deleted once the pod is done, so its allocation is not read back). A node with no
            free device is skipped, as with the device plugin.
"""

from __future__ import annotations

import uuid
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpustack.errors import BadInput, GpustackError
from gpustack.k8s.cluster.checks import FAILED, PASSED, SKIPPED
from gpustack.k8s.cluster.connect import Clock, Cluster, api_hint, call, poll, status_message
from gpustack.k8s.cluster.pods import POLL_SECONDS, pod_name, run_pods
from gpustack.k8s.manifests import (
    DRA_DRIVER,
    DRA_GPU_CLASS,
    DRA_MIG_CLASS,
    ClusterConfig,
    render_dra_verify_pod,
    render_verify_claim_template,
)

API = "/apis/resource.k8s.io/v1"
RESOURCES = ("deviceclasses", "resourceclaims", "resourceclaimtemplates", "resourceslices")
SLICES = f"{API}/resourceslices"
CLAIMS = f"{API}/resourceclaims"


def served_resources(cluster: Cluster) -> set[str]:
    """The resource.k8s.io/v1 resources the API server serves (empty: the version is absent)."""
    try:
        doc = cluster.raw("GET", API)
    except ApiException as exc:
        if exc.status == 404:
            return set()
        raise GpustackError(
            f"cannot read API discovery {API}: {status_message(exc)}", api_hint(exc)
        ) from None
    items = (doc.get("resources") or []) if isinstance(doc, dict) else []
    return {str(r.get("name")) for r in items}


def require_api(cluster: Cluster, version: str) -> None:
    """BadInput unless the cluster serves resource.k8s.io/v1 (before anything is applied)."""
    missing = [r for r in RESOURCES if r not in served_resources(cluster)]
    if missing:
        raise BadInput(
            f"gpustack_k8s_gpu_allocation=dra needs the resource.k8s.io/v1 API, which the "
            f"cluster ({version}) does not serve ({', '.join(missing)} missing); nothing "
            "was applied",
            "DRA is GA from Kubernetes 1.34: upgrade the cluster, or use "
            "gpustack_k8s_gpu_allocation=device-plugin",
        )


# -- what the kubelet plugin published, what the scheduler allocated ------------------------


def node_devices(cluster: Cluster) -> dict[str, list[dict[str, Any]]]:
    """node -> devices of driver gpu.nvidia.com in the ResourceSlices published for it."""
    found: dict[str, list[dict[str, Any]]] = {}
    for item in cluster.list_all(SLICES, "list ResourceSlices"):
        spec = item.get("spec") or {}
        if spec.get("driver") != DRA_DRIVER or not spec.get("nodeName"):
            continue
        pool = (spec.get("pool") or {}).get("name", "")
        for device in spec.get("devices") or []:
            found.setdefault(spec["nodeName"], []).append({**device, "_pool": pool})
    return found


def attribute(device: dict[str, Any], name: str) -> str | None:
    value = (device.get("attributes") or {}).get(name) or {}
    return value.get("string") if isinstance(value, dict) else None


def allocated(cluster: Cluster) -> dict[tuple[str, str], str]:
    """(pool, device) of gpu.nvidia.com -> namespace/name of the claim that holds it."""
    held = {}
    for claim in cluster.list_all(CLAIMS, "list ResourceClaims"):
        results = (((claim.get("status") or {}).get("allocation") or {}).get("devices")) or {}
        for result in results.get("results") or []:
            if result.get("driver") == DRA_DRIVER:
                meta = claim.get("metadata") or {}
                where = f"{meta.get('namespace')}/{meta.get('name')}"
                held[(result.get("pool", ""), result.get("device", ""))] = where
    return held


def covered_gpus(devices: list[dict[str, Any]]) -> set[str]:
    """Physical GPUs the devices stand for: a whole GPU (`type=gpu`, its uuid) or the parent of
    a MIG device (`type=mig`, parentUUID). A GPU in MIG mode without MIG devices has none."""
    found = set()
    for device in devices:
        kind = attribute(device, "type")
        uuid_ = attribute(device, "uuid") if kind == "gpu" else attribute(device, "parentUUID")
        if kind in ("gpu", "mig") and uuid_:
            found.add(uuid_)
    return found


def device_counts(devices: list[dict[str, Any]]) -> dict[str, int]:
    """The devices counted by the names the device plugin's mixed strategy gives them: a whole
    GPU (`type=gpu`) as nvidia.com/gpu, a MIG device (`type=mig`) as nvidia.com/mig-<profile>
    (NVIDIA/k8s-dra-driver-gpu@22407113 cmd/gpu-kubelet-plugin/mig.go `CommonAttributesMig`)."""
    counts: dict[str, int] = {}
    for device in devices:
        kind = attribute(device, "type")
        name = (
            "nvidia.com/gpu" if kind == "gpu" else f"nvidia.com/mig-{attribute(device, 'profile')}"
        )
        if kind in ("gpu", "mig"):
            counts[name] = counts.get(name, 0) + 1
    return counts


# -- verification ----------------------------------------------------------------------------


def wait_devices(cluster, config: ClusterConfig, names, candidates, clock: Clock):
    """The `devices` check: poll ResourceSlices until each candidate node lists its devices.

    Every GPU of the host must be published, whole (`type=gpu`) or as MIG devices
    (`type=mig`, by parentUUID), whatever gpustack_k8s_mig_strategy says (a device plugin
    setting). Returns host -> the node's devices for the nodes that passed.
    """
    if not candidates:
        return {}

    def observe():
        devices = node_devices(cluster)
        seen = {h: devices.get(names[h], []) for h in candidates}
        done = set()
        for host, (_, gpus) in candidates.items():
            covered = covered_gpus(seen[host])
            if len(covered) == gpus.count and (gpus.uuids is None or covered == set(gpus.uuids)):
                done.add(host)
        return (seen, done), len(done) == len(candidates)

    (seen, done), elapsed = poll(observe, config.capacity_timeout, POLL_SECONDS, clock)
    ready = {}
    for host, (report, gpus) in candidates.items():
        kinds: dict[str, int] = {}
        for device in seen[host]:
            kind = attribute(device, "type") or "?"
            kinds[kind] = kinds.get(kind, 0) + 1
        shown = ", ".join(f"{n} {k}" for k, n in sorted(kinds.items())) or "no device"
        if host in done:
            report.add("devices", PASSED, f"ResourceSlices of {DRA_DRIVER}: {shown}", elapsed)
            ready[host] = seen[host]
            continue
        report.add(
            "devices",
            FAILED,
            f"ResourceSlices of {DRA_DRIVER} for node {names[host]} list {shown} after "
            f"{config.capacity_timeout} s, expected all {gpus.count} GPU(s) of the host (whole "
            "or as MIG devices); is the DRA "
            f"kubelet plugin running there? `kubectl -n {config.namespace} logs "
            "ds/nvidia-dra-driver-gpu-kubelet-plugin -c gpus`",
            elapsed,
        )
    return ready


def run_verify_pods(cluster, config: ClusterConfig, reports, ready, clock, cordoned=False):
    """Run the `pod` check's pods through a ResourceClaimTemplate (created and deleted here);
    `cordoned`: the nodes are cordoned (an upgrade's validation) and the pods tolerate it.

    Returns (host -> PodOutcome, host -> DeviceClass used); nodes without a free device get
    their `pod` check skipped here. verify.py judges the outcomes.
    """
    if not ready:
        return {}, {}
    held = allocated(cluster)
    pods: dict[str, dict[str, Any]] = {}
    classes: dict[str, str] = {}
    for host, devices in ready.items():
        free = [d for d in devices if (d["_pool"], d["name"]) not in held]
        kinds = {attribute(d, "type") for d in free}
        if "gpu" in kinds or "mig" in kinds:  # a whole GPU first, else a MIG device
            classes[host] = DRA_GPU_CLASS if "gpu" in kinds else DRA_MIG_CLASS
        else:
            holders = sorted({held[(d["_pool"], d["name"])] for d in devices})
            reports[host].add(
                "pod",
                SKIPPED,
                f"every {DRA_DRIVER} device of the node is allocated (claims "
                f"{', '.join(holders[:5])}); no verification pod was started, so running "
                "workloads are not disturbed (run verify again when a device is free)",
            )
            continue
    if not classes:
        return {}, {}
    run = uuid.uuid4().hex[:8]
    templates = {
        cls: f"gpustack-verify-{cls.split('.')[0]}-{run}" for cls in sorted(set(classes.values()))
    }
    path = f"{API}/namespaces/{config.namespace}/resourceclaimtemplates"
    created: list[str] = []
    try:
        for cls, name in templates.items():
            template = render_verify_claim_template(config, name=name, device_class=cls)
            call(
                lambda t=template: cluster.raw("POST", path, body=t, ctype="application/json"),
                f"create ResourceClaimTemplate {config.namespace}/{name}",
            )
            created.append(name)
        for host, cls in classes.items():
            node = reports[host].node
            pods[host] = render_dra_verify_pod(
                config, node_name=node, name=pod_name("smi", node),
                claim_template=templates[cls], cordoned=cordoned,
            )  # fmt: skip
        outcomes = run_pods(cluster, pods, config.verify_timeout, clock)
    finally:
        for name in created:
            _delete_template(cluster, config.namespace, path, name)
    return outcomes, classes


def published_uuids(devices: list[dict[str, Any]]) -> set[str]:
    """GPU UUIDs the devices name: whole GPUs and the parents of MIG devices."""
    found = {attribute(d, "uuid") for d in devices} | {attribute(d, "parentUUID") for d in devices}
    return {u for u in found if u}


def _delete_template(cluster: Cluster, namespace: str, path: str, name: str) -> None:
    try:
        cluster.raw("DELETE", f"{path}/{name}")
    except ApiException as exc:
        if exc.status != 404:
            raise GpustackError(
                f"cannot delete ResourceClaimTemplate {namespace}/{name}: {status_message(exc)}",
                f"delete it by hand: kubectl -n {namespace} delete resourceclaimtemplate {name}",
            ) from None
