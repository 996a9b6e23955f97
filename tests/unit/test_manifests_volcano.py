"""gpustack_k8s_gpu_allocation=volcano: Volcano's vGPU device plugin rendered as its v1.12.0
manifest deploys it for containerd, valid for Kubernetes 1.35-1.37; the settings it cannot be
combined with refused before anything changes; the user's Volcano scheduler checked, not
written; the verification pod and Job go through Volcano's scheduler."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest
import yaml

from gpustack.errors import BadInput
from gpustack.fleet.status import kubernetes_drift
from gpustack.k8s import volcano
from gpustack.k8s.cluster import gpu_resources, nodes, pause
from gpustack.k8s.cluster.status import VOLCANO_PLUGIN_SELECTOR, node_views
from gpustack.k8s.manifests import (
    ClusterConfig,
    config_from_inventory,
    manifest_filename,
    node_labels,
    render,
    render_verify_pod,
    render_verify_volcano_job,
)

K8S_VERSIONS = ("1.35.0", "1.36.0", "1.37.0")
VOLCANO = {"gpu_allocation": "volcano"}
CONFIGS = {
    "volcano": VOLCANO,
    "volcano-distribution": {
        **VOLCANO,
        "kubelet_root_dir": "/var/lib/k0s/kubelet",
        "runtime_class": "",
        "priority_class": "",
        "registry": "registry.local:5000/mirror",
        "image_pull_secrets": ["regcred"],
        "image_pull_policy": "Always",
    },
    "volcano-settings": {
        **VOLCANO,
        "volcano_device_split_count": 4,
        "volcano_device_plugin_tag": "sha256:" + "d" * 64,
        "volcano_scheduler_name": "volcano-gpu",
    },
}
PLUGIN = "volcano-device-plugin"
ENABLED_CONF = """actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
- plugins:
  - name: drf
  - name: deviceshare
    arguments:
      deviceshare.VGPUEnable: true
      deviceshare.SchedulePolicy: binpack
  - name: predicates
