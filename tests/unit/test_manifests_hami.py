"""gpustack_k8s_gpu_allocation=hami: HAMi's device plugin and scheduler rendered as HAMi's chart
v2.10.0 renders them for containerd (webhook off), valid for Kubernetes 1.35-1.37, and the
settings it cannot be combined with refused before anything changes."""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from gpustack.errors import BadInput
from gpustack.fleet.status import kubernetes_drift
from gpustack.k8s import hami
from gpustack.k8s.cluster import nodes, pause
from gpustack.k8s.cluster.status import HAMI_PLUGIN_SELECTOR, node_views
from gpustack.k8s.cluster.verify import csv_memory, hami_memory
from gpustack.k8s.manifests import (
    ClusterConfig,
    config_from_inventory,
    manifest_filename,
    node_labels,
    render,
    render_verify_pod,
)

K8S_VERSIONS = ("1.35.0", "1.36.0", "1.37.0")
HAMI = {"gpu_allocation": "hami", "hami_kube_scheduler_tag": "v1.36.3"}
CONFIGS = {
    "hami": HAMI,
    "hami-distribution": {
        **HAMI,
        "kubelet_root_dir": "/var/lib/k0s/kubelet",
        "runtime_class": "",
        "priority_class": "",
        "registry": "registry.local:5000/mirror",
        "image_pull_secrets": ["regcred"],
        "image_pull_policy": "Always",
    },
    "hami-settings": {
        **HAMI,
        "hami_device_split_count": 4,
        "hami_device_memory_scaling": 1.5,
        "hami_default_mem": 2048,
        "hami_default_cores": 25,
        "hami_node_scheduler_policy": "spread",
        "hami_gpu_scheduler_policy": "binpack",
        "hami_tag": "sha256:" + "c" * 64,
    },
}


def _by(objects, kind, name):
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def _container(obj, name):
    spec = obj["spec"]["template"]["spec"]
    return next(c for c in spec["containers"] if c["name"] == name)


def _device_config(objects):
    return yaml.safe_load(
        _by(objects, "ConfigMap", hami.DEVICE_CONFIG)["data"]["device-config.yaml"]
    )


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_hami_manifests_validate_against_the_kubernetes_schema(name, version):
    config = ClusterConfig(**CONFIGS[name])
    pod = render_verify_pod(config, node_name="gpu-1", gpus=1, name="v-1")
    kinds = set()
    for obj in [*render(config), pod]:
        kubernetes_validate.validate(obj, version, strict=True)
        kinds.add(obj["kind"])
    assert {"Deployment", "DaemonSet", "ClusterRole", "ClusterRoleBinding", "Role"} <= kinds


def test_hami_replaces_nvidias_device_plugin_and_keeps_the_other_operands():
    names = {(o["kind"], o["metadata"]["name"]) for o in render(ClusterConfig(**HAMI))}
    assert ("DaemonSet", "nvidia-device-plugin") not in names
    assert not any(kind == "DeviceClass" or "dra" in name for kind, name in names)
    for expected in [
        ("DaemonSet", "hami-device-plugin"),
        ("Deployment", "hami-scheduler"),
        ("ConfigMap", "hami-device-plugin"),
        ("ConfigMap", "hami-scheduler"),
        ("ConfigMap", "hami-scheduler-device"),
        ("ClusterRoleBinding", "gpustack-hami-scheduler-kube"),
        ("DaemonSet", "gpu-feature-discovery"),
        ("DaemonSet", "dcgm-exporter"),
    ]:
        assert expected in names
    # no admission webhook: no certificates, Jobs or webhook configuration to keep in step
    assert not {"MutatingWebhookConfiguration", "Job", "Secret"} & {kind for kind, _ in names}
    # other modes render nothing of HAMi's
    for other in ({}, {"gpu_allocation": "dra"}):
        assert not any("hami" in o["metadata"]["name"] for o in render(ClusterConfig(**other)))


