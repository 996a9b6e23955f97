"""HAMi's device plugin and scheduler (gpustack_k8s_gpu_allocation=hami), as HAMi's chart renders
them at release v2.10.0 (Project-HAMi/HAMi charts/hami @4707fb02c91c545bc7343ce26dba4c32919f9a3e)
for containerd nodes, with its admission webhook off (docs/sharing.md says why).

Pure: the objects only; manifests.render() puts them in the apply list.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import yaml

from gpustack import paths
from gpustack.k8s.manifests_config import ClusterConfig

HAMI_RELEASE = "v2.10.0"
HAMI_COMMIT = "4707fb02c91c545bc7343ce26dba4c32919f9a3e"
# Names as the chart's helpers give them for a release named "hami" (hami-vgpu.device-plugin,
# hami-vgpu.scheduler); cluster-scoped objects carry gpustack's prefix.
DEVICE_PLUGIN = "hami-device-plugin"
SCHEDULER = "hami-scheduler"
SCHEDULER_NAME = "hami-scheduler"  # values.yaml schedulerName: what pods ask for
MEMORY_RESOURCE = "nvidia.com/gpumem"  # MiB of one GPU's memory (values.yaml resourceMem)
DEVICE_CONFIG = "hami-scheduler-device"
CLUSTER_PREFIX = "gpustack-"
# gpustack's per-node label for HAMi's plugin, and the label HAMi's chart selects nodes by
# (values.yaml devicePlugin.nvidiaNodeSelector).
NODE_LABEL = ("gpu", "on")

# values.yaml devicePlugin.nodeConfiguration.config: the chart's default per-node file
# (an example node name that matches no node: every node takes the device config's defaults).
NODE_CONFIG = {
    "nodeconfig": [
        {
            "name": "your-node-name",
            "operatingmode": "hami-core",
            "devicememoryscaling": 1,
            "devicesplitcount": 10,
            "preconfigureddevicememory": 0,
            "enablenumatopology": False,
            "migstrategy": "none",
            "filterdevices": {"uuid": [], "index": []},
            "enablegetpreferredallocation": False,
        }
    ]
}

# templates/_helpers.tpl hami-vgpu.scheduler.managedResources with the chart's default values
# (ascend and iluvatar off, the other vendors on): resources kube-scheduler leaves to the extender.
_MANAGED = [
    "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/gpumem-percentage",
    "nvidia.com/priority", "cambricon.com/vmlu", "hygon.com/dcunum", "hygon.com/dcumem",
    "hygon.com/dcucores", "metax-tech.com/gpu", "metax-tech.com/sgpu", "metax-tech.com/vcore",
    "metax-tech.com/vmemory", "mthreads.com/vgpu", "enflame.com/drs-gcu", "enflame.com/gcu-memory",
    "enflame.com/gcu-core", "enflame.com/gcu", "kunlunxin.com/xpu", "kunlunxin.com/vxpu",
    "kunlunxin.com/vxpu-memory", "aws.amazon.com/neuron", "aws.amazon.com/neuroncore",
    "vastaitech.com/va", "birentech.com/gpu", "amd.com/gpu", "amd.com/gpumem", "amd.com/gpucores",
]  # fmt: skip

# device-plugin/monitorrole.yaml and scheduler/clusterrole.yaml
_PLUGIN_RULES = [
    {"apiGroups": [""], "resources": ["pods"],
     "verbs": ["get", "create", "watch", "list", "update", "patch"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "update", "list", "patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["list", "create", "update"]},
]  # fmt: skip
_SCHEDULER_RULES = [
    {"apiGroups": [""], "resources": ["pods", "configmaps"],
     "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "patch", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "get", "list"]},
    {"apiGroups": [""], "resources": ["resourcequotas"], "verbs": ["get", "list", "watch"]},
]  # fmt: skip


def device_config_text(config: ClusterConfig, environment) -> str:
    """device-config.yaml: gpustack's HAMi settings in the NVIDIA section, the chart's rest."""
    scaling = config.hami_device_memory_scaling
    other = (paths.templates_dir() / "hami" / "device-config-other-vendors.yaml").read_text(
        encoding="utf-8"
    )
    text = environment.get_template("hami/device-config.yaml.j2").render(
        config=config,
        memory_scaling=int(scaling) if float(scaling).is_integer() else scaling,
        other_vendors="\n".join(line for line in other.splitlines() if not line.startswith("#")),
    )
    text = text.lstrip("\n")
    yaml.safe_load(text)  # a broken template is a bug: fail here, not in HAMi's scheduler
    return text


def scheduler_config(config: ClusterConfig) -> dict[str, Any]:
    """kube-scheduler's KubeSchedulerConfiguration (scheduler/configmap.yaml, the v1 branch for
    Kubernetes minor > 25, admission webhook off: the extender on http://127.0.0.1:80)."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "leaderElection": {
            "leaderElect": True,
            "resourceName": SCHEDULER_NAME,
            "resourceNamespace": config.namespace,
        },
        "profiles": [{"schedulerName": SCHEDULER_NAME}],
        "extenders": [
            {
                "urlPrefix": "http://127.0.0.1:80",
                "enableHTTPS": False,
                "filterVerb": "filter",
                "bindVerb": "bind",
                "nodeCacheCapable": True,
                "weight": 1,
                "httpTimeout": "30s",
                "managedResources": [
                    {"name": name, "ignoredByScheduler": True} for name in _MANAGED
                ],
            }
        ],
    }


