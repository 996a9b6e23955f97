"""Kubernetes manifests from one typed configuration, rendered from Jinja2 templates.

Pure functions: nothing here talks to a cluster (only `gpustack/k8s/cluster/` imports the
kubernetes client). `render()` gives the ordered apply list; `gpustack manifests` writes
the same objects as YAML files; the cluster code applies them.
"""

from __future__ import annotations

import functools
import hashlib
import re
from pathlib import Path
from typing import Any

import jinja2
import yaml

from gpustack import paths
from gpustack.ansible.inventory import Inventory
from gpustack.errors import BadInput
from gpustack.k8s import hami, volcano
from gpustack.k8s.manifests_config import IMAGES, VAR_PREFIX, ClusterConfig, split_registry

__all__ = [
    "COMMON_LABELS",
    "IMAGES",
    "MANAGED_LABEL",
    "VAR_PREFIX",
    "ClusterConfig",
    "config_from_inventory",
    "default_counters",
    "manifest_filename",
    "node_labels",
    "render",
    "render_dra_verify_pod",
    "render_verify_claim_template",
    "render_verify_pod",
    "render_verify_volcano_job",
    "split_registry",
    "write_manifests",
]

COMMON_LABELS = {
    "app.kubernetes.io/managed-by": "gpustack",
    "app.kubernetes.io/part-of": "gpustack",
}
MANAGED_LABEL = "app.kubernetes.io/managed-by"
VERIFY_LABEL = "gpustack.io/verify"
METRICS_PORT = 9400
MPS_ROOT = "/run/nvidia/mps"
POD_SECURITY_LABELS = {
    f"pod-security.kubernetes.io/{mode}": "privileged" for mode in ("enforce", "audit", "warn")
}
GPU_TOLERATIONS = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
# the taint a cordoned node has for the scheduler (DaemonSet pods get this toleration by default)
UNSCHEDULABLE_TOLERATIONS = [
    {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
]

# Operands gated per node by `nvidia.com/gpu.deploy.<operand>` (GPU Operator's labels);
# dra-driver is gpustack's label for NVIDIA's DRA kubelet plugin (gpu_allocation=dra),
# hami-device-plugin for HAMi's device plugin (gpu_allocation=hami), volcano-device-plugin for
# Volcano's vGPU device plugin (gpu_allocation=volcano).
OPERANDS = (
    "device-plugin",
    "dra-driver",
    "hami-device-plugin",
    "volcano-device-plugin",
    "gpu-feature-discovery",
    "dcgm-exporter",
)
PRESENT_LABEL = "nvidia.com/gpu.present"
DEPLOY_LABEL = "nvidia.com/gpu.deploy.{}"
ALL_OPERANDS_LABEL = "nvidia.com/gpu.deploy.operands"
MPS_CAPABLE_LABEL = "nvidia.com/mps.capable"


@functools.cache
def _environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(paths.templates_dir())),
        undefined=jinja2.StrictUndefined,
        autoescape=False,  # YAML, not HTML; values go through `tojson`
        keep_trailing_newline=True,
    )


def _render_template(template: str, **context: Any) -> dict[str, Any]:
    text = _environment().get_template(template).render(**context)
    obj = yaml.safe_load(text)
    if not isinstance(obj, dict):  # a broken template is a bug, not user input
        raise RuntimeError(f"template {template} did not render one object")
    return obj


def default_counters() -> str:
    """The dcgm-exporter counters CSV shipped with gpustack."""
    return (paths.templates_dir() / "dcgm-exporter" / "default-counters.csv").read_text(
        encoding="utf-8"
    )


def plugin_config(config: ClusterConfig) -> dict[str, Any]:
    """The device plugin / GFD config file (`version: v1`) for this configuration."""
    document: dict[str, Any] = {
        "version": "v1",
        "flags": {
            "migStrategy": config.mig_strategy,
            "failOnInitError": config.fail_on_init_error,
        },
    }
    if config.sharing != "none":
        replicated = {
            "renameByDefault": config.rename_by_default,
            "resources": [{"name": "nvidia.com/gpu", "replicas": config.gpus_per_device}],
        }
        key = "timeSlicing" if config.sharing == "time-slicing" else "mps"
        document["sharing"] = {key: replicated}
    return document