def test_the_device_plugin_daemonset_follows_the_chart_for_containerd():
    config = ClusterConfig(**HAMI)
    ds = _by(render(config), "DaemonSet", "hami-device-plugin")
    spec = ds["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "nvidia" and spec["hostPID"] is True
    assert spec["nodeSelector"] == {"nvidia.com/gpu.deploy.hami-device-plugin": "true", "gpu": "on"}
    assert ds["spec"]["template"]["metadata"]["labels"]["hami.io/webhook"] == "ignore"
    plugin = _container(ds, "device-plugin")
    assert plugin["image"] == "docker.io/projecthami/hami:v2.10.0"
    assert plugin["command"][:3] == [
        "nvidia-device-plugin", "--config-file=/device-config.yaml", "--mig-strategy=none",
    ]  # fmt: skip
    assert plugin["securityContext"]["privileged"] is True
    monitor = _container(ds, "vgpu-monitor")
    assert monitor["command"][0] == "vGPUmonitor"
    assert {m["mountPath"] for m in monitor["volumeMounts"]} >= {"/run/containerd", "/tmp"}
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["device-plugin"]["hostPath"]["path"] == "/var/lib/kubelet/device-plugins"
    assert volumes["device-config"]["configMap"]["name"] == "hami-scheduler-device"


def test_the_scheduler_is_kube_scheduler_with_hamis_extender_over_http():
    config = ClusterConfig(**CONFIGS["hami-settings"])
    objects = render(config)
    deployment = _by(objects, "Deployment", "hami-scheduler")
    kube = _container(deployment, "kube-scheduler")
    assert kube["image"] == "registry.k8s.io/kube-scheduler:v1.36.3"
    extender = _container(deployment, "vgpu-scheduler-extender")
    args = extender["command"]
    assert "--http_bind=0.0.0.0:80" in args and "--scheduler-name=hami-scheduler" in args
    assert "--node-scheduler-policy=spread" in args and "--gpu-scheduler-policy=binpack" in args
    assert extender["image"] == "docker.io/projecthami/hami@sha256:" + "c" * 64
    scheduler = yaml.safe_load(_by(objects, "ConfigMap", "hami-scheduler")["data"]["config.yaml"])
    assert scheduler["apiVersion"] == "kubescheduler.config.k8s.io/v1"
    assert scheduler["profiles"] == [{"schedulerName": "hami-scheduler"}]
    (ext,) = scheduler["extenders"]
    assert ext["urlPrefix"] == "http://127.0.0.1:80" and ext["enableHTTPS"] is False
    managed = [r["name"] for r in ext["managedResources"]]
    assert managed[:3] == ["nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores"]
    assert all(r["ignoredByScheduler"] for r in ext["managedResources"])


def test_settings_reach_hamis_device_config():
    nvidia = _device_config(render(ClusterConfig(**CONFIGS["hami-settings"])))["nvidia"]
    assert nvidia["deviceSplitCount"] == 4
    assert nvidia["deviceMemoryScaling"] == 1.5
    assert nvidia["defaultMemory"] == 2048 and nvidia["defaultCores"] == 25
    assert nvidia["runtimeClassName"] == "nvidia"
    default = _device_config(render(ClusterConfig(**HAMI)))
    assert default["nvidia"]["deviceSplitCount"] == 10
    assert default["nvidia"]["deviceMemoryScaling"] == 1  # rendered as the chart's integer
    # HAMi's scheduler initialises every vendor from this file: the chart's sections are kept
    assert {"cambricon", "hygon", "metax", "vnpus", "amd"} <= set(default)


def test_a_changed_setting_rolls_the_plugin_and_the_scheduler():
    def hashes(settings):
        objects = render(ClusterConfig(**settings))
        return [
            _by(objects, kind, name)["spec"]["template"]["metadata"]["annotations"]
            for kind, name in (
                ("DaemonSet", "hami-device-plugin"),
                ("Deployment", "hami-scheduler"),
            )
        ]

    before, after = hashes(HAMI), hashes({**HAMI, "hami_device_split_count": 5})
    assert before[0] != after[0] and before[1] != after[1]


def test_mirrors_pull_secrets_and_kubelet_root_reach_hami():
    objects = render(ClusterConfig(**CONFIGS["hami-distribution"]))
    ds = _by(objects, "DaemonSet", "hami-device-plugin")
    spec = ds["spec"]["template"]["spec"]
    assert "runtimeClassName" not in spec and "priorityClassName" not in spec
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert (
        _container(ds, "device-plugin")["image"]
        == "registry.local:5000/mirror/projecthami/hami:v2.10.0"
    )
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["device-plugin"]["hostPath"]["path"] == "/var/lib/k0s/kubelet/device-plugins"
    kube = _container(_by(objects, "Deployment", "hami-scheduler"), "kube-scheduler")
    assert kube["image"] == "registry.local:5000/mirror/kube-scheduler:v1.36.3"
    assert kube["imagePullPolicy"] == "Always"


def test_kube_scheduler_takes_the_clusters_version_as_the_chart_does():
    config = ClusterConfig(gpu_allocation="hami")
    assert config.for_cluster("v1.31.1+k3s1").hami_kube_scheduler_tag == "v1.31.1"
    assert config.for_cluster("v1.30.8-eks-2d5f260").hami_kube_scheduler_tag == "v1.30.8"
    pinned = ClusterConfig(gpu_allocation="hami", hami_kube_scheduler_tag="v1.36.0")
    assert pinned.for_cluster("v1.37.1").hami_kube_scheduler_tag == "v1.36.0"
    assert ClusterConfig().for_cluster("v1.36.3").hami_kube_scheduler_tag is None
    # without a cluster (gpustack manifests) and without the variable: a refusal with a hint
    with pytest.raises(BadInput) as caught:
        render(config)
    assert "gpustack_k8s_hami_kube_scheduler_tag" in caught.value.hint


def test_capacity_is_gpus_times_the_split_count():
    assert ClusterConfig(**HAMI).gpus_per_device == 10
    assert ClusterConfig(**{**HAMI, "hami_device_split_count": 3}).gpus_per_device == 3
    assert ClusterConfig().gpus_per_device == 1


def test_the_verification_pod_goes_through_hamis_scheduler():
    pod = render_verify_pod(ClusterConfig(**HAMI), node_name="gpu-1", gpus=1, name="v")
    spec = pod["spec"]
    assert spec["schedulerName"] == "hami-scheduler" and "nodeName" not in spec
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["gpu-1"]
    assert {"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
            "effect": "NoSchedule"} in spec["tolerations"]  # fmt: skip
    plain = render_verify_pod(ClusterConfig(), node_name="gpu-1", gpus=1, name="v")["spec"]
    assert plain["nodeName"] == "gpu-1" and "schedulerName" not in plain


def test_the_verification_pod_asks_for_gpu_memory_and_reads_it_back():
    config = ClusterConfig(**{**HAMI, "hami_verify_memory": 2048})
    (container,) = render_verify_pod(config, node_name="gpu-1", gpus=1, name="v")["spec"][
        "containers"
    ]
    want = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 2048}
    assert container["resources"] == {"requests": want, "limits": want}
    assert container["command"] == [
        "nvidia-smi", "--query-gpu=name,uuid,memory.total", "--format=csv,noheader"]  # fmt: skip
    (plain,) = render_verify_pod(ClusterConfig(), node_name="gpu-1", gpus=1, name="v")["spec"][
        "containers"
    ]
    assert plain["command"] == ["nvidia-smi", "-L"]
    assert plain["resources"]["limits"] == {"nvidia.com/gpu": 1}
    with pytest.raises(BadInput, match="hami_verify_memory=0"):
        ClusterConfig.from_vars({"gpustack_k8s_hami_verify_memory": "0"})