"""


def _by(objects, kind, name):
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def _container(obj, name):
    return next(c for c in obj["spec"]["template"]["spec"]["containers"] if c["name"] == name)


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_volcano_manifests_validate_against_the_kubernetes_schema(name, version):
    config = ClusterConfig(**CONFIGS[name])
    pod = render_verify_pod(config, node_name="gpu-1", gpus=1, name="v-1")
    job = render_verify_volcano_job(config, node_name="gpu-1", name="v-share")
    # the Job is a Volcano CRD (tests/kube checks it against Volcano's); its pod template is
    # a Kubernetes PodTemplateSpec
    templates = [
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": f"t-{i}"},
         "template": task["template"]}
        for i, task in enumerate(job["spec"]["tasks"])
    ]  # fmt: skip
    kinds = set()
    for obj in [*render(config), pod, *templates]:
        kubernetes_validate.validate(obj, version, strict=True)
        kinds.add(obj["kind"])
    assert {"DaemonSet", "ClusterRole", "ClusterRoleBinding", "ConfigMap"} <= kinds


def test_volcano_replaces_nvidias_device_plugin_and_keeps_the_other_operands():
    names = {(o["kind"], o["metadata"]["name"]) for o in render(ClusterConfig(**VOLCANO))}
    assert ("DaemonSet", "nvidia-device-plugin") not in names
    assert ("DaemonSet", PLUGIN) in names
    assert {("DaemonSet", "gpu-feature-discovery"), ("DaemonSet", "dcgm-exporter"),
            ("RuntimeClass", "nvidia")} <= names  # fmt: skip
    # no Volcano of gpustack's own: no scheduler, no HAMi objects
    assert not any("hami" in n or "scheduler" in n for _, n in names)


def test_the_device_plugin_daemonset_follows_the_upstream_manifest():
    objects = render(ClusterConfig(**VOLCANO))
    ds = _by(objects, "DaemonSet", PLUGIN)
    spec = ds["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "nvidia"
    assert spec["priorityClassName"] == "system-node-critical"
    assert spec["serviceAccountName"] == PLUGIN
    assert spec["nodeSelector"] == {"nvidia.com/gpu.deploy.volcano-device-plugin": "true"}
    assert {"key": "volcano.sh/gpu-memory", "operator": "Exists", "effect": "NoSchedule"} in (
        spec["tolerations"]
    )
    plugin, monitor = _container(ds, "volcano-device-plugin"), _container(ds, "monitor")
    image = "docker.io/projecthami/volcano-vgpu-device-plugin:v1.12.0"
    assert plugin["image"] == monitor["image"] == image
    assert plugin["args"] == ["--device-split-count=10"]
    assert plugin["lifecycle"]["postStart"]["exec"]["command"][-1] == (
        "cp -f /k8s-vgpu/lib/nvidia/* /usr/local/vgpu/"
    )
    env = {e["name"]: e.get("value") for e in plugin["env"]}
    assert env["HOOK_PATH"] == "/usr/local/vgpu" and env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert monitor["command"] == ["/bin/bash", "-c", "volcano-vgpu-monitor"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["device-plugin"]["hostPath"]["path"] == "/var/lib/kubelet/device-plugins"
    assert volumes["deviceconfig"]["configMap"]["name"] == volcano.NODE_CONFIG
    role = _by(objects, "ClusterRole", "gpustack-volcano-device-plugin")
    assert {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]} in role["rules"]


def test_the_device_config_sits_where_the_plugin_and_volcano_read_it():
    objects = render(ClusterConfig(**{**VOLCANO, "volcano_device_split_count": 4}))
    cm = _by(objects, "ConfigMap", "volcano-vgpu-device-config")
    assert cm["metadata"]["namespace"] == "kube-system"
    assert cm["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpustack"
    nvidia = yaml.safe_load(cm["data"]["device-config.yaml"])["nvidia"]
    assert nvidia["resourceCountName"] == "volcano.sh/vgpu-number"
    assert nvidia["resourceMemoryName"] == "volcano.sh/vgpu-memory"
    assert nvidia["resourceCoreName"] == "volcano.sh/vgpu-cores"
    assert nvidia["deviceSplitCount"] == 4 and nvidia["knownMigGeometries"]
    node = json.loads(_by(objects, "ConfigMap", volcano.NODE_CONFIG)["data"]["config.json"])
    assert node["nodeconfig"][0]["name"] == "your-node-name"  # matches no node: defaults
    ds = _by(objects, "DaemonSet", PLUGIN)
    assert _container(ds, "volcano-device-plugin")["args"] == ["--device-split-count=4"]


def test_a_changed_setting_rolls_the_plugin():
    def config_hash(count):
        config = ClusterConfig(**{**VOLCANO, "volcano_device_split_count": count})
        ds = _by(render(config), "DaemonSet", PLUGIN)
        return ds["spec"]["template"]["metadata"]["annotations"]["gpustack.io/config-hash"]

    assert config_hash(10) != config_hash(5)


def test_mirrors_pull_secrets_and_kubelet_root_reach_volcanos_plugin():
    config = ClusterConfig(**CONFIGS["volcano-distribution"])
    ds = _by(render(config), "DaemonSet", PLUGIN)
    spec = ds["spec"]["template"]["spec"]
    assert _container(ds, "monitor")["image"] == (
        "registry.local:5000/mirror/projecthami/volcano-vgpu-device-plugin:v1.12.0"
    )
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert "runtimeClassName" not in spec and "priorityClassName" not in spec
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["device-plugin"]["hostPath"]["path"] == "/var/lib/k0s/kubelet/device-plugins"


def test_capacity_is_gpus_times_the_split_count_in_vgpu_number():
    config = ClusterConfig(**VOLCANO)
    assert config.gpus_per_device == 10 and config.resource_name == "volcano.sh/vgpu-number"
    assert ClusterConfig(**{**VOLCANO, "volcano_device_split_count": 3}).gpus_per_device == 3
    node = {"status": {"allocatable": {"volcano.sh/vgpu-number": "20",
                                       "volcano.sh/vgpu-memory": "163840"}}}  # fmt: skip
    assert gpu_resources.gpu_allocatable(node) == {"volcano.sh/vgpu-number": 20}


def test_the_verification_pod_goes_through_volcanos_scheduler():
    config = ClusterConfig(**CONFIGS["volcano-settings"])
    spec = render_verify_pod(config, node_name="gpu-1", gpus=1, name="v")["spec"]
    assert spec["schedulerName"] == "volcano-gpu" and "nodeName" not in spec
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["gpu-1"]
    assert spec["containers"][0]["resources"]["limits"] == {"volcano.sh/vgpu-number": 1}


def test_the_volcano_job_shares_one_gpu_of_one_node_by_memory():
    config = ClusterConfig(**{**VOLCANO, "volcano_verify_memory": 2048})
    job = render_verify_volcano_job(config, node_name="gpu-1", name="verify-share")
    assert job["apiVersion"] == "batch.volcano.sh/v1alpha1" and job["kind"] == "Job"
    spec = job["spec"]
    assert spec["schedulerName"] == "volcano" and spec["minAvailable"] == 2
    assert [t["replicas"] for t in spec["tasks"]] == [1, 1]
    for task in spec["tasks"]:
        pod = task["template"]["spec"]
        assert pod["runtimeClassName"] == "nvidia" and pod["restartPolicy"] == "Never"
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert terms["nodeSelectorTerms"][0]["matchFields"][0]["values"] == ["gpu-1"]
        (container,) = pod["containers"]
        # the GPU with its total memory as the container sees it (HAMi-core's limit)
        assert container["command"] == [
            "nvidia-smi", "--query-gpu=name,uuid,memory.total", "--format=csv,noheader"]  # fmt: skip
        assert container["resources"]["limits"] == {
            "volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-memory": 2048
        }  # fmt: skip
    default = render_verify_volcano_job(ClusterConfig(**VOLCANO), node_name="gpu-1", name="v")
    for task in default["spec"]["tasks"]:
        limits = task["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert limits["volcano.sh/vgpu-memory"] == 1024
    assert job["metadata"]["labels"]["gpustack.io/verify"] == "true"
    with pytest.raises(ValueError):
        render_verify_volcano_job(ClusterConfig(), node_name="gpu-1", name="x")
    with pytest.raises(ValueError):
        render_verify_volcano_job(ClusterConfig(**VOLCANO), node_name="gpu-1", name="Bad_Name")


def test_manifest_files_for_volcano_objects():
    names = [manifest_filename(o) for o in render(ClusterConfig(**VOLCANO))]
    assert any(n.endswith("daemonset-volcano-device-plugin.yaml") for n in names)
    assert len(set(names)) == len(names)


def test_node_labels_follow_the_allocator():
    facts = {"gpus": {"count": 2}}
    wanted = node_labels(
        facts, {"nvidia.com/gpu.deploy.device-plugin": "true"}, ClusterConfig(**VOLCANO)
    )
    assert wanted["nvidia.com/gpu.deploy.volcano-device-plugin"] == "true"
    assert wanted["nvidia.com/gpu.deploy.device-plugin"] is None
    assert "gpu" not in wanted  # HAMi's chart label is not Volcano's plugin's
    back = node_labels(
        facts, {"nvidia.com/gpu.deploy.volcano-device-plugin": "true"}, ClusterConfig()
    )
    assert back["nvidia.com/gpu.deploy.volcano-device-plugin"] is None
    assert back["nvidia.com/gpu.deploy.device-plugin"] == "true"


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"gpustack_k8s_mig_strategy": "single"}, "mig_strategy=single with gpustack_k8s_gpu_allocation=volcano"),
        ({"gpustack_k8s_mig_strategy": "mixed"}, "Volcano's vGPU device plugin is deployed with migStrategy none"),
        ({"gpustack_k8s_time_slicing_replicas": "4"}, "time_slicing_replicas=4 with gpustack_k8s_gpu_allocation=volcano"),
        ({"gpustack_k8s_mps_replicas": "2"}, "through gpustack_k8s_volcano_device_split_count"),
        ({"gpustack_k8s_compat_with_cpu_manager": "true"}, "which Volcano's vGPU device plugin replaces"),
        ({"gpustack_k8s_volcano_device_split_count": "0"}, "volcano_device_split_count=0"),
        ({"gpustack_k8s_volcano_verify_memory": "0"}, "volcano_verify_memory=0"),
        ({"gpustack_k8s_volcano_verify_memory": "1GiB"}, "volcano_verify_memory=1GiB"),
        ({"gpustack_k8s_volcano_device_plugin_tag": "v1.12.0:x"}, "is not an image tag"),
        ({"gpustack_k8s_volcano_namespace": "Volcano_System"}, "not a valid namespace name"),
    ],
)  # fmt: skip
def test_volcano_refusals_are_one_line_errors_with_a_hint(variables, message):
    with pytest.raises(BadInput) as caught:
        ClusterConfig.from_vars({"gpustack_k8s_gpu_allocation": "volcano", **variables})
    assert message in caught.value.message and "\n" not in caught.value.message
    assert caught.value.hint


@pytest.mark.parametrize("var", ["nvidia_mig_config", "nvidia_mig_config_file"])
def test_a_host_with_a_mig_layout_is_refused_under_volcano(var):
    hostvars = {"gpu1": {}, "gpu2": {var: "all-1g.10gb"}}
    with pytest.raises(BadInput) as caught:
        config_from_inventory(hostvars, {"gpustack_k8s_gpu_allocation": "volcano"})
    assert var in caught.value.message and "gpu2" in caught.value.message
    assert "gpu_allocation=volcano" in caught.value.message
    assert "device-plugin or dra" in caught.value.hint


# -- the user's Volcano scheduler ---------------------------------------------------------


@pytest.mark.parametrize("value", ["true", "True", "1", "t"])
def test_a_scheduler_with_vgpu_on_passes(value):
    assert volcano.scheduler_problem(ENABLED_CONF) is None
    text = ENABLED_CONF.replace("VGPUEnable: true", f'VGPUEnable: "{value}"')
    assert volcano.scheduler_problem(text) is None
    config = ClusterConfig(**VOLCANO)
    volcano.check_scheduler(config, {"data": {"volcano-scheduler.conf": ENABLED_CONF}})


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        (None, "no volcano-scheduler.conf key"),
        ("tiers: [", "not YAML"),
        ('actions: "enqueue, allocate"\ntiers:\n- plugins:\n  - name: gang\n',
         "has no deviceshare plugin"),
        (ENABLED_CONF.replace("deviceshare.VGPUEnable: true", "deviceshare.VGPUEnable: false"),
         "does not set deviceshare.VGPUEnable: true"),
        (ENABLED_CONF.replace("      deviceshare.VGPUEnable: true\n", ""),
         "does not set deviceshare.VGPUEnable: true"),
        ("- just a list\n", "has no deviceshare plugin"),
    ],
)  # fmt: skip
def test_a_scheduler_without_vgpu_is_refused_with_what_to_add(text, problem):
    config = ClusterConfig(**VOLCANO)
    assert problem in volcano.scheduler_problem(text)
    with pytest.raises(BadInput) as caught:
        volcano.check_scheduler(config, {"data": {} if text is None else {
            "volcano-scheduler.conf": text}})  # fmt: skip
    assert "volcano-system/volcano-scheduler-configmap" in caught.value.message
    assert "deviceshare.VGPUEnable: true" in caught.value.hint


def test_no_volcano_is_refused_and_the_names_are_settings():
    config = ClusterConfig(**{**VOLCANO, "volcano_namespace": "batch",
                              "volcano_scheduler_configmap": "vc-scheduler-configmap"})  # fmt: skip
    with pytest.raises(BadInput) as caught:
        volcano.check_scheduler(config, None)
    assert "batch/vc-scheduler-configmap not found" in caught.value.message
    assert "gpustack_k8s_volcano_namespace" in caught.value.hint


def _ds(name, image, command=None, managed=False):
    labels = {"app.kubernetes.io/managed-by": "gpustack"} if managed else {}
    container = {"name": "c", "image": image, **({"command": command} if command else {})}
    return {"metadata": {"namespace": "gpu-operator", "name": name, "labels": labels},
            "spec": {"template": {"spec": {"containers": [container]}}}}  # fmt: skip


def test_another_gpu_allocator_in_the_cluster_is_refused():
    found = [
        _ds("nvidia-device-plugin-daemonset", "nvcr.io/nvidia/k8s-device-plugin:v0.18.0"),
        _ds("gpu-feature-discovery", "nvcr.io/nvidia/k8s-device-plugin:v0.18.0",
            ["gpu-feature-discovery"]),
        _ds("nvidia-device-plugin", "nvcr.io/nvidia/k8s-device-plugin:v0.18.0", managed=True),
        _ds("dra", "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.12.0"),
        _ds("hami-device-plugin", "docker.io/projecthami/hami:v2.10.0"),
        _ds("volcano-device-plugin", "docker.io/projecthami/volcano-vgpu-device-plugin:v1.12.0"),
    ]  # fmt: skip
    assert volcano.other_allocators(found) == [
        "gpu-operator/nvidia-device-plugin-daemonset (NVIDIA's device plugin)",
        "gpu-operator/dra (NVIDIA's DRA driver for GPUs)",
        "gpu-operator/hami-device-plugin (HAMi's device plugin)",
    ]
    with pytest.raises(BadInput) as caught:
        volcano.check_no_other_allocator(found)
    assert "nvidia-device-plugin-daemonset" in caught.value.message
    volcano.check_no_other_allocator(found[1:3] + found[5:])


def test_a_driver_upgrade_pauses_volcanos_plugin_with_the_other_gpu_clients():
    labels = {"nvidia.com/gpu.deploy.volcano-device-plugin": "true"}
    assert pause.paused_values(labels) == labels
    assert "nvidia.com/gpu.deploy.volcano-device-plugin" in pause.STAGES[0]


def test_status_names_volcanos_plugin_and_counts_vgpu_shares():
    node = {"metadata": {"name": "n1", "labels": {}},
            "status": {"allocatable": {"volcano.sh/vgpu-number": "20"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}  # fmt: skip
    match = nodes.NodeMatch(host="h1", node_name="n1", node=node)
    views = node_views({"h1": match}, [], allocator="volcano")
    assert views["h1"]["allocator"] == "volcano" and views["h1"]["allocatable_gpus"] == 20
    assert "volcano-device-plugin" in VOLCANO_PLUGIN_SELECTOR
    assert kubernetes_drift(2, views["h1"]) == [
        "Volcano vGPU device plugin pod not ready on the Kubernetes node"
    ]
    empty = {**views["h1"], "allocatable_gpus": 0, "device_plugin_ready": True}
    assert kubernetes_drift(2, empty) == [
        "volcano.sh/vgpu-number not allocatable on the Kubernetes node"
    ]


# -- the share check -----------------------------------------------------------------------


def test_the_share_verdict_wants_one_host_gpu_per_pod_and_names_a_shared_one():
    from gpustack.k8s.cluster.verify import csv_memory, share_verdict

    host = ["GPU-a", "GPU-b"]

    def pod(*lines: str) -> dict:  # a pod's nvidia-smi --query-gpu=name,uuid,memory.total
        return csv_memory("".join(f"NVIDIA H100 80GB HBM3, {line}\n" for line in lines))

    ok, message = share_verdict(host, 1024, [pod("GPU-a, 1024 MiB"), pod("GPU-a, 1024 MiB")])
    assert ok and message == (
        "the Volcano Job's 2 pods were placed together on GPU GPU-a; GPU memory limit 1024 MiB "
        "in effect in each (nvidia-smi's total in the pod)"
    )
    ok, message = share_verdict(host, 1024, [pod("GPU-a, 1024 MiB"), pod("GPU-b, 1024 MiB")])
    assert ok and "spread them" in message and "not exercised" in message
    assert "GPU memory limit 1024 MiB in effect in each" in message
    assert share_verdict(host, 1024, [pod("GPU-a, 1024 MiB"), {}]) == (
        False, "nvidia-smi in the pod listed no GPU"
    )  # fmt: skip
    ok, message = share_verdict(
        host, 1024, [pod("GPU-a, 1024 MiB", "GPU-b, 1024 MiB"), pod("GPU-a, 1024 MiB")]
    )
    assert not ok and "listed 2 GPUs" in message
    ok, message = share_verdict(host, 1024, [pod("GPU-z, 1024 MiB"), pod("GPU-z, 1024 MiB")])
    assert not ok and "not on the host" in message


@pytest.mark.parametrize(("total", "shown"), [("81559 MiB", "81559 MiB"), ("[N/A]", "no number")])
def test_the_share_check_fails_when_a_pod_sees_more_memory_than_it_asked_for(total, shown):
    """The plugin's interposer not loaded: nvidia-smi in the pod reports the whole GPU (81559
    MiB on a real H100 80GB HBM3, tests/fixtures/real-gpu/2026-11-27-h100-80gb-hbm3)."""
    from gpustack.k8s.cluster.verify import csv_memory, share_verdict

    limited = csv_memory("NVIDIA H100 80GB HBM3, GPU-a, 2048 MiB\n")
    whole = csv_memory(f"NVIDIA H100 80GB HBM3, GPU-a, {total}\n")
    ok, message = share_verdict(["GPU-a"], 2048, [limited, whole])
    assert not ok
    assert message == (
        "a pod of the Volcano Job asked Volcano's vGPU device plugin for 2048 MiB "
        f"(volcano.sh/vgpu-memory) but nvidia-smi in it reports {shown} as GPU-a's total "
        "memory: HAMi-core's memory limit is not in effect (is the plugin's interposer, "
        "/usr/local/vgpu/libvgpu.so, loaded in the container?)"
    )


def test_share_job_names_fit_a_label_value():
    from gpustack.k8s.cluster.pods import job_name

    name = job_name("a-very-long-node-name." * 5)
    assert len(name) <= 63 and name.startswith("gpustack-share-")
    job = render_verify_volcano_job(ClusterConfig(**VOLCANO), node_name="n", name=name)
    assert job["metadata"]["name"] == name