def _labels(name: str, component: str) -> tuple[dict[str, str], dict[str, str]]:
    """(object labels, selector labels). Selectors stay small: they cannot change later."""
    selector = {"app.kubernetes.io/name": name, "app.kubernetes.io/instance": "gpustack"}
    return {**COMMON_LABELS, **selector, "app.kubernetes.io/component": component}, selector


def _hash(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:16]


def _security_context(config: ClusterConfig) -> dict[str, Any]:
    # MIG device monitoring needs SYS_ADMIN; otherwise the plugin needs no privileges.
    if config.mig_strategy != "none":
        return {"capabilities": {"add": ["SYS_ADMIN"]}}
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}


def _plugin_security_context(config: ClusterConfig) -> dict[str, Any]:
    # As the chart's compatWithCPUManager: passing device specs to the kubelet needs the
    # plugin to see every /dev/nvidia* node (nvidia-device-plugin.securityContext helper).
    if config.compat_with_cpu_manager:
        return {"privileged": True}
    return _security_context(config)


def render(
    config: ClusterConfig, *, servicemonitor: bool = False, nfd_api: bool = False
) -> list[dict[str, Any]]:
    """Every object gpustack applies, in apply order (namespace first).

    `servicemonitor`: include dcgm-exporter's ServiceMonitor; the cluster code passes True
    only when the servicemonitors.monitoring.coreos.com CRD exists.
    `nfd_api`: whether the cluster serves NFD's NodeFeature API (decides GFD's mode when
    `gfd_mode` is auto; without a cluster, as for `gpustack manifests`, it is False).
    """
    objects = [
        _render_template(
            "namespace.yaml.j2", config=config, labels={**COMMON_LABELS, **POD_SECURITY_LABELS}
        ),
    ]
    if config.runtime_class:  # empty: nvidia is the nodes' default runtime, no class needed
        objects.append(
            _render_template("runtimeclass.yaml.j2", config=config, labels=dict(COMMON_LABELS))
        )
    plugin_text = yaml.safe_dump(plugin_config(config), sort_keys=False)
    plugin_hash = _hash(plugin_text)
    labels, _ = _labels("nvidia-device-plugin", "device-plugin")
    objects.append(
        _render_template(
            "device-plugin/configmap.yaml.j2",
            config=config,
            labels=labels,
            plugin_config_text=plugin_text,
        )
    )
    shared = {
        "config": config,
        "config_hash": plugin_hash,
        "tolerations": GPU_TOLERATIONS,
        "mps_root": MPS_ROOT,
        "security_context": _security_context(config),
        "plugin_security_context": _plugin_security_context(config),
    }

    def daemonset(template: str, name: str, component: str) -> dict[str, Any]:
        labels, selector = _labels(name, component)
        return _render_template(
            template, labels=labels, selector=selector, pod_labels={**labels}, **shared
        )

    if config.dra:
        objects.extend(_dra_driver(config))
    elif config.hami:  # HAMi's plugin replaces NVIDIA's (docs/sharing.md)
        objects.extend(
            hami.objects(
                config,
                _render_template,
                _environment(),
                _labels,
                _hash,
                GPU_TOLERATIONS,
                DEPLOY_LABEL.format("hami-device-plugin"),
            )
        )
    elif config.volcano:  # Volcano's vGPU plugin replaces NVIDIA's (docs/sharing.md)
        objects.extend(
            volcano.objects(
                config,
                _render_template,
                _labels,
                _hash,
                GPU_TOLERATIONS,
                DEPLOY_LABEL.format("volcano-device-plugin"),
            )
        )
    else:
        objects.append(
            daemonset("device-plugin/daemonset.yaml.j2", "nvidia-device-plugin", "device-plugin")
        )
    if config.sharing == "mps":
        objects.append(
            daemonset(
                "device-plugin/mps-control-daemon.yaml.j2",
                "nvidia-mps-control-daemon",
                "mps-control-daemon",
            )
        )
    if config.gfd_enabled:
        objects.extend(_gfd(config, shared, nfd_api))
    if config.dcgm_exporter_enabled:
        objects.extend(_dcgm_exporter(config, servicemonitor))
    return objects


