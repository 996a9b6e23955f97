"""The Kubernetes side of MIG layouts: the node labels the GPU Operator's mig-manager uses.

- `nvidia.com/mig.config` (set by the admin) names the node's layout;
- `nvidia.com/mig.config.state` (set by gpustack) is pending, rebooting, success or failed, the
  values of NVIDIA/mig-parted@bd7160f4 `deployments/container/reconfigure-mig.sh`; the reason of
  a failure goes to the annotation `gpustack.io/mig-config-failure`;
- the GPU clients are paused as upstream pauses them (gpustack/k8s/cluster/pause.py): their
  `nvidia.com/gpu.deploy.<component>` node labels become `paused-for-mig-change`, the value
  found is recorded in `gpustack.io/mig-paused-clients` and restored afterwards.

Cordon and GPU-pod eviction are `upgrade`'s (KubernetesBackend); an admin-cordoned node stays
cordoned. The sequence itself is pure: gpustack/mig/reconfigure.py.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpustack.errors import BadInput
from gpustack.fleet.mig import CONFIG_LABEL, STATE_LABEL, resource_drift
from gpustack.k8s.cluster import dra
from gpustack.k8s.cluster.apply import get_daemonset
from gpustack.k8s.cluster.pause import ClientPause
from gpustack.k8s.cluster.upgrade import KubernetesBackend
from gpustack.upgrade.backend import StepFailed, StepOptions
from gpustack.upgrade.executors import Clock

REASON_ANNOTATION = "gpustack.io/mig-config-failure"
PAUSED_ANNOTATION = "gpustack.io/mig-paused-clients"  # {label: value found} while paused
CORDON_ANNOTATION = "gpustack.io/mig-initially-unschedulable"
PAUSED = "paused-for-mig-change"


class MigKubernetesBackend:
    """gpustack.mig.reconfigure.MigNodeBackend on a cluster; node names from the upgrade backend."""

    def __init__(self, nodes: KubernetesBackend):
        self.nodes = nodes
        self.clients = ClientPause(nodes, PAUSED, PAUSED_ANNOTATION)

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
        return self.clients.pause(host, clock, opts)

    def resume_clients(self, host: str) -> str:
        """Restore the client labels this or an earlier run paused ('' when none were)."""
        return self.clients.resume(host)

    def evict_gpu_pods(self, host: str, clock: Clock, opts: StepOptions) -> str:
        return self.nodes.evict_gpu_pods(host, clock, opts)

    def check_resources(
        self, host: str, expected: Mapping[str, int], clock: Clock, opts: StepOptions
    ) -> str:
        """Wait until the node's GPU resources equal what the layout gives: its allocatable, or
        under DRA the devices NVIDIA's kubelet plugin publishes in its ResourceSlices (which
        the device plugin's resources never reach)."""
        start = clock.now()
        where = f"ResourceSlices of {dra.DRA_DRIVER}" if self.nodes.dra else "allocatable"
        while True:
            drift = resource_drift(expected, self._advertised(host))
            if not drift:
                shown = ", ".join(f"{k}: {v}" for k, v in sorted(expected.items())) or "none"
                return f"node advertises the layout in its {where} ({shown})"
            if clock.now() - start >= opts.validation_timeout:
                raise StepFailed(
                    f"node {self.nodes.node_names[host]} advertises {drift} in its {where} "
                    f"after {opts.validation_timeout:g} s"
                )
            clock.sleep(opts.poll)

    def _advertised(self, host: str) -> Mapping[str, Any]:
        if not self.nodes.dra:
            return (self.nodes.read_node(host).get("status") or {}).get("allocatable") or {}
        devices = dra.node_devices(self.nodes.cluster).get(self.nodes.node_names[host], [])
        return dra.device_counts(devices)


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
    strategy the device plugin runs with (as deployed; else as configured). Under DRA the
    layout is counted as the mixed strategy names it: one kind of device per MIG profile.
    Under HAMi or Volcano's vGPU plugin (configured, or its plugin deployed) it is refused:
    they hand out shares of whole GPUs, without MIG."""
    from gpustack.k8s import hami, volcano
    from gpustack.k8s.manifests import config_from_inventory

    nodes = KubernetesBackend.from_kubeconfig(
        kubeconfig, inventory, {**extravars, "gpustack_upgrade_verify_pod": "false"}
    )
    configured = config_from_inventory(inventory, extravars)
    plugins = {"hami": (hami.DEVICE_PLUGIN, "HAMi's plugin"),
               "volcano": (volcano.DEVICE_PLUGIN, "Volcano's vGPU device plugin")}  # fmt: skip
    for mode, (daemonset, who) in plugins.items():
        if configured.gpu_allocation == mode:
            why = f"is set to {mode}"
        elif get_daemonset(nodes.cluster, configured.namespace, daemonset) is not None:
            why = f"is {mode} on the cluster ({who} runs)"
        else:
            continue
        raise BadInput(
            f"gpustack mig: gpustack_k8s_gpu_allocation {why}: {who} splits whole GPUs and "
            "runs without MIG, so no node's GPUs may be partitioned under it",
            "switch the cluster to gpustack_k8s_gpu_allocation=device-plugin or dra with "
            "`gpustack install INVENTORY --kubeconfig K -e ...` first (docs/sharing.md)",
        )
    if nodes.dra:  # each MIG device is published with its profile, whatever the strategy says
        return MigKubernetesBackend(nodes), "mixed"
    strategy = deployed_strategy(nodes.cluster, configured.namespace) or configured.mig_strategy
    return MigKubernetesBackend(nodes), strategy
