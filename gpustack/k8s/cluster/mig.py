"""The Kubernetes side of MIG layouts: the node labels the GPU Operator's mig-manager uses.

- `nvidia.com/mig.config` (set by the admin) names the node's layout;
- `nvidia.com/mig.config.state` (set by gpustack) is pending, rebooting, success or failed, the
  values of NVIDIA/mig-parted@bd7160f4 `deployments/container/reconfigure-mig.sh`; the reason of
  a failure goes to the annotation `gpustack.io/mig-config-failure`;
- the GPU clients are paused as upstream pauses them: their `nvidia.com/gpu.deploy.<component>`
  node labels (the nodeSelectors of gpustack's DaemonSets, as of the GPU Operator's) become
  `paused-for-mig-change` unless an admin forced them to `false`, then the DaemonSet pods on
  the node are waited for. One difference: upstream sets a label absent before to `true` when it
  resumes; gpustack restores the value it found (recorded in `gpustack.io/mig-paused-clients`),
  so a node that had no operand before has none after.

Cordon and GPU-pod eviction are `upgrade`'s (KubernetesBackend); an admin-cordoned node stays
cordoned. The sequence itself is pure: gpustack/fleet/mig.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpustack.fleet.mig import CONFIG_LABEL, STATE_LABEL, resource_drift
from gpustack.k8s.cluster.apply import get_daemonset
from gpustack.k8s.cluster.upgrade import KubernetesBackend
from gpustack.upgrade.backend import StepFailed, StepOptions
from gpustack.upgrade.executors import Clock

REASON_ANNOTATION = "gpustack.io/mig-config-failure"
PAUSED_ANNOTATION = "gpustack.io/mig-paused-clients"  # {label: value found} while paused
CORDON_ANNOTATION = "gpustack.io/mig-initially-unschedulable"
PAUSED = "paused-for-mig-change"
# The GPU clients the GPU Operator's mig-manager pauses (reconfigure-mig.sh): gpustack deploys
# the first three; the others are paused too when a node carries their label.
CLIENT_LABELS = tuple(
    f"nvidia.com/gpu.deploy.{c}"
    for c in ("device-plugin", "gpu-feature-discovery", "dcgm-exporter", "dcgm", "nvsm")
)


def paused_values(labels: Mapping[str, str]) -> dict[str, str]:
    """Pure: {label: value found} of the client labels to pause (present, not forced to false)."""
    return {
        k: labels[k]
        for k in CLIENT_LABELS
        if k in labels and labels[k] != "false" and labels[k] != PAUSED
    }


class MigKubernetesBackend:
    """gpustack.fleet.mig.MigNodeBackend on a cluster; node names from the upgrade backend."""

    def __init__(self, nodes: KubernetesBackend):
        self.nodes = nodes

    def _meta(self, host: str) -> dict[str, Any]:
        return self.nodes.read_node(host).get("metadata") or {}

    def desired_config(self, host: str) -> str | None:
        return (self._meta(host).get("labels") or {}).get(CONFIG_LABEL) or None

    def state(self, host: str) -> str | None:
        return (self._meta(host).get("labels") or {}).get(STATE_LABEL)

    def record(self, host: str, state: str, reason: str = "") -> None:
        patch = {
            "metadata": {
                "labels": {STATE_LABEL: state},
                "annotations": {REASON_ANNOTATION: reason if state == "failed" else None},
            }
        }
        self.nodes.patch_node(host, patch, "label")

    def cordon(self, host: str) -> str:
        node = self.nodes.read_node(host)
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        if CORDON_ANNOTATION not in annotations:  # a resumed run keeps the first run's answer
            admin = bool((node.get("spec") or {}).get("unschedulable"))
            patch = {"metadata": {"annotations": {CORDON_ANNOTATION: str(admin).lower()}}}
            self.nodes.patch_node(host, patch, "annotate")
        return self.nodes.cordon(host, None, StepOptions())

    def uncordon(self, host: str) -> str:
        """Uncordon what gpustack cordoned (nothing else: an admin's cordon stays)."""
        annotations = self._meta(host).get("annotations") or {}
        if CORDON_ANNOTATION not in annotations:
            return ""
        patch = {"metadata": {"annotations": {CORDON_ANNOTATION: None}}}
        self.nodes.patch_node(host, patch, "annotate")
        if annotations[CORDON_ANNOTATION] == "true":
            return f"{self.nodes.node_names[host]} stays cordoned (an admin had cordoned it)"
        return self.nodes.uncordon(host, None, StepOptions())

    def pause_clients(self, host: str, clock: Clock, opts: StepOptions) -> str:
        meta = self._meta(host)
        labels = meta.get("labels") or {}
        found = paused_values(labels)
        recorded = json.loads((meta.get("annotations") or {}).get(PAUSED_ANNOTATION) or "{}")
        found = {**found, **recorded}  # a resumed run: what the first run found wins
        patch = {
            "metadata": {
                "labels": dict.fromkeys(found, PAUSED),
                "annotations": {PAUSED_ANNOTATION: json.dumps(found, sort_keys=True)},
            }
        }
        self.nodes.patch_node(host, patch, "pause GPU clients on")
        start = clock.now()
        while True:
            left = self._client_pods(host, set(found))
            if not left:
                break
            if clock.now() - start >= opts.pod_deletion_timeout:
                raise StepFailed(
                    f"GPU clients did not stop within {opts.pod_deletion_timeout:g} s: "
                    + ", ".join(left[:5])
                )
            clock.sleep(opts.poll)
        names = ", ".join(k.rsplit(".", 1)[-1] for k in sorted(found)) or "none"
        return f"paused GPU clients ({names})"

    def _client_pods(self, host: str, selectors: set[str]) -> list[str]:
        pods = self.nodes.pods_on(host)
        return [
            f"{p['metadata'].get('namespace')}/{p['metadata']['name']}"
            for p in pods
            if set((p.get("spec") or {}).get("nodeSelector") or {}) & selectors
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]

    def resume_clients(self, host: str) -> str:
        """Restore the client labels this or an earlier run paused ('' when none were)."""
        meta = self._meta(host)
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        if PAUSED_ANNOTATION not in annotations:
            return ""
        recorded = json.loads(annotations[PAUSED_ANNOTATION] or "{}")
        back = {k: v for k, v in recorded.items() if labels.get(k) == PAUSED}
        patch = {"metadata": {"labels": back, "annotations": {PAUSED_ANNOTATION: None}}}
        self.nodes.patch_node(host, patch, "resume GPU clients on")
        return f"resumed GPU clients ({len(back)})"

    def evict_gpu_pods(self, host: str, clock: Clock, opts: StepOptions) -> str:
        return self.nodes.evict_gpu_pods(host, clock, opts)

    def check_resources(
        self, host: str, expected: Mapping[str, int], clock: Clock, opts: StepOptions
    ) -> str:
        """Wait until the node's allocatable GPU resources equal what the layout gives."""
        start = clock.now()
        while True:
            node = self.nodes.read_node(host)
            drift = resource_drift(expected, (node.get("status") or {}).get("allocatable") or {})
            if not drift:
                shown = ", ".join(f"{k}: {v}" for k, v in sorted(expected.items())) or "none"
                return f"node advertises the layout ({shown})"
            if clock.now() - start >= opts.validation_timeout:
                raise StepFailed(
                    f"node {self.nodes.node_names[host]} advertises {drift} after "
                    f"{opts.validation_timeout:g} s"
                )
            clock.sleep(opts.poll)


def deployed_strategy(cluster, namespace: str) -> str | None:
    """MIG_STRATEGY of gpustack's device plugin DaemonSet as deployed (None: not deployed)."""
    ds = get_daemonset(cluster, namespace, "nvidia-device-plugin")
    if ds is None:
        return None
    containers = ((ds.get("spec") or {}).get("template") or {}).get("spec", {}).get("containers")
    for container in containers or []:
        for env in container.get("env") or []:
            if env.get("name") == "MIG_STRATEGY":
                return str(env.get("value") or "none")
    return "none"


def connect_backend(kubeconfig: str, inventory, extravars) -> tuple[MigKubernetesBackend, str]:
    """The cluster, every inventory host's Node (BadInput when one is missing), and the MIG
    strategy the device plugin runs with (as deployed; else as configured)."""
    from gpustack.k8s.manifests import config_from_inventory

    nodes = KubernetesBackend.from_kubeconfig(
        kubeconfig, inventory, {**extravars, "gpustack_upgrade_verify_pod": "false"}
    )
    configured = config_from_inventory(inventory, extravars)
    strategy = deployed_strategy(nodes.cluster, configured.namespace) or configured.mig_strategy
    return MigKubernetesBackend(nodes), strategy