GFD_NAME = "gpu-feature-discovery"

# NVIDIA's DRA driver for GPUs (docs/dra.md): driver name and DeviceClasses from
# NVIDIA/k8s-dra-driver-gpu v25.12.0 @0882da8720c28763137e0987778ec476ec4cf8df
# (cmd/gpu-kubelet-plugin/main.go DriverName,
# deployments/helm/nvidia-dra-driver-gpu/templates/deviceclass-*.yaml).
DRA_DRIVER = "gpu.nvidia.com"
DRA_NAME = "nvidia-dra-driver-gpu-kubelet-plugin"
DRA_RBAC_NAME = "gpustack-nvidia-dra-driver-gpu-kubeletplugin"  # cluster-scoped: prefixed
DRA_SERVICE_ACCOUNT = "nvidia-dra-driver-gpu-kubeletplugin"
DRA_GPU_CLASS = "gpu.nvidia.com"
DRA_MIG_CLASS = "mig.nvidia.com"
DRA_HEALTHCHECK_PORT = 51516


def _dra_driver(config: ClusterConfig) -> list[dict[str, Any]]:
    """DeviceClasses, ServiceAccount, ClusterRole(+Binding) and the GPU kubelet plugin."""
    labels, selector = _labels("nvidia-dra-driver-gpu", "kubelet-plugin")
    classes = [
        _render_template(
            "dra-driver/deviceclass.yaml.j2",
            name=name,
            labels=dict(COMMON_LABELS),
            driver=DRA_DRIVER,
            device_type=device_type,
            extended_resource=extended,
        )
        for name, device_type, extended in (
            (DRA_GPU_CLASS, "gpu", "nvidia.com/gpu"),
            (DRA_MIG_CLASS, "mig", None),
        )
    ]
    common = {"config": config, "labels": labels}
    rbac = [
        _render_template("dra-driver/serviceaccount.yaml.j2", name=DRA_SERVICE_ACCOUNT, **common),
        _render_template("dra-driver/clusterrole.yaml.j2", name=DRA_RBAC_NAME, **common),
        _render_template(
            "dra-driver/clusterrolebinding.yaml.j2",
            name=DRA_RBAC_NAME,
            service_account=DRA_SERVICE_ACCOUNT,
            **common,
        ),
    ]
    daemonset = _render_template(
        "dra-driver/daemonset.yaml.j2",
        name=DRA_NAME,
        selector=selector,
        pod_labels={**labels},
        service_account=DRA_SERVICE_ACCOUNT,
        tolerations=GPU_TOLERATIONS,
        registrar_dir=config.kubelet_path("plugins_registry"),
        plugins_dir=config.kubelet_path("plugins"),
        healthcheck_port=DRA_HEALTHCHECK_PORT,
        **common,
    )
    return [*classes, *rbac, daemonset]


def _gfd(config: ClusterConfig, shared: dict[str, Any], nfd_api: bool) -> list[dict[str, Any]]:
    """GFD's ServiceAccount, Role, RoleBinding and DaemonSet (design: docs/kubernetes.md).

    The RBAC objects are rendered in both modes so the object set does not depend on the
    cluster; in feature-file mode the pod does not mount the token.
    """
    labels, selector = _labels(GFD_NAME, GFD_NAME)
    rbac = [
        _render_template(
            f"gpu-feature-discovery/{name}.yaml.j2", config=config, name=GFD_NAME, labels=labels
        )
        for name in ("serviceaccount", "role", "rolebinding")
    ]
    daemonset = _render_template(
        "gpu-feature-discovery/daemonset.yaml.j2",
        labels=labels,
        selector=selector,
        pod_labels={**labels},
        service_account=GFD_NAME,
        node_feature_api=config.gfd_node_feature_api(nfd_api),
        **shared,
    )
    return [*rbac, daemonset]