def objects(
    config: ClusterConfig,
    render_template: Callable[..., dict[str, Any]],
    environment,
    labels_for: Callable[[str, str], tuple[dict[str, str], dict[str, str]]],
    hash_of: Callable[..., str],
    tolerations: list[dict[str, Any]],
    deploy_label: str,
) -> list[dict[str, Any]]:
    """ServiceAccounts, RBAC, ConfigMaps, the device plugin DaemonSet and the scheduler."""
    plugin_labels, plugin_selector = labels_for(DEVICE_PLUGIN, "hami-device-plugin")
    sched_labels, sched_selector = labels_for(SCHEDULER, "hami-scheduler")
    device_text = device_config_text(config, environment)
    node_text = json.dumps(NODE_CONFIG, indent=2) + "\n"
    sched_text = yaml.safe_dump(scheduler_config(config), sort_keys=False)

    def cm(name: str, key: str, text: str, labels: dict[str, str]) -> dict[str, Any]:
        return render_template(
            "hami/configmap.yaml.j2", config=config, name=name, key=key, text=text, labels=labels
        )

    def binding(name: str, role: str, account: str, labels: dict[str, str]) -> dict[str, Any]:
        return render_template(
            "hami/clusterrolebinding.yaml.j2", config=config, name=name, role=role,
            service_account=account, labels=labels,
        )  # fmt: skip

    plugin_role = f"{CLUSTER_PREFIX}{DEVICE_PLUGIN}-monitor"
    sched_role = f"{CLUSTER_PREFIX}{SCHEDULER}"
    return [
        render_template(
            "hami/serviceaccount.yaml.j2", config=config, name=DEVICE_PLUGIN, labels=plugin_labels
        ),
        render_template(
            "hami/serviceaccount.yaml.j2", config=config, name=SCHEDULER, labels=sched_labels
        ),
        render_template(
            "hami/clusterrole.yaml.j2", name=plugin_role, rules=_PLUGIN_RULES, labels=plugin_labels
        ),
        render_template(
            "hami/clusterrole.yaml.j2", name=sched_role, rules=_SCHEDULER_RULES, labels=sched_labels
        ),
        binding(f"{CLUSTER_PREFIX}{DEVICE_PLUGIN}", plugin_role, DEVICE_PLUGIN, plugin_labels),
        binding(
            f"{CLUSTER_PREFIX}{SCHEDULER}-kube", "system:kube-scheduler", SCHEDULER, sched_labels
        ),
        binding(
            f"{CLUSTER_PREFIX}{SCHEDULER}-volume",
            "system:volume-scheduler",
            SCHEDULER,
            sched_labels,
        ),
        binding(sched_role, sched_role, SCHEDULER, sched_labels),
        render_template("hami/role.yaml.j2", config=config, name=SCHEDULER, labels=sched_labels),
        render_template(
            "hami/rolebinding.yaml.j2", config=config, name=SCHEDULER, labels=sched_labels
        ),
        cm(DEVICE_PLUGIN, "config.json", node_text, plugin_labels),
        cm(DEVICE_CONFIG, "device-config.yaml", device_text, sched_labels),
        cm(SCHEDULER, "config.yaml", sched_text, sched_labels),
        render_template(
            "hami/daemonset.yaml.j2",
            config=config,
            name=DEVICE_PLUGIN,
            labels=plugin_labels,
            selector=plugin_selector,
            pod_labels={**plugin_labels, "hami.io/webhook": "ignore"},
            config_hash=hash_of(node_text, device_text),
            service_account=DEVICE_PLUGIN,
            node_selector={deploy_label: "true", NODE_LABEL[0]: NODE_LABEL[1]},
            tolerations=tolerations,
            node_config_map=DEVICE_PLUGIN,
            device_config_map=DEVICE_CONFIG,
        ),
        render_template(
            "hami/deployment.yaml.j2",
            config=config,
            name=SCHEDULER,
            labels=sched_labels,
            selector=sched_selector,
            pod_labels={**sched_labels, "hami.io/webhook": "ignore"},
            config_hash=hash_of(sched_text, device_text),
            scheduler_name=SCHEDULER_NAME,
            device_config_map=DEVICE_CONFIG,
        ),
    ]