# nvidia-smi's answer on a real H100 80GB HBM3 (81559 MiB, tests/fixtures/real-gpu/
# 2026-11-27-h100-80gb-hbm3/COMMANDS.md) and as HAMi-core makes it answer inside a pod limited
# to 2048 MiB (its NVML hook reports the limit as the total)
H100 = "GPU-ebfab540-029d-5747-e4f8-7a648117c213"
UNLIMITED = f"NVIDIA H100 80GB HBM3, {H100}, 81559 MiB\n"
LIMITED = f"NVIDIA H100 80GB HBM3, {H100}, 2048 MiB\n"


def test_verify_reads_the_memory_limit_the_pod_sees():
    assert csv_memory(LIMITED) == {H100: 2048}
    assert csv_memory(f"NVIDIA H100 80GB HBM3, {H100}, [N/A]") == {H100: None}
    ok, message = hami_memory(2048, csv_memory(LIMITED))
    assert ok and message == "GPU memory limit 2048 MiB in effect (nvidia-smi's total in the pod)"
    ok, message = hami_memory(2048, csv_memory(UNLIMITED))
    assert not ok
    assert message.startswith(
        "the pod asked HAMi for 2048 MiB (nvidia.com/gpumem) but nvidia-smi in it reports "
        f"81559 MiB as {H100}'s total memory: HAMi-core's memory limit is not in effect"
    )


def test_manifest_files_for_hami_objects():
    names = [manifest_filename(o) for o in render(ClusterConfig(**HAMI))]
    assert "35-deployment-hami-scheduler.yaml" in names
    assert "18-clusterrole-gpustack-hami-scheduler.yaml" in names
    assert len(set(names)) == len(names)