def _dcgm_exporter(config: ClusterConfig, servicemonitor: bool) -> list[dict[str, Any]]:
    counters = default_counters()
    labels, selector = _labels("dcgm-exporter", "dcgm-exporter")
    common = {"config": config, "labels": labels, "metrics_port": METRICS_PORT}
    objects = [
        _render_template("dcgm-exporter/configmap.yaml.j2", counters=counters, **common),
        _render_template(
            "dcgm-exporter/daemonset.yaml.j2",
            selector=selector,
            pod_labels={**labels},
            tolerations=GPU_TOLERATIONS,
            config_hash=_hash(counters),
            **common,
        ),
        _render_template("dcgm-exporter/service.yaml.j2", selector=selector, **common),
    ]
    if servicemonitor:
        objects.append(
            _render_template(
                "dcgm-exporter/servicemonitor.yaml.j2",
                service_selector=selector,
                monitor_labels={**config.servicemonitor_labels, **labels},
                **common,
            )
        )
    return objects


_POD_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


# Under HAMi, and in the pods of Volcano's share check (its vGPU plugin loads the same HAMi-core),
# a verification pod reads the GPU's memory as the container sees it: HAMi-core answers NVML's
# memory query with the pod's limit as the total (Project-HAMi/HAMi-core
# src/nvml/hook.c@8f3a89c67b037d8fdfe6c4cd4d8c4f0cd6504811, _nvmlDeviceGetMemoryInfo).
MEMORY_QUERY_COMMAND = ("nvidia-smi", "--query-gpu=name,uuid,memory.total", "--format=csv,noheader")


def render_verify_pod(
    config: ClusterConfig,
    *,
    node_name: str,
    gpus: int,
    name: str,
    kind: str = "nvidia-smi",
    resource: str | None = None,
) -> dict[str, Any]:
    """A pod pinned to `node_name` that requests `gpus` GPUs and runs the check `kind`.

    kind "nvidia-smi" runs `nvidia-smi -L` in the verify image (under HAMi: the pod also asks
    for gpustack_k8s_hami_verify_memory MiB and lists each GPU's name, UUID and total memory);
    "vectoradd" runs the CUDA vectorAdd sample image (gpustack_k8s_vector_add_image) with its
    own entrypoint.
    `resource` overrides the extended resource (default: config.resource_name).
    """
    limits = {resource or config.resource_name: gpus}
    if kind == "nvidia-smi" and config.hami:  # the GPU with its memory, as HAMi-core limits it
        image, command = config.image("verify"), list(MEMORY_QUERY_COMMAND)
        limits[hami.MEMORY_RESOURCE] = config.hami_verify_memory
    elif kind == "nvidia-smi":
        image, command = config.image("verify"), ["nvidia-smi", "-L"]
    elif kind == "vectoradd":
        image, command = config.image("vector_add"), None
    else:
        raise ValueError(f"unknown verify pod kind {kind!r}")
    if len(name) > 253 or not _POD_NAME.match(name):
        raise ValueError(f"{name!r} is not a valid pod name")
    if gpus < 1:
        raise ValueError("a verify pod requests at least one GPU")
    return _render_template(
        "verify/pod.yaml.j2",
        config=config,
        name=name,
        node_name=node_name,
        labels={**COMMON_LABELS, VERIFY_LABEL: "true", "gpustack.io/verify-kind": kind},
        # through HAMi's scheduler, the pod must tolerate what nodeName would have bypassed: a
        # node an upgrade cordoned before validating it
        tolerations=GPU_TOLERATIONS
        + (UNSCHEDULABLE_TOLERATIONS if config.hami or config.volcano else []),
        image=image,
        command=command,
        limits=limits,
        hami_scheduler=hami.SCHEDULER_NAME,
    )


