"""Pausing a node's GPU clients while its GPUs change (a driver reload, a MIG layout).

A GPU client is a DaemonSet pod that holds the node's GPUs open: the device plugin (and its MPS
control daemon), GPU Feature Discovery, dcgm-exporter, DCGM, NVSM, and NVIDIA's DRA kubelet
plugin. While one runs, `rmmod nvidia` fails ("Module nvidia is in use") and a MIG change
cannot reset the GPUs. NVIDIA stops them through their DaemonSets' nodeSelector labels
`nvidia.com/gpu.deploy.<component>`: a label that is `true` becomes `paused-for-<reason>`, the
DaemonSet controller deletes the node's pods, they are waited for, and the labels are set back
afterwards; so does gpustack:

- driver reloads: NVIDIA/k8s-driver-manager@bd62ca7d cmd/driver-manager/main.go
  (`evictAllGPUOperatorComponents`, `waitForPodsToTerminate`, `evictKubeletPlugin`,
  `rescheduleGPUOperatorComponents`, the last also run by `cleanupOnFailure`): value
  `paused-for-driver-upgrade`;
- MIG changes: NVIDIA/mig-parted@bd7160f4 deployments/container/reconfigure-mig.sh: value
  `paused-for-mig-change`.

DRA's kubelet plugin is paused last, once the other clients are gone: it unprepares the claims
of the pods that hold them, so it must outlive them (the driver manager's `evictKubeletPlugin`).
mig-manager's script does not pause it; gpustack does, as the plugin holds the GPUs too.

Differences from upstream: a label forced to `false` or absent is left alone, and the value
found is recorded in an annotation and restored from it (upstream sets a paused label back to
`true`), so a node that had no operand before has none after, and a run interrupted between
pause and resume is resumed from the annotation.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpustack.upgrade.backend import StepFailed, StepOptions
from gpustack.upgrade.executors import Clock

DEPLOY_PREFIX = "nvidia.com/gpu.deploy."
# Paused together, in the first step; then DRA_PLUGIN_LABEL on its own.
CLIENT_LABELS = tuple(
    DEPLOY_PREFIX + c
    for c in (
        "device-plugin",
        "hami-device-plugin",  # gpustack_k8s_gpu_allocation=hami: HAMi's plugin holds the GPUs too
        "volcano-device-plugin",  # gpustack_k8s_gpu_allocation=volcano: so does Volcano's vGPU one
        "gpu-feature-discovery",
        "dcgm-exporter",
        "dcgm",
        "nvsm",
    )
)
DRA_PLUGIN_LABEL = DEPLOY_PREFIX + "dra-driver"
STAGES = (CLIENT_LABELS, (DRA_PLUGIN_LABEL,))
PAUSED_PREFIX = "paused-for-"


def paused_values(labels: Mapping[str, str]) -> dict[str, str]:
    """Pure: {label: value found} of the client labels to pause: present, not forced to
    `false`, not already paused (by this reason or another)."""
    return {
        k: labels[k]
        for stage in STAGES
        for k in stage
        if k in labels and labels[k] != "false" and not labels[k].startswith(PAUSED_PREFIX)
    }


def paused_clients(labels: Mapping[str, str]) -> dict[str, str]:
    """Pure: {component: why} for the node's client labels that are paused now (`status`)."""
    return {
        k.removeprefix(DEPLOY_PREFIX): v.removeprefix(PAUSED_PREFIX)
        for k, v in labels.items()
        if k.startswith(DEPLOY_PREFIX) and v.startswith(PAUSED_PREFIX)
    }


class ClientPause:
    """Pause and resume the GPU clients of a node; `nodes` is the upgrade's KubernetesBackend
    (node names, reads and patches), `paused` the label value, `annotation` the record."""

    def __init__(self, nodes, paused: str, annotation: str):
        self.nodes, self.paused, self.annotation = nodes, paused, annotation

    def _meta(self, host: str) -> dict[str, Any]:
        return self.nodes.read_node(host).get("metadata") or {}

    def pause(self, host: str, clock: Clock, opts: StepOptions) -> str:
        meta = self._meta(host)
        labels = meta.get("labels") or {}
        recorded = json.loads((meta.get("annotations") or {}).get(self.annotation) or "{}")
        found = {**paused_values(labels), **recorded}  # a resumed run: first wins
        annotations = {self.annotation: json.dumps(found, sort_keys=True)}
        for stage in STAGES:
            keys = {k for k in stage if k in found}
            if keys or annotations:
                patch = {"metadata": {"labels": dict.fromkeys(keys, self.paused)}}
                if annotations:  # the record goes with the first change
                    patch["metadata"]["annotations"] = annotations
                    annotations = {}
                self.nodes.patch_node(host, patch, "pause GPU clients on")
            self._wait_gone(host, keys, clock, opts)
        names = ", ".join(k.removeprefix(DEPLOY_PREFIX) for k in sorted(found)) or "none"
        return f"paused GPU clients ({names})"

    def _wait_gone(self, host: str, keys: set[str], clock: Clock, opts: StepOptions) -> None:
        start = clock.now()
        while keys:
            left = self._client_pods(host, keys)
            if not left:
                return
            if clock.now() - start >= opts.pod_deletion_timeout:
                raise StepFailed(
                    f"GPU clients did not stop within {opts.pod_deletion_timeout:g} s: "
                    + ", ".join(left[:5])
                )
            clock.sleep(opts.poll)

    def _client_pods(self, host: str, keys: set[str]) -> list[str]:
        """The node's pods (terminating ones too) selected by one of the paused labels."""
        return [
            f"{p['metadata'].get('namespace')}/{p['metadata']['name']}"
            for p in self.nodes.pods_on(host)
            if set((p.get("spec") or {}).get("nodeSelector") or {}) & keys
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]

    def resume(self, host: str) -> str:
        """Restore the client labels this or an earlier run paused ('' when none were)."""
        meta = self._meta(host)
        labels = meta.get("labels") or {}
        annotations = meta.get("annotations") or {}
        if self.annotation not in annotations:
            return ""
        recorded = json.loads(annotations[self.annotation] or "{}")
        back = {k: v for k, v in recorded.items() if labels.get(k) == self.paused}
        patch = {"metadata": {"labels": back, "annotations": {self.annotation: None}}}
        self.nodes.patch_node(host, patch, "resume GPU clients on")
        return f"resumed GPU clients ({len(back)})"
