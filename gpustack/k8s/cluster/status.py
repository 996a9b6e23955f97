"""The Kubernetes columns of `gpustack status`: a few paginated list calls, never one per node.

Calls for any fleet size: GET /version (in `prepare`), the nodes (pages of 500), the
device plugin pods of gpustack's namespace (pages of 500, one label selector) and, while GFD
is on, NFD's API discovery (GFD labels need Node Feature Discovery running; see gfd.py).
"""

from __future__ import annotations

import contextlib
import gc
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gpustack.k8s.cluster import dra, flow, gfd, nodes, pause
from gpustack.k8s.volcano import VGPU_NUMBER

UPGRADE_STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
DEVICE_PLUGIN_SELECTOR = (
    "app.kubernetes.io/name=nvidia-device-plugin,app.kubernetes.io/instance=gpustack"
)
# gpustack_k8s_gpu_allocation=dra: the DRA kubelet plugin's pods, GPUs from ResourceSlices
DRA_PLUGIN_SELECTOR = (
    "app.kubernetes.io/name=nvidia-dra-driver-gpu,app.kubernetes.io/instance=gpustack"
)
# gpustack_k8s_gpu_allocation=hami: HAMi's device plugin pods (its nvidia.com/gpu are shares)
HAMI_PLUGIN_SELECTOR = (
    "app.kubernetes.io/name=hami-device-plugin,app.kubernetes.io/instance=gpustack"
)
# gpustack_k8s_gpu_allocation=volcano: Volcano's vGPU device plugin pods (GPU shares are
# volcano.sh/vgpu-number)
VOLCANO_PLUGIN_SELECTOR = (
    "app.kubernetes.io/name=volcano-device-plugin,app.kubernetes.io/instance=gpustack"
)
GPU_RESOURCE = "nvidia.com/gpu"
PAGE = 500


def prepare(kubeconfig: str, inventory, extravars: dict[str, Any]) -> flow.Session:
    """Validate the kubeconfig and reach the API server before any host is contacted."""
    return flow.prepare(kubeconfig, inventory, extravars, required=True)


def _gpus(node: dict[str, Any], resource: str = GPU_RESOURCE) -> int:
    value = ((node.get("status") or {}).get("allocatable") or {}).get(resource, "0")
    return int(str(value)) if str(value).isdigit() else 0


def _ready(obj: dict[str, Any]) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def node_views(
    matches: dict[str, nodes.NodeMatch],
    plugin_pods: list[dict[str, Any]],
    nfd_api: bool | None = None,
    published: dict[str, int] | None = None,
    allocator: str | None = None,
) -> dict[str, dict[str, Any]]:
    """Pure: per inventory host, what the cluster says about its node.

    `nfd_api` (None: GFD is off) words the note on a GFD node without GFD's labels.
    `published` (DRA only): node -> GPUs its ResourceSlices publish, which then stand for
    allocatable GPUs, and `plugin_pods` are the DRA kubelet plugin's.
    `allocator` "hami": `plugin_pods` are HAMi's device plugin's and the view says so
    (allocatable `nvidia.com/gpu` then counts GPU shares: GPUs × deviceSplitCount);
    "volcano": they are Volcano's vGPU device plugin's, and allocatable counts
    `volcano.sh/vgpu-number` (GPU shares: GPUs × deviceSplitCount).
    """
    resource = VGPU_NUMBER if allocator == "volcano" else GPU_RESOURCE
    pods_by_node: dict[str, list[dict[str, Any]]] = {}
    for pod in plugin_pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        if node_name:
            pods_by_node.setdefault(node_name, []).append(pod)
    views: dict[str, dict[str, Any]] = {}
    for host, match in matches.items():
        if match.node is None:
            views[host] = {"node": None, "error": match.error, "hint": match.hint}
            continue
        node = match.node
        name = node["metadata"]["name"]
        pods = pods_by_node.get(name, [])
        views[host] = {
            "node": name,
            "ready": _ready(node),
            "cordoned": bool((node.get("spec") or {}).get("unschedulable")),
            "allocatable_gpus": (
                _gpus(node, resource) if published is None else published.get(name, 0)
            ),
            "device_plugin_ready": (any(_ready(p) for p in pods) if pods else None),
            "device_plugin_pods": [p["metadata"]["name"] for p in pods],
            "upgrade_state": ((node["metadata"].get("labels") or {}).get(UPGRADE_STATE_LABEL)),
            "gfd_labels": gfd.has_gfd_labels(node),
        }
        if published is not None:
            views[host]["allocator"] = "dra"
        elif allocator:
            views[host]["allocator"] = allocator
        labels = node["metadata"].get("labels") or {}
        if paused := pause.paused_clients(labels):
            views[host]["paused_clients"] = paused
        gfd_node = nfd_api is not None and labels.get(gfd.GFD_DEPLOY_LABEL) == "true"
        if gfd_node and not gfd.has_gfd_labels(node):
            views[host]["note"] = gfd.missing_note(bool(nfd_api))
    return views


@contextlib.contextmanager
def _cyclic_gc_paused():
    """Decoded JSON holds no reference cycles (reference counting frees it all), yet while
    tens of thousands of its dicts are built the cyclic collector walks them again and again:
    at 10,000 nodes that was 60 % of the client's CPU and grew faster than the fleet."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def read_nodes(session: flow.Session) -> dict[str, dict[str, Any]]:
    """List nodes and device plugin pods (paginated) and map them to inventory hosts."""
    cluster = session.cluster
    dra_mode = session.config.dra
    try:
        nfd_api = gfd.nfd_api_served(cluster) if session.config.gfd_enabled else None
        # The two lists are independent: one is decoded while the server answers the other.
        with _cyclic_gc_paused(), ThreadPoolExecutor(max_workers=1) as pool:
            plugin_pods = pool.submit(
                cluster.list_all,
                f"/api/v1/namespaces/{session.config.namespace}/pods",
                "list the device plugin pods",
                page=PAGE,
                labelSelector=(
                    DRA_PLUGIN_SELECTOR
                    if dra_mode
                    else HAMI_PLUGIN_SELECTOR
                    if session.config.hami
                    else VOLCANO_PLUGIN_SELECTOR
                    if session.config.volcano
                    else DEVICE_PLUGIN_SELECTOR
                ),
            )
            all_nodes = cluster.list_all("/api/v1/nodes", "list nodes", page=PAGE)
            pods = plugin_pods.result()
            published = None
            if dra_mode:
                devices = dra.node_devices(cluster)
                published = {n: len(dra.covered_gpus(d)) for n, d in devices.items()}
            matches = nodes.match_hosts(session.node_names, session.hostvars, all_nodes)
            allocator = session.config.gpu_allocation
            allocator = allocator if allocator in ("hami", "volcano") else None
            return node_views(matches, pods, nfd_api, published, allocator)
    finally:
        cluster.close()