def render_verify_volcano_job(
    config: ClusterConfig, *, node_name: str, name: str
) -> dict[str, Any]:
    """gpustack_k8s_gpu_allocation=volcano: a Volcano Job whose two pods share one GPU of
    `node_name` by memory (each volcano.sh/vgpu-number 1, volcano.sh/vgpu-memory
    gpustack_k8s_volcano_verify_memory) and list each GPU's name, UUID and total memory as
    the container sees it, through Volcano's scheduler."""
    if not config.volcano:
        raise ValueError("a Volcano verification Job needs gpustack_k8s_gpu_allocation=volcano")
    if len(name) > 63 or not _POD_NAME.match(name) or "." in name:
        raise ValueError(f"{name!r} is not a valid Volcano Job name")
    return _render_template(
        "verify/volcano-job.yaml.j2",
        config=config,
        name=name,
        node_name=node_name,
        labels={**COMMON_LABELS, VERIFY_LABEL: "true", "gpustack.io/verify-kind": "volcano-share"},
        tolerations=GPU_TOLERATIONS + UNSCHEDULABLE_TOLERATIONS,
        image=config.image("verify"),
        command=list(MEMORY_QUERY_COMMAND),
        memory=config.volcano_verify_memory,
    )


def render_verify_claim_template(
    config: ClusterConfig, *, name: str, device_class: str = DRA_GPU_CLASS
) -> dict[str, Any]:
    """The ResourceClaimTemplate DRA verification pods use: one device of `device_class`
    (gpu.nvidia.com, or mig.nvidia.com on a node that publishes only MIG devices)."""
    if len(name) > 253 or not _POD_NAME.match(name):
        raise ValueError(f"{name!r} is not a valid object name")
    return _render_template(
        "verify/resourceclaimtemplate.yaml.j2",
        config=config,
        name=name,
        labels={**COMMON_LABELS, VERIFY_LABEL: "true"},
        device_class=device_class,
    )


def render_dra_verify_pod(
    config: ClusterConfig, *, node_name: str, name: str, claim_template: str, cordoned=False
) -> dict[str, Any]:
    """A pod that gets one GPU from a ResourceClaimTemplate and runs `nvidia-smi -L`.

    Unlike the device plugin pod it is NOT bound with spec.nodeName: a pod that bypasses the
    scheduler never gets its claim allocated (the scheduler allocates claims), so it is pinned
    with required node affinity on metadata.name instead. No runtimeClassName: the DRA driver
    injects the device through CDI, and the nvidia runtime would also honour the CUDA image's
    NVIDIA_VISIBLE_DEVICES=all and show every GPU (as upstream's demo pods, which set none).
    `cordoned`: the node is cordoned (an upgrade validates it before uncordoning it), so the pod
    tolerates the taint the scheduler gives unschedulable nodes, as DaemonSet pods do.
    """
    if len(name) > 253 or not _POD_NAME.match(name):
        raise ValueError(f"{name!r} is not a valid pod name")
    return _render_template(
        "verify/dra-pod.yaml.j2",
        config=config,
        name=name,
        node_name=node_name,
        labels={**COMMON_LABELS, VERIFY_LABEL: "true", "gpustack.io/verify-kind": "nvidia-smi"},
        tolerations=GPU_TOLERATIONS + (UNSCHEDULABLE_TOLERATIONS if cordoned else []),
        image=config.image("verify"),
        command=["nvidia-smi", "-L"],
        claim_template=claim_template,
    )


