"""Volcano's vGPU device plugin (gpustack_k8s_gpu_allocation=volcano), as its static manifest
deploys it at release v1.12.0 (Project-HAMi/volcano-vgpu-device-plugin
volcano-vgpu-device-plugin.yml@afefcc2ff7944e9e68275e83217cf5eb7fb4a585) for containerd nodes,
and what gpustack checks of the user's Volcano scheduler (docs/sharing.md).

Volcano itself (scheduler, controllers, admission, CRDs) is the user's, installed with its own
chart: gpustack reads its scheduler's ConfigMap and refuses when the deviceshare plugin does not
have deviceshare.VGPUEnable, never writes it.

Pure: the objects and the check; manifests.render() puts the objects in the apply list.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import yaml

from gpustack import paths
from gpustack.errors import BadInput
from gpustack.k8s.manifests_config import VAR_PREFIX, ClusterConfig

VOLCANO_VGPU_RELEASE = "v1.12.0"
VOLCANO_VGPU_COMMIT = "afefcc2ff7944e9e68275e83217cf5eb7fb4a585"
# volcano-sh/volcano v1.15.1, where the deviceshare plugin and the scheduler ConfigMap were read
VOLCANO_RELEASE = "v1.15.1"
VOLCANO_COMMIT = "0a56ed331897f5455916a44d3075671376d731d6"

DEVICE_PLUGIN = "volcano-device-plugin"  # the manifest's DaemonSet and ServiceAccount
NODE_CONFIG = "volcano-vgpu-node-config"
# Read by name from kube-system by the plugin (then volcano-system) and by Volcano's scheduler
# (deviceshare.KnownGeometriesCMName/Namespace defaults): its place is fixed.
DEVICE_CONFIG = "volcano-vgpu-device-config"
DEVICE_CONFIG_NAMESPACE = "kube-system"
CLUSTER_PREFIX = "gpustack-"

# Extended resources the plugin registers (device-config.yaml resource*Name)
VGPU_NUMBER = "volcano.sh/vgpu-number"
VGPU_MEMORY = "volcano.sh/vgpu-memory"
VGPU_CORES = "volcano.sh/vgpu-cores"

# the manifest's node configuration, with its example node name swapped for one that matches no
# node (its aio-node67 entry would rescale that node's memory by 1.8): every node takes defaults
NODE_CONFIG_DOC = {
    "nodeconfig": [
        {
            "name": "your-node-name",
            "operatingmode": "hami-core",
            "devicememoryscaling": 1,
            "devicesplitcount": 10,
            "migstrategy": "none",
            "filterdevices": {"uuid": [], "index": []},
        }
    ]
}

# the manifest's ClusterRole volcano-device-plugin
_RULES = [
    {"apiGroups": [""], "resources": ["nodes"],
     "verbs": ["get", "list", "watch", "update", "patch"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
    {"apiGroups": [""], "resources": ["pods"],
     "verbs": ["get", "list", "update", "patch", "watch"]},
    {"apiGroups": [""], "resources": ["configmaps"],
     "verbs": ["get", "list", "watch", "create", "update"]},
]  # fmt: skip

# the manifest's tolerations (CriticalAddonsOnly, volcano.sh/gpu-memory), gpustack's added
_TOLERATIONS = [
    {"key": "CriticalAddonsOnly", "operator": "Exists"},
    {"key": "volcano.sh/gpu-memory", "operator": "Exists", "effect": "NoSchedule"},
]


def device_config(config: ClusterConfig) -> dict[str, Any]:
    """device-config.yaml: the manifest's, deviceSplitCount from gpustack's setting."""
    text = (paths.templates_dir() / "volcano" / "device-config.yaml").read_text(encoding="utf-8")
    document = yaml.safe_load(text)
    document["nvidia"]["deviceSplitCount"] = config.volcano_device_split_count
    return document


def objects(
    config: ClusterConfig,
    render_template: Callable[..., dict[str, Any]],
    labels_for: Callable[[str, str], tuple[dict[str, str], dict[str, str]]],
    hash_of: Callable[..., str],
    tolerations: list[dict[str, Any]],
    deploy_label: str,
) -> list[dict[str, Any]]:
    """ServiceAccount, RBAC, the two ConfigMaps and the device plugin DaemonSet."""
    labels, selector = labels_for(DEVICE_PLUGIN, "volcano-device-plugin")
    node_text = json.dumps(NODE_CONFIG_DOC, indent=2) + "\n"
    device_text = yaml.safe_dump(device_config(config), sort_keys=False)
    role = f"{CLUSTER_PREFIX}{DEVICE_PLUGIN}"

    def cm(name: str, namespace: str, key: str, text: str) -> dict[str, Any]:
        return render_template(
            "volcano/configmap.yaml.j2", name=name, namespace=namespace, key=key, text=text,
            labels=labels,
        )  # fmt: skip

    return [
        render_template(
            "hami/serviceaccount.yaml.j2", config=config, name=DEVICE_PLUGIN, labels=labels
        ),
        render_template("hami/clusterrole.yaml.j2", name=role, rules=_RULES, labels=labels),
        render_template(
            "hami/clusterrolebinding.yaml.j2",
            config=config,
            name=role,
            role=role,
            service_account=DEVICE_PLUGIN,
            labels=labels,
        ),
        cm(NODE_CONFIG, config.namespace, "config.json", node_text),
        cm(DEVICE_CONFIG, DEVICE_CONFIG_NAMESPACE, "device-config.yaml", device_text),
        render_template(
            "volcano/daemonset.yaml.j2",
            config=config,
            name=DEVICE_PLUGIN,
            labels=labels,
            selector=selector,
            pod_labels={**labels},
            config_hash=hash_of(node_text, device_text),
            service_account=DEVICE_PLUGIN,
            node_selector={deploy_label: "true"},
            tolerations=_TOLERATIONS + tolerations,
            node_config_map=NODE_CONFIG,
        ),
    ]


# ------------------------------------------------------------------ the user's Volcano scheduler

SCHEDULER_CONF_KEY = "volcano-scheduler.conf"  # the chart's scheduler ConfigMap key
_TRUE = {"1", "t", "T", "TRUE", "true", "True"}
_WANTED = """  - plugins:
    - name: deviceshare
      arguments:
        deviceshare.VGPUEnable: true"""


def scheduler_problem(conf_text: str | None) -> str | None:
    """None when Volcano's scheduler configuration (volcano-scheduler.conf) enables the
    deviceshare plugin with deviceshare.VGPUEnable true; else what is wrong, in a few words.

    Pure. As Volcano reads it (pkg/scheduler/conf, framework.Arguments.GetBool): tiers of
    plugins, each with optional arguments; a string "true" counts as Volcano parses it."""
    if conf_text is None:
        return f"it has no {SCHEDULER_CONF_KEY} key"
    try:
        conf = yaml.safe_load(conf_text)
    except yaml.YAMLError as err:
        return f"its {SCHEDULER_CONF_KEY} is not YAML ({err.__class__.__name__})"
    tiers = conf.get("tiers") if isinstance(conf, dict) else None
    found = False
    for tier in tiers if isinstance(tiers, list) else []:
        plugins = tier.get("plugins") if isinstance(tier, dict) else None
        for plugin in plugins if isinstance(plugins, list) else []:
            if not isinstance(plugin, dict) or plugin.get("name") != "deviceshare":
                continue
            found = True
            arguments = plugin.get("arguments") or {}
            value = arguments.get("deviceshare.VGPUEnable") if isinstance(arguments, dict) else None
            # strconv.ParseBool's true spellings, as Arguments.GetBool takes a string
            if value is True or (isinstance(value, str) and value.strip() in _TRUE):
                return None
    if not found:
        return "its scheduler has no deviceshare plugin"
    return "its deviceshare plugin does not set deviceshare.VGPUEnable: true"


def check_scheduler(config: ClusterConfig, configmap: dict[str, Any] | None) -> None:
    """Refuse (BadInput) unless the user's Volcano scheduler shares GPUs by vGPU. `configmap`:
    the scheduler's ConfigMap as the API returned it, None when it is not there."""
    where = f"ConfigMap {config.volcano_namespace}/{config.volcano_scheduler_configmap}"
    settings = (
        f"{VAR_PREFIX}volcano_namespace and {VAR_PREFIX}volcano_scheduler_configmap name "
        "another place"
    )
    if configmap is None:
        raise BadInput(
            f"gpustack_k8s_gpu_allocation=volcano: no Volcano scheduler configuration ({where} "
            "not found); gpustack deploys Volcano's vGPU device plugin, not Volcano",
            f"install Volcano (its Helm chart) with the deviceshare plugin enabled (see "
            f"docs/sharing.md), or, if it is installed elsewhere, {settings}",
        )
    problem = scheduler_problem((configmap.get("data") or {}).get(SCHEDULER_CONF_KEY))
    if problem:
        raise BadInput(
            f"gpustack_k8s_gpu_allocation=volcano: {where}: {problem}; Volcano would not "
            "schedule volcano.sh/vgpu-* requests",
            f"add to its {SCHEDULER_CONF_KEY} tiers (e.g. with the chart's "
            "custom.scheduler_config_override; the scheduler reloads the file when it "
            f"changes):\n{_WANTED}",
        )


