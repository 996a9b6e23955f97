"""gpustack_k8s_gpu_allocation=volcano against a real cluster: the user's Volcano scheduler
must share GPUs by vGPU, and no other GPU allocator may run beside Volcano's vGPU device plugin.

Checked before any host or object is touched, by install and verify; read-only.
Why gpustack checks and does not edit Volcano's scheduler ConfigMap: it belongs to Volcano's
Helm release (a `helm upgrade` would put back its own), and it holds the user's whole scheduling
policy (actions, tiers, every plugin's arguments), which a merge could only guess at.
"""

from __future__ import annotations

from gpustack.k8s import volcano
from gpustack.k8s.cluster.apply import read_or_none
from gpustack.k8s.cluster.connect import Cluster
from gpustack.k8s.manifests_config import ClusterConfig


def require_ready(cluster: Cluster, config: ClusterConfig) -> None:
    """BadInput when Volcano's scheduler is absent or lacks deviceshare.VGPUEnable, or when
    NVIDIA's device plugin, NVIDIA's DRA driver or HAMi runs in the cluster (not gpustack's)."""
    namespace, name = config.volcano_namespace, config.volcano_scheduler_configmap
    configmap = read_or_none(
        cluster,
        f"/api/v1/namespaces/{namespace}/configmaps/{name}",
        f"ConfigMap {namespace}/{name}",
    )
    volcano.check_scheduler(config, configmap)
    daemonsets = cluster.list_all("/apis/apps/v1/daemonsets", "list DaemonSets")
    volcano.check_no_other_allocator(daemonsets)