def node_labels(
    facts: dict[str, Any], existing: dict[str, str], config: ClusterConfig
) -> dict[str, str | None]:
    """The label patch for one node, from its `gpustack_preflight` facts.

    Only keys that change are returned; a value of None removes the label (merge patch).
    A label the user set to "false" is never overwritten, one paused by `upgrade` or `mig`
    (`paused-for-...`) is left to the run that paused it, and
    `nvidia.com/gpu.deploy.operands=false` keeps every operand off the node.
    GPU nodes get `gpu.present=true` and a `gpu.deploy.<operand>=true` for every enabled
    operand (plus `nvidia.com/mps.capable=true` while MPS is on); `device-plugin` or
    `dra-driver` by gpustack_k8s_gpu_allocation. The "true" of an operand that is off (the
    other allocator, GFD or dcgm-exporter turned off, mps.capable without MPS) is removed.
    Nodes without GPUs lose the "true" labels gpustack would have set, so no GPU DaemonSet
    lands there.
    """
    gpus = facts.get("gpus") or {}
    count = gpus.get("count", len(gpus.get("devices") or [])) if isinstance(gpus, dict) else 0
    wanted: dict[str, str | None] = {}
    if count > 0:
        wanted[PRESENT_LABEL] = "true"
        enabled = {
            "device-plugin": config.gpu_allocation == "device-plugin",
            "dra-driver": config.dra,
            "hami-device-plugin": config.hami,
            "volcano-device-plugin": config.volcano,
            "gpu-feature-discovery": config.gfd_enabled,
            "dcgm-exporter": config.dcgm_exporter_enabled,
        }
        if existing.get(ALL_OPERANDS_LABEL) != "false":
            # An operand turned off, and the other GPU allocator (one per node), lose their
            # "true": their DaemonSets are deleted too (apply.prune).
            for operand in OPERANDS:
                key = DEPLOY_LABEL.format(operand)
                if enabled[operand]:
                    wanted[key] = "true"
                elif existing.get(key) == "true":
                    wanted[key] = None
            if config.sharing == "mps":
                wanted[MPS_CAPABLE_LABEL] = "true"
            elif existing.get(MPS_CAPABLE_LABEL) == "true":
                wanted[MPS_CAPABLE_LABEL] = None
            _hami_node_label(wanted, existing, config.hami)
    else:
        for key in (PRESENT_LABEL, MPS_CAPABLE_LABEL, *(DEPLOY_LABEL.format(o) for o in OPERANDS)):
            if existing.get(key) == "true":
                wanted[key] = None
        _hami_node_label(wanted, existing, False)
    return {
        key: value
        for key, value in wanted.items()
        if existing.get(key) != "false"
        and existing.get(key) != value
        and not str(existing.get(key, "")).startswith("paused-for-")  # upgrade or mig resumes it
    }


def _hami_node_label(wanted: dict[str, str | None], existing: dict[str, str], on: bool) -> None:
    """HAMi's chart selects nodes by `gpu=on`: set with its plugin; removed again only where
    gpustack's own hami-device-plugin label says gpustack put it there."""
    key, value = hami.NODE_LABEL
    if on:
        wanted[key] = value
    elif (
        existing.get(key) == value
        and existing.get(DEPLOY_LABEL.format("hami-device-plugin")) == "true"
    ):
        wanted[key] = None


def config_from_inventory(
    inventory: Inventory | dict[str, dict[str, Any]], extravars: dict[str, Any]
) -> ClusterConfig:
    """One ClusterConfig for the cluster: gpustack_k8s_* from the inventory, `-e` wins.

    Pass the `Inventory` itself: its variables are then resolved as a play sees them
    (`[all:vars]`, group_vars/, host_vars/). A plain {host: vars} mapping is taken as is
    (`Inventory.hostvars` holds host variables only, not group variables).
    The settings are cluster-wide, so target hosts must agree on every one they set.
    """
    if isinstance(inventory, Inventory):
        from gpustack.k8s.manifests_vars import inventory_k8s_vars

        hostvars = inventory_k8s_vars(
            inventory, also=(RUNTIME_NAME_VAR, *MIG_LAYOUT_VARS), extravars=extravars
        )
    else:
        hostvars = inventory
    merged: dict[str, Any] = {}
    source: dict[str, str] = {}
    for host, variables in hostvars.items():
        for key, value in variables.items():
            if not key.startswith(VAR_PREFIX) or key in extravars:
                continue
            if key in merged and merged[key] != value:
                raise BadInput(
                    f"{key} differs between hosts ({source[key]}: {merged[key]!r}, "
                    f"{host}: {value!r})",
                    "set gpustack_k8s_* once for the cluster (group_vars/all) or with -e",
                )
            merged.setdefault(key, value)
            source.setdefault(key, host)
    merged.update({k: v for k, v in extravars.items() if k.startswith(VAR_PREFIX)})
    config = ClusterConfig.from_vars(merged)
    _check_runtime_handler(config, hostvars, extravars)
    _check_sharing_without_mig(config, hostvars, extravars)
    return config


