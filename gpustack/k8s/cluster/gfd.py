"""GPU Feature Discovery and Node Feature Discovery: is NFD's API served, did GFD's labels land.

GFD only produces labels; Node Feature Discovery (nfd-master for NodeFeature objects,
nfd-worker for features.d files) puts them on the node. gpustack does not deploy NFD, so it
says plainly when the labels cannot appear. Detection asks API discovery for
`nodefeatures` in `nfd.k8s-sigs.io/v1alpha1` (readable by any authenticated user, unlike the
CRD object itself).
"""

from __future__ import annotations

from typing import Any

from kubernetes.client.exceptions import ApiException

from gpustack.errors import GpustackError
from gpustack.k8s.cluster.checks import FAILED, PASSED, SKIPPED, NodeReport
from gpustack.k8s.cluster.connect import Clock, Cluster, api_hint, poll, status_message
from gpustack.k8s.manifests import ClusterConfig

NFD_API = "/apis/nfd.k8s-sigs.io/v1alpha1"
NFD_RESOURCE = "nodefeatures.nfd.k8s-sigs.io"
GFD_LABEL = "nvidia.com/gpu.product"  # set by GFD only (internal/lm of k8s-device-plugin)
GFD_DEPLOY_LABEL = "nvidia.com/gpu.deploy.gpu-feature-discovery"
POLL_SECONDS = 1.0

NO_NFD = (
    f"GFD labels need Node Feature Discovery running: this cluster does not serve {NFD_RESOURCE} "
    "(NFD is not installed); GFD writes /etc/kubernetes/node-feature-discovery/features.d/gfd "
    "on the node and no label appears until NFD is deployed"
)


def nfd_api_served(cluster: Cluster) -> bool:
    """Whether NFD's NodeFeature API is served (API discovery; 404: not installed)."""
    try:
        doc = cluster.raw("GET", NFD_API)
    except ApiException as exc:
        if exc.status in (403, 404):
            return False
        raise GpustackError(
            f"cannot read API discovery {NFD_API}: {status_message(exc)}", api_hint(exc)
        ) from None
    resources = (doc.get("resources") or []) if isinstance(doc, dict) else []
    return any(r.get("name") == "nodefeatures" for r in resources)


def has_gfd_labels(node: dict[str, Any]) -> bool:
    return GFD_LABEL in ((node.get("metadata") or {}).get("labels") or {})


def missing_note(nfd_api: bool) -> str:
    """What `status` and `verify` say about a node without GFD labels."""
    if not nfd_api:
        return NO_NFD
    return (
        f"GFD labels need Node Feature Discovery running: {NFD_RESOURCE} is served but the node "
        f"has no {GFD_LABEL} label; is nfd-master running? "
        "(kubectl get pods -A -l app.kubernetes.io/name=node-feature-discovery)"
    )


def check_labels(
    cluster: Cluster, config: ClusterConfig, reports: list[NodeReport], nfd_api: bool, clock: Clock
) -> None:
    """The `gfd` check: GFD's labels on each node (NFD puts them there), or why not.

    Labels present: passed. NFD's API absent: skipped (NFD is the cluster's, not gpustack's).
    NFD's API served but no label within capacity_timeout: failed (NFD is expected to run).
    """
    if not config.gfd_enabled or not reports:
        return

    def observe():
        nodes = {n["metadata"]["name"]: n for n in cluster.list_all("/api/v1/nodes", "list nodes")}
        missing = [r for r in reports if not has_gfd_labels(nodes.get(r.node) or {})]
        return nodes, not missing or not nfd_api

    nodes, elapsed = poll(observe, config.capacity_timeout, POLL_SECONDS, clock)
    for report in reports:
        labels = (nodes.get(report.node) or {}).get("metadata", {}).get("labels") or {}
        if GFD_LABEL in labels:
            report.add(
                "gfd", PASSED, f"GFD labels present ({GFD_LABEL}={labels[GFD_LABEL]})", elapsed
            )
        elif not nfd_api:
            report.add("gfd", SKIPPED, NO_NFD, elapsed)
        else:
            report.add(
                "gfd", FAILED, f"after {config.capacity_timeout} s: {missing_note(True)}", elapsed
            )