def test_node_labels_follow_the_allocator_and_hamis_gpu_label():
    facts = {"gpus": {"count": 2}}
    config = ClusterConfig(**HAMI)
    wanted = node_labels(facts, {"nvidia.com/gpu.deploy.device-plugin": "true"}, config)
    assert wanted["nvidia.com/gpu.deploy.hami-device-plugin"] == "true"
    assert wanted["gpu"] == "on"
    assert wanted["nvidia.com/gpu.deploy.device-plugin"] is None
    back = node_labels(
        facts, {"nvidia.com/gpu.deploy.hami-device-plugin": "true", "gpu": "on"}, ClusterConfig()
    )
    assert back["nvidia.com/gpu.deploy.hami-device-plugin"] is None and back["gpu"] is None
    assert back["nvidia.com/gpu.deploy.device-plugin"] == "true"
    # a gpu=on gpustack did not put there stays
    assert "gpu" not in node_labels(facts, {"gpu": "on"}, ClusterConfig())
    # gpu=on is recorded with gpustack's other labels, so uninstall removes it
    patch = nodes.label_patch({"metadata": {}}, wanted)
    assert "gpu" in patch["metadata"]["annotations"][nodes.MANAGED_LABELS_ANNOTATION].split(",")


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"gpustack_k8s_mig_strategy": "single"}, "mig_strategy=single with gpustack_k8s_gpu_allocation=hami"),
        ({"gpustack_k8s_mig_strategy": "mixed"}, "HAMi's plugin is deployed with migStrategy none"),
        ({"gpustack_k8s_time_slicing_replicas": "4"}, "time_slicing_replicas=4 with gpustack_k8s_gpu_allocation=hami"),
        ({"gpustack_k8s_mps_replicas": "2"}, "mps_replicas=2 with gpustack_k8s_gpu_allocation=hami"),
        ({"gpustack_k8s_compat_with_cpu_manager": "true"}, "compat_with_cpu_manager=true"),
        ({"gpustack_k8s_hami_device_split_count": "0"}, "hami_device_split_count=0"),
        ({"gpustack_k8s_hami_default_cores": "101"}, "hami_default_cores=101"),
        ({"gpustack_k8s_hami_node_scheduler_policy": "topology-aware"}, "hami_node_scheduler_policy"),
        ({"gpustack_k8s_hami_tag": "v2.10.0:x"}, "is not an image tag"),
    ],
)  # fmt: skip
def test_hami_refusals_are_one_line_errors_with_a_hint(variables, message):
    with pytest.raises(BadInput) as caught:
        ClusterConfig.from_vars({"gpustack_k8s_gpu_allocation": "hami", **variables})
    assert message in caught.value.message and "\n" not in caught.value.message
    assert caught.value.hint


@pytest.mark.parametrize("var", ["nvidia_mig_config", "nvidia_mig_config_file"])
def test_a_host_with_a_mig_layout_is_refused_under_hami(var):
    hostvars = {"gpu1": {}, "gpu2": {var: "all-1g.10gb"}}
    with pytest.raises(BadInput) as caught:
        config_from_inventory(hostvars, {"gpustack_k8s_gpu_allocation": "hami"})
    assert var in caught.value.message and "gpu2" in caught.value.message
    assert "device-plugin or dra" in caught.value.hint
    # the same layout is the device plugin's business, and an empty one is no layout
    assert config_from_inventory(hostvars, {}).gpu_allocation == "device-plugin"
    empty = {"gpu1": {var: ""}}
    assert config_from_inventory(empty, {"gpustack_k8s_gpu_allocation": "hami"}).hami


def test_a_driver_upgrade_pauses_hamis_plugin_with_the_other_gpu_clients():
    labels = {"nvidia.com/gpu.deploy.hami-device-plugin": "true", "gpu": "on"}
    assert pause.paused_values(labels) == {"nvidia.com/gpu.deploy.hami-device-plugin": "true"}
    assert "nvidia.com/gpu.deploy.hami-device-plugin" in pause.STAGES[0]


def test_status_names_hamis_plugin_and_its_drift_words():
    node = {"metadata": {"name": "n1", "labels": {}},
            "status": {"allocatable": {"nvidia.com/gpu": "20"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip
    match = nodes.NodeMatch(host="h1", node_name="n1", node=node)
    views = node_views({"h1": match}, [], allocator="hami")
    assert views["h1"]["allocator"] == "hami" and views["h1"]["allocatable_gpus"] == 20
    assert "hami-device-plugin" in HAMI_PLUGIN_SELECTOR
    assert kubernetes_drift(2, views["h1"]) == [
        "HAMi device plugin pod not ready on the Kubernetes node"
    ]