RUNTIME_NAME_VAR = "container_runtime_nvidia_name"
# the nvidia_mig role's layout inputs (roles/nvidia_mig/defaults/main.yml): set, the host's GPUs
# are partitioned into MIG devices
MIG_LAYOUT_VARS = ("nvidia_mig_config", "nvidia_mig_config_file")


# gpu_allocation modes whose plugin splits whole GPUs without MIG: who, for the refusal
_WITHOUT_MIG = {"hami": "HAMi", "volcano": "Volcano's vGPU device plugin"}


def _check_sharing_without_mig(
    config: ClusterConfig, hostvars: dict[str, dict[str, Any]], extravars: dict[str, Any]
) -> None:
    """HAMi's plugin and Volcano's vGPU plugin run with migStrategy none: a host with a MIG
    layout would offer them GPUs that are partitioned underneath. Refused before any host or
    object is touched."""
    who = _WITHOUT_MIG.get(config.gpu_allocation)
    if who is None:
        return
    mode = config.gpu_allocation
    for host, variables in hostvars.items():
        for name in MIG_LAYOUT_VARS:
            value = extravars.get(name, variables.get(name))
            if value not in (None, "", {}, []):
                raise BadInput(
                    f"{name} is set on {host} with gpustack_k8s_gpu_allocation={mode}: {who} "
                    "splits whole GPUs and is deployed without MIG",
                    f"leave {name} empty for {mode} hosts, or use gpustack_k8s_gpu_allocation="
                    "device-plugin or dra with MIG (docs/sharing.md)",
                )


def _check_runtime_handler(
    config: ClusterConfig, hostvars: dict[str, dict[str, Any]], extravars: dict[str, Any]
) -> None:
    """The RuntimeClass gpustack creates names the nvidia runtime the container_runtime role
    registers on each host; a different name there leaves every GPU pod without a sandbox."""
    if not config.runtime_class:
        return
    for host, variables in hostvars.items():
        name = extravars.get(RUNTIME_NAME_VAR, variables.get(RUNTIME_NAME_VAR, "nvidia"))
        if not isinstance(name, str) or "{{" in name or "{%" in name:
            continue  # templated: only the play knows it
        if name != config.runtime_class:
            raise BadInput(
                f"gpustack_k8s_runtime_class={config.runtime_class} but {RUNTIME_NAME_VAR}="
                f"{name} on {host}: GPU pods would ask for a runtime handler the host lacks",
                f"give both the same name (gpustack_k8s_runtime_class={name}), or set "
                'gpustack_k8s_runtime_class="" where nvidia is the default runtime',
            )


# -- writing manifests as files -----------------------------------------------------------

HEADER = "# Generated by `gpustack manifests` ({what}). Re-run it to update; do not edit.\n"
_HEADER_PREFIX = "# Generated by `gpustack manifests`"
_KIND_RANK = {
    "Namespace": 0,
    "RuntimeClass": 10,
    "ServiceAccount": 15,
    "Role": 16,
    "RoleBinding": 17,
    "ClusterRole": 18,
    "ClusterRoleBinding": 19,
    "DeviceClass": 12,
    "ConfigMap": 20,
    "DaemonSet": 30,
    "Deployment": 35,
    "Service": 40,
    "ServiceMonitor": 50,
    "Pod": 60,
}
MANIFEST_NAME = re.compile(r"^[0-9]{2}-[a-z0-9.-]+\.yaml$")