# NVIDIA's device plugin and DRA driver images: each hands out the same GPUs Volcano's vGPU
# plugin splits, so neither may run beside it (docs/sharing.md)
_OTHER_ALLOCATORS = {
    "k8s-device-plugin": "NVIDIA's device plugin",
    "k8s-dra-driver-gpu": "NVIDIA's DRA driver for GPUs",
    "projecthami/hami": "HAMi's device plugin",
}


def other_allocators(daemonsets: list[dict[str, Any]]) -> list[str]:
    """Pure: `namespace/name (who)` of the DaemonSets, not gpustack's, that run another GPU
    allocator (by their containers' images). GPU Feature Discovery, which ships in the device
    plugin's image, is not one: it runs `gpu-feature-discovery`."""
    found = []
    for ds in daemonsets:
        meta = ds.get("metadata") or {}
        if (meta.get("labels") or {}).get("app.kubernetes.io/managed-by") == "gpustack":
            continue
        pod = ((ds.get("spec") or {}).get("template") or {}).get("spec") or {}
        for container in pod.get("containers") or []:
            image = str(container.get("image") or "")
            command = " ".join(map(str, [*(container.get("command") or []),
                                         *(container.get("args") or [])]))  # fmt: skip
            if "gpu-feature-discovery" in command:
                continue
            who = next((w for key, w in _OTHER_ALLOCATORS.items() if key in image), None)
            if who:
                found.append(f"{meta.get('namespace')}/{meta.get('name')} ({who})")
                break
    return found


def check_no_other_allocator(daemonsets: list[dict[str, Any]]) -> None:
    """Refuse (BadInput) when another GPU allocator runs in the cluster."""
    others = other_allocators(daemonsets)
    if others:
        raise BadInput(
            "gpustack_k8s_gpu_allocation=volcano: another GPU allocator runs in the cluster ("
            + ", ".join(others[:3])
            + (" …" if len(others) > 3 else "")
            + "); it would hand out the GPUs Volcano's vGPU device plugin splits; nothing "
            "was applied",
            "remove it from the GPU nodes (or the cluster), or keep it and use "
            "gpustack_k8s_gpu_allocation=device-plugin (docs/sharing.md)",
        )
