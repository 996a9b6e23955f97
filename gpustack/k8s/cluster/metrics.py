"""dcgm-exporter's metrics through the API server's service proxy (optional verify check)."""

from __future__ import annotations

import re

from kubernetes.client.exceptions import ApiException

from gpustack.k8s.cluster.checks import FAILED, PASSED, NodeReport
from gpustack.k8s.cluster.connect import Cluster, status_message
from gpustack.k8s.manifests import METRICS_PORT, ClusterConfig

_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)"
)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_samples(text: str, name: str) -> list[dict[str, str]]:
    """Pure: label sets of every sample of metric `name` in Prometheus text format."""
    found = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m["name"] == name:
            found.append(dict(_LABEL.findall(m["labels"] or "")))
    return found


def check_dcgm(cluster: Cluster, config: ClusterConfig, reports: list[NodeReport], clock) -> None:
    """DCGM_FI_DEV_GPU_TEMP per GPU, through the service proxy.

    The proxy reaches one dcgm-exporter pod per request, so it is asked repeatedly (up to
    3 × nodes times) until every node's GPUs were seen.
    """
    path = (
        f"/api/v1/namespaces/{config.namespace}/services/dcgm-exporter:{METRICS_PORT}/proxy/metrics"
    )
    seen_uuids: set[str] = set()
    per_host: dict[str, int] = {}
    error = ""
    start = clock.now()
    for _ in range(max(3, 3 * len(reports))):
        try:
            text = cluster.raw("GET", path)
        except ApiException as exc:
            error = status_message(exc)
            break
        for labels in metric_samples(str(text), "DCGM_FI_DEV_GPU_TEMP"):
            if labels.get("UUID"):
                seen_uuids.add(labels["UUID"])
            host = labels.get("Hostname", "")
            per_host[host] = per_host.get(host, 0) + 1
        if all(_dcgm_ok(r, seen_uuids, per_host)[0] for r in reports):
            break
    elapsed = clock.now() - start
    for report in reports:
        if error:
            report.add("dcgm", FAILED, f"cannot scrape dcgm-exporter: {error}", elapsed)
            continue
        ok, message = _dcgm_ok(report, seen_uuids, per_host)
        report.add("dcgm", PASSED if ok else FAILED, message, elapsed)


def _dcgm_ok(report: NodeReport, seen: set[str], per_host: dict[str, int]) -> tuple[bool, str]:
    if report.uuids:
        missing = [u for u in report.uuids if u not in seen]
        if missing:
            return False, f"no DCGM_FI_DEV_GPU_TEMP sample for {', '.join(missing)}"
        return True, f"DCGM_FI_DEV_GPU_TEMP for {len(report.uuids)} GPU(s)"
    count = per_host.get(report.node, 0)
    if count < report.gpus:
        return (
            False,
            f"{count} DCGM_FI_DEV_GPU_TEMP sample(s) from {report.node}, expected {report.gpus}",
        )
    return True, f"DCGM_FI_DEV_GPU_TEMP for {count} GPU(s)"