def manifest_filename(obj: dict[str, Any]) -> str:
    """`00-namespace.yaml`, `10-runtimeclass.yaml`, `30-daemonset-nvidia-device-plugin.yaml`.

    The two-digit prefix follows apply order (by kind), so `kubectl apply -f DIR`, which
    reads files in name order, creates the namespace before what lives in it.
    """
    kind = obj["kind"]
    rank = _KIND_RANK.get(kind, 90)
    if kind in ("Namespace", "RuntimeClass"):
        return f"{rank:02d}-{kind.lower()}.yaml"
    return f"{rank:02d}-{kind.lower()}-{obj['metadata']['name']}.yaml"


def _is_previous_manifest(path: Path) -> bool:
    if not path.is_file() or path.is_symlink() or not MANIFEST_NAME.match(path.name):
        return False
    try:
        with path.open(encoding="utf-8") as handle:
            return handle.readline().startswith(_HEADER_PREFIX)
    except (OSError, UnicodeDecodeError):
        return False


def check_output_dir(output_dir: Path) -> list[Path]:
    """Raise BadInput unless gpustack may write here; return the stale manifests to remove.

    Rule: the directory may be missing, empty, or hold only files a previous
    `gpustack manifests` wrote (NN-name.yaml starting with gpustack's header line).
    Hidden entries (.gitkeep, .git) are ignored and left alone. Anything else means the
    directory is someone else's, and nothing is written.
    """
    if output_dir.exists() and not output_dir.is_dir():
        raise BadInput(f"--output-dir {output_dir} is not a directory", "give a directory path")
    if not output_dir.exists():
        return []
    previous, foreign = [], []
    for entry in sorted(output_dir.iterdir()):
        if entry.name.startswith("."):
            continue
        (previous if _is_previous_manifest(entry) else foreign).append(entry)
    if foreign:
        names = ", ".join(p.name for p in foreign[:3]) + (" …" if len(foreign) > 3 else "")
        raise BadInput(
            f"--output-dir {output_dir} holds files gpustack did not write ({names})",
            "use an empty or new directory; gpustack only replaces its own NN-*.yaml manifests",
        )
    return previous


class _ManifestDumper(yaml.SafeDumper):
    """Multi-line strings (config files inside ConfigMaps) as readable `|` blocks."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    if "\n" in value and not any(line != line.rstrip() for line in value.splitlines()):
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", value)


_ManifestDumper.add_representer(str, _represent_str)


def to_yaml(obj: dict[str, Any]) -> str:
    """One manifest as YAML, keys in template order."""
    return yaml.dump(
        obj, Dumper=_ManifestDumper, sort_keys=False, default_flow_style=False, width=100
    )


def write_manifests(objects: list[dict[str, Any]], output_dir: Path) -> list[Path]:
    """Write one YAML file per object; replace (only) earlier gpustack manifests there."""
    output_dir = Path(output_dir)
    stale = check_output_dir(output_dir)
    documents: dict[str, str] = {}
    for obj in objects:
        name = manifest_filename(obj)
        if name in documents:  # two objects of one kind and name: a rendering bug
            raise RuntimeError(f"two manifests would be written to {name}")
        what = f"{obj['kind']} {obj['metadata']['name']}"
        documents[name] = HEADER.format(what=what) + to_yaml(obj)
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
        for path in stale:
            if path.name not in documents:
                path.unlink()
        written = []
        for name, text in documents.items():
            path = output_dir / name
            path.write_text(text, encoding="utf-8")
            written.append(path)
    except OSError as exc:
        raise BadInput(
            f"cannot write manifests to {output_dir}: {exc.strerror or exc}",
            "choose a writable --output-dir",
        ) from None
    return written
