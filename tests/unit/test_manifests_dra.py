"""gpustack_k8s_gpu_allocation=dra: NVIDIA's DRA driver rendered, valid for Kubernetes 1.35-1.37."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest

from gpustack.errors import BadInput
from gpustack.k8s.manifests import (
    ClusterConfig,
    manifest_filename,
    node_labels,
    render,
    render_dra_verify_pod,
    render_verify_claim_template,
)

K8S_VERSIONS = ("1.35.0", "1.36.0", "1.37.0")
DRA = {"gpu_allocation": "dra"}
CONFIGS = {
    "dra": DRA,
    "dra-distribution": {
        **DRA,
        "kubelet_root_dir": "/var/lib/k0s/kubelet",
        "runtime_class": "",
        "priority_class": "",
        "registry": "registry.local:5000/mirror",
        "image_pull_secrets": ["regcred"],
        "image_pull_policy": "Always",
    },
    "dra-digest": {**DRA, "dra_driver_tag": "sha256:" + "b" * 64, "gfd_enabled": False},
}


def _by(objects, kind, name):
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


def _verify_objects(config):
    template = render_verify_claim_template(config, name="gpustack-verify-gpu-1")
    pod = render_dra_verify_pod(
        config, node_name="gpu-1", name="v-1", claim_template="gpustack-verify-gpu-1"
    )
    return template, pod


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_dra_manifests_validate_against_the_kubernetes_schema(name, version):
    config = ClusterConfig(**CONFIGS[name])
    objects = render(config) + list(_verify_objects(config))
    kinds = set()
    for obj in objects:
        kubernetes_validate.validate(obj, version, strict=True)
        kinds.add(obj["kind"])
    assert {"DeviceClass", "ResourceClaimTemplate", "ClusterRole", "ClusterRoleBinding"} <= kinds


def test_the_dra_schema_check_is_not_vacuous():
    config = ClusterConfig(**DRA)
    template, pod = _verify_objects(config)
    v1beta1 = copy.deepcopy(template)  # the v1beta1 shape: no `exactly`
    request = v1beta1["spec"]["spec"]["devices"]["requests"][0]
    request.update(request.pop("exactly"))
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(v1beta1, K8S_VERSIONS[-1], strict=True)
    broken = copy.deepcopy(pod)
    broken["spec"]["resourceClaims"][0]["resourceClaimTemplate"] = "x"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSIONS[-1], strict=True)
    device_class = _by(render(config), "DeviceClass", "gpu.nvidia.com")
    device_class["spec"]["selector"] = device_class["spec"].pop("selectors")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(device_class, K8S_VERSIONS[-1], strict=True)


def test_dra_replaces_the_device_plugin_and_keeps_the_other_operands():
    objects = render(ClusterConfig(**DRA))
    daemonsets = sorted(o["metadata"]["name"] for o in objects if o["kind"] == "DaemonSet")
    assert daemonsets == [
        "dcgm-exporter",
        "gpu-feature-discovery",
        "nvidia-dra-driver-gpu-kubelet-plugin",
    ]
    classes = {o["metadata"]["name"]: o for o in objects if o["kind"] == "DeviceClass"}
    assert set(classes) == {"gpu.nvidia.com", "mig.nvidia.com"}
    gpu = classes["gpu.nvidia.com"]["spec"]
    assert gpu["selectors"][0]["cel"]["expression"] == (
        "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
    )
    assert gpu["extendedResourceName"] == "nvidia.com/gpu"
    assert "extendedResourceName" not in classes["mig.nvidia.com"]["spec"]
    assert "'mig'" in classes["mig.nvidia.com"]["spec"]["selectors"][0]["cel"]["expression"]
    # the device plugin scenario renders none of it
    plain = render(ClusterConfig())
    assert not [o for o in plain if o["kind"] in ("DeviceClass", "ClusterRole")]
    assert _by(plain, "DaemonSet", "nvidia-device-plugin")


def test_the_kubelet_plugin_daemonset():
    config = ClusterConfig(**DRA)
    ds = _by(render(config), "DaemonSet", "nvidia-dra-driver-gpu-kubelet-plugin")
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.deploy.dra-driver": "true"}
    assert "runtimeClassName" not in pod  # NVML through /driver-root, as upstream
    assert pod["serviceAccountName"] == "nvidia-dra-driver-gpu-kubeletplugin"
    assert pod["automountServiceAccountToken"] is True
    (gpus,) = pod["containers"]
    assert gpus["image"] == "nvcr.io/nvidia/k8s-dra-driver-gpu:v25.12.0"
    assert gpus["command"][0] == "gpu-kubelet-plugin" and gpus["securityContext"]["privileged"]
    env = {e["name"]: e.get("value") for e in gpus["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "void" and env["NVIDIA_DRIVER_ROOT"] == "/"
    assert env["KUBELET_PLUGINS_DIRECTORY_PATH"] == "/var/lib/kubelet/plugins"
    mounts = {m["name"]: m for m in gpus["volumeMounts"]}
    assert mounts["plugins"]["mountPropagation"] == "Bidirectional"
    assert pod["initContainers"][0]["command"] == ["bash", "/usr/bin/kubelet-plugin-prestart.sh"]
    binding = _by(
        render(config), "ClusterRoleBinding", "gpustack-nvidia-dra-driver-gpu-kubeletplugin"
    )
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": pod["serviceAccountName"],
            "namespace": "gpustack-system",
        }
    ]


def test_mirrors_digests_pull_secrets_and_kubelet_root_reach_the_dra_driver():
    objects = render(ClusterConfig(**CONFIGS["dra-distribution"]))
    pod = _by(objects, "DaemonSet", "nvidia-dra-driver-gpu-kubelet-plugin")["spec"]["template"]
    spec = pod["spec"]
    images = {c["image"] for c in spec["initContainers"] + spec["containers"]}
    assert images == {"registry.local:5000/mirror/nvidia/k8s-dra-driver-gpu:v25.12.0"}
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert "priorityClassName" not in spec
    assert {c["imagePullPolicy"] for c in spec["initContainers"] + spec["containers"]} == {"Always"}
    env = {e["name"]: e.get("value") for e in spec["containers"][0]["env"]}
    assert env["KUBELET_REGISTRAR_DIRECTORY_PATH"] == "/var/lib/k0s/kubelet/plugins_registry"
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
    # the plugin announces socket paths to the kubelet: container path = host path
    for name in ("plugins-registry", "plugins"):
        assert mounts[name] == volumes[name] and volumes[name].startswith("/var/lib/k0s/kubelet/")
    digest = render(ClusterConfig(**CONFIGS["dra-digest"]))
    ds = _by(digest, "DaemonSet", "nvidia-dra-driver-gpu-kubelet-plugin")
    image = ds["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == "nvcr.io/nvidia/k8s-dra-driver-gpu@sha256:" + "b" * 64
    other = ClusterConfig(**DRA, dra_driver_image="registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu", dra_driver_tag="v0.5.0")  # fmt: skip
    assert (
        other.image("dra_driver")
        == "registry.k8s.io/dra-driver-nvidia/dra-driver-nvidia-gpu:v0.5.0"
    )


def test_the_dra_verification_pod_goes_through_the_scheduler_without_a_runtime_class():
    config = ClusterConfig(**CONFIGS["dra-distribution"])
    template, pod = _verify_objects(config)
    request = template["spec"]["spec"]["devices"]["requests"][0]
    assert request == {
        "name": "gpu",
        "exactly": {
            "deviceClassName": "gpu.nvidia.com",
            "allocationMode": "ExactCount",
            "count": 1,
        },
    }
    spec = pod["spec"]
    assert "nodeName" not in spec and "runtimeClassName" not in spec
    term = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["nodeSelectorTerms"] == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-1"]}]}
    ]
    assert spec["resourceClaims"] == [
        {"name": "gpu", "resourceClaimTemplateName": "gpustack-verify-gpu-1"}
    ]
    container = spec["containers"][0]
    assert container["resources"] == {"claims": [{"name": "gpu"}]}
    assert container["command"] == ["nvidia-smi", "-L"]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]


def test_manifest_files_for_cluster_scoped_dra_objects():
    names = [manifest_filename(o) for o in render(ClusterConfig(**DRA))]
    assert "12-deviceclass-gpu.nvidia.com.yaml" in names
    assert "18-clusterrole-gpustack-nvidia-dra-driver-gpu-kubeletplugin.yaml" in names
    assert len(set(names)) == len(names)


def test_node_labels_follow_the_allocator():
    facts = {"gpus": {"count": 2}}
    dra = ClusterConfig(**DRA)
    wanted = node_labels(facts, {}, dra)
    assert wanted["nvidia.com/gpu.deploy.dra-driver"] == "true"
    assert "nvidia.com/gpu.deploy.device-plugin" not in wanted
    switched = node_labels(facts, {"nvidia.com/gpu.deploy.device-plugin": "true"}, dra)
    assert switched["nvidia.com/gpu.deploy.device-plugin"] is None
    back = node_labels(facts, {"nvidia.com/gpu.deploy.dra-driver": "true"}, ClusterConfig())
    assert back["nvidia.com/gpu.deploy.dra-driver"] is None
    assert back["nvidia.com/gpu.deploy.device-plugin"] == "true"
    # a user's "false" is never overwritten
    kept = node_labels(facts, {"nvidia.com/gpu.deploy.dra-driver": "false"}, dra)
    assert "nvidia.com/gpu.deploy.dra-driver" not in kept


@pytest.mark.parametrize(
    ("variables", "message", "hint"),
    [
        ({"gpustack_k8s_gpu_allocation": "dra2"}, "gpustack_k8s_gpu_allocation=dra2", "device-plugin, dra"),
        (
            {"gpustack_k8s_gpu_allocation": "dra", "gpustack_k8s_time_slicing_replicas": "4"},
            "sharing replicas are NVIDIA device plugin settings; NVIDIA's DRA driver shares GPUs through ResourceClaim configuration",
            "default",
        ),
        (
            {"gpustack_k8s_gpu_allocation": "dra", "gpustack_k8s_compat_with_cpu_manager": "true"},
            "device plugin setting",
            "default",
        ),
        ({"gpustack_k8s_dra_driver_tag": "v25.12.0:x"}, "is not an image tag", "tag"),
        ({"gpustack_k8s_dra_driver_image": "nvcr.io/x:v1"}, "is not an image repository", "repository"),
    ],
)  # fmt: skip
def test_bad_dra_settings_are_one_line_errors_with_a_hint(variables, message, hint):
    with pytest.raises(BadInput) as caught:
        ClusterConfig.from_vars(variables)
    assert message in caught.value.message and "\n" not in caught.value.message
    assert hint in caught.value.hint


def test_extravars_strings_select_dra():
    assert ClusterConfig.from_vars({"gpustack_k8s_gpu_allocation": "dra"}).dra
    assert not ClusterConfig().dra
