"""Settings for other distributions and private registries, and the parity fixes of issue 12.

kubelet root dir (k0s, MicroK8s), RuntimeClass name or none (nvidia as the default runtime),
PriorityClass, image pull policy and secrets, the chart's compatWithCPUManager; the MPS
control daemon's hostPID; no API token where no API call is made.
"""

from __future__ import annotations

import kubernetes_validate
import pytest
import yaml

from gpustack.errors import BadInput
from gpustack.k8s.manifests import ClusterConfig, render, render_verify_pod, to_yaml

K8S_VERSIONS = ("1.35.0", "1.36.0", "1.37.0")
DISTRO = {
    "kubelet_root_dir": "/var/snap/microk8s/common/var/lib/kubelet",
    "runtime_class": "",
    "priority_class": "",
    "registry": "registry.local:5000/mirror",
    "image_pull_secrets": ["regcred", "mirror-pull"],
    "image_pull_policy": "Always",
}
CONFIGS = {
    "distro": DISTRO,
    "distro-mps": {**DISTRO, "mps_replicas": 3},
    "runtime-class-renamed": {"runtime_class": "nvidia-legacy", "priority_class": "gpu-critical"},
    "cpu-manager": {"compat_with_cpu_manager": True},
    "cpu-manager-mig": {"compat_with_cpu_manager": True, "mig_strategy": "mixed"},
}


def _pods(objects):
    """(name, pod spec) of every DaemonSet template."""
    return [
        (o["metadata"]["name"], o["spec"]["template"]["spec"])
        for o in objects
        if o["kind"] == "DaemonSet"
    ]


def _verify_pod(config):
    return render_verify_pod(config, node_name="gpu-1", gpus=1, name="verify-x")


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_manifests_validate_strictly(name, version):
    config = ClusterConfig(**CONFIGS[name])
    objects = [o for o in render(config) if o["kind"] != "ServiceMonitor"]
    for obj in [*objects, _verify_pod(config)]:
        kubernetes_validate.validate(obj, version, strict=True)
    assert len(objects) >= 6


def test_kubelet_root_dir_moves_the_host_paths_not_the_container_paths():
    config = ClusterConfig(kubelet_root_dir="/var/lib/k0s/kubelet/")
    pods = dict(_pods(render(config)))
    plugin_volume = next(
        v for v in pods["nvidia-device-plugin"]["volumes"] if v["name"] == "device-plugins"
    )
    assert plugin_volume["hostPath"] == {
        "path": "/var/lib/k0s/kubelet/device-plugins",
        "type": "Directory",
    }
    dcgm_volume = next(v for v in pods["dcgm-exporter"]["volumes"] if v["name"] == "pod-resources")
    assert dcgm_volume["hostPath"]["path"] == "/var/lib/k0s/kubelet/pod-resources"
    # inside the containers the binaries use their compiled-in kubelet paths
    mounts = {
        m["name"]: m["mountPath"]
        for name in ("nvidia-device-plugin", "dcgm-exporter")
        for m in pods[name]["containers"][0]["volumeMounts"]
    }
    assert mounts["device-plugins"] == "/var/lib/kubelet/device-plugins"
    assert mounts["pod-resources"] == "/var/lib/kubelet/pod-resources"
    default = dict(_pods(render(ClusterConfig())))
    assert "/var/lib/kubelet/device-plugins" in yaml.safe_dump(default["nvidia-device-plugin"])


def test_no_runtime_class_means_no_runtimeclass_object_and_no_pod_field():
    config = ClusterConfig(runtime_class="")
    objects = render(config)
    assert "RuntimeClass" not in {o["kind"] for o in objects}
    for name, spec in _pods(objects):
        assert "runtimeClassName" not in spec, name
    assert "runtimeClassName" not in _verify_pod(config)["spec"]


def test_a_renamed_runtime_class_is_its_own_handler_and_every_pod_uses_it():
    config = ClusterConfig(runtime_class="nvidia-legacy")
    objects = render(config)
    runtime_class = next(o for o in objects if o["kind"] == "RuntimeClass")
    assert runtime_class["metadata"]["name"] == runtime_class["handler"] == "nvidia-legacy"
    assert {spec["runtimeClassName"] for _, spec in _pods(objects)} == {"nvidia-legacy"}
    assert _verify_pod(config)["spec"]["runtimeClassName"] == "nvidia-legacy"


def test_priority_class_is_configurable_and_never_on_verify_pods():
    objects = render(ClusterConfig(priority_class="gpu-critical"))
    assert {spec["priorityClassName"] for _, spec in _pods(objects)} == {"gpu-critical"}
    assert all(
        "priorityClassName" not in s for _, s in _pods(render(ClusterConfig(priority_class="")))
    )
    assert "priorityClassName" not in _verify_pod(ClusterConfig())["spec"]


def test_pull_secrets_and_policy_reach_every_pod_and_container():
    config = ClusterConfig(**CONFIGS["distro-mps"])
    pods = [*_pods(render(config)), ("verify", _verify_pod(config)["spec"])]
    assert {name for name, _ in pods} >= {
        "nvidia-device-plugin",
        "nvidia-device-plugin-mps-control-daemon",
        "gpu-feature-discovery",
        "dcgm-exporter",
        "verify",
    }
    for name, spec in pods:
        assert spec["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror-pull"}], name
        for container in spec.get("initContainers", []) + spec["containers"]:
            assert container["imagePullPolicy"] == "Always", (name, container["name"])
            assert container["image"].startswith("registry.local:5000/mirror/nvidia/"), name
    for _, spec in _pods(render(ClusterConfig())):
        assert "imagePullSecrets" not in spec


def test_compat_with_cpu_manager_passes_device_specs_from_a_privileged_plugin():
    for settings in (CONFIGS["cpu-manager"], CONFIGS["cpu-manager-mig"]):
        pods = dict(_pods(render(ClusterConfig(**settings))))
        plugin = pods["nvidia-device-plugin"]["containers"][0]
        env = {e["name"]: e.get("value") for e in plugin["env"]}
        assert env["PASS_DEVICE_SPECS"] == "true"
        assert plugin["securityContext"] == {"privileged": True}
    plugin = dict(_pods(render(ClusterConfig())))["nvidia-device-plugin"]["containers"][0]
    assert "PASS_DEVICE_SPECS" not in {e["name"] for e in plugin["env"]}
    assert plugin["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_mps_control_daemon_runs_in_the_host_pid_namespace():
    """The MPS server finds its own PID via /proc/self: a pod PID namespace (the former
    shareProcessNamespace) keeps it from starting (k8s-device-plugin#1045)."""
    pods = dict(_pods(render(ClusterConfig(mps_replicas=2))))
    mps = pods["nvidia-device-plugin-mps-control-daemon"]
    assert mps["hostPID"] is True
    assert "shareProcessNamespace" not in mps
    assert "hostPID" not in pods["nvidia-device-plugin"]  # the plugin itself stays isolated


def test_pods_that_make_no_api_call_get_no_token():
    pods = dict(_pods(render(ClusterConfig(mps_replicas=2))))
    for name in (
        "nvidia-device-plugin",
        "nvidia-device-plugin-mps-control-daemon",
        "dcgm-exporter",
    ):
        assert pods[name]["automountServiceAccountToken"] is False, name
        assert "serviceAccountName" not in pods[name], name


def test_counters_include_nvlink_bandwidth_and_no_profiling_fields():
    config_map = next(
        o for o in render(ClusterConfig()) if o["metadata"]["name"] == "dcgm-exporter-metrics"
    )
    fields = [
        line.split(",")[0].strip()
        for line in config_map["data"]["counters.csv"].splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" in fields
    assert not [f for f in fields if f.startswith("DCGM_FI_PROF_")]


def test_output_is_deterministic_with_the_new_settings():
    first = [to_yaml(o) for o in render(ClusterConfig(**CONFIGS["distro-mps"]))]
    second = [to_yaml(o) for o in render(ClusterConfig(**CONFIGS["distro-mps"]))]
    assert first == second


def test_settings_from_dash_e_strings():
    config = ClusterConfig.from_vars(
        {
            "gpustack_k8s_image_pull_secrets": "regcred, mirror-pull",
            "gpustack_k8s_runtime_class": "",
            "gpustack_k8s_priority_class": "",
            "gpustack_k8s_kubelet_root_dir": "/var/lib/k0s/kubelet/",
            "gpustack_k8s_compat_with_cpu_manager": "true",
        }
    )
    assert config.image_pull_secrets == ("regcred", "mirror-pull")
    assert config.runtime_class == "" and config.priority_class == ""
    assert config.kubelet_root_dir == "/var/lib/k0s/kubelet"
    assert config.compat_with_cpu_manager is True
    assert ClusterConfig.from_vars(
        {"gpustack_k8s_image_pull_secrets": ["a"]}
    ).image_pull_secrets == ("a",)
    assert ClusterConfig.from_vars({"gpustack_k8s_runtime_class": None}).runtime_class == ""


@pytest.mark.parametrize(
    ("variables", "message", "hint"),
    [
        (
            {"gpustack_k8s_kubelet_root_dir": "var/lib/kubelet"},
            "not an absolute directory",
            "--root-dir",
        ),
        (
            {"gpustack_k8s_kubelet_root_dir": "/var/lib/../kubelet"},
            "not an absolute directory",
            "k0s",
        ),
        ({"gpustack_k8s_kubelet_root_dir": "/var/lib kubelet"}, "not an absolute directory", "k0s"),
        ({"gpustack_k8s_runtime_class": "Nvidia"}, "not a valid name", "RuntimeClass"),
        ({"gpustack_k8s_runtime_class": "nvidia.cdi"}, "not a valid name", "empty for none"),
        ({"gpustack_k8s_priority_class": "Critical"}, "not a valid name", "PriorityClass"),
        (
            {"gpustack_k8s_image_pull_policy": "always"},
            "gpustack_k8s_image_pull_policy=always",
            "IfNotPresent",
        ),
        ({"gpustack_k8s_image_pull_secrets": "reg_cred"}, "not a Secret name", "comma-separated"),
        ({"gpustack_k8s_image_pull_secrets": "a,a"}, "names a Secret twice", "Secret names"),
        (
            {"gpustack_k8s_compat_with_cpu_manager": "maybe"},
            "compat_with_cpu_manager=maybe",
            "true or false",
        ),
    ],
)
def test_bad_values_are_bad_input_with_a_hint(variables, message, hint):
    with pytest.raises(BadInput) as caught:
        ClusterConfig.from_vars(variables)
    assert message in caught.value.message
    assert hint in caught.value.hint


@pytest.mark.parametrize(
    ("typo", "suggestion"),
    [
        ("gpustack_k8s_kubelet_rootdir", "gpustack_k8s_kubelet_root_dir"),
        ("gpustack_k8s_image_pull_secret", "gpustack_k8s_image_pull_secrets"),
        ("gpustack_k8s_runtimeclass", "gpustack_k8s_runtime_class"),
        ("gpustack_k8s_imagepullpolicy", "gpustack_k8s_image_pull_policy"),
    ],
)
def test_misspelt_names_get_a_did_you_mean(typo, suggestion):
    with pytest.raises(BadInput) as caught:
        ClusterConfig.from_vars({typo: "x"})
    assert caught.value.hint == f"did you mean {suggestion}?"


def test_every_setting_is_documented():
    from tests.conftest import ROOT

    text = (ROOT / "docs" / "kubernetes.md").read_text(encoding="utf-8")
    missing = [f for f in ClusterConfig.model_fields if f"`gpustack_k8s_{f}`" not in text]
    assert missing == []


def test_runtime_class_must_name_the_runtime_the_hosts_register():
    from gpustack.k8s.manifests import config_from_inventory

    hosts = {"gpu1": {}, "gpu2": {"container_runtime_nvidia_name": "nvidia-cdi"}}
    with pytest.raises(BadInput) as caught:
        config_from_inventory(hosts, {})
    assert "container_runtime_nvidia_name=nvidia-cdi on gpu2" in caught.value.message
    assert "gpustack_k8s_runtime_class=nvidia-cdi" in caught.value.hint
    # the same name on both sides, -e for both, or no RuntimeClass at all: fine
    same = {"gpu1": {"container_runtime_nvidia_name": "nvidia-cdi",
                     "gpustack_k8s_runtime_class": "nvidia-cdi"}}  # fmt: skip
    assert config_from_inventory(same, {}).runtime_class == "nvidia-cdi"
    dash_e = {"container_runtime_nvidia_name": "x", "gpustack_k8s_runtime_class": "x"}
    assert config_from_inventory(hosts, dash_e).runtime_class == "x"
    assert config_from_inventory(hosts, {"gpustack_k8s_runtime_class": ""}).runtime_class == ""
    templated = {"gpu1": {"container_runtime_nvidia_name": "{{ my_name }}"}}
    assert config_from_inventory(templated, {}).runtime_class == "nvidia"


def test_runtime_name_is_read_from_group_vars_as_a_play_reads_it(tmp_path):
    from gpustack.ansible.inventory import load_inventory
    from gpustack.k8s.manifests import config_from_inventory

    (tmp_path / "group_vars").mkdir()
    (tmp_path / "group_vars" / "all.yml").write_text("container_runtime_nvidia_name: nvidia-cdi\n")
    inventory_file = tmp_path / "hosts.ini"
    inventory_file.write_text("gpu1 ansible_host=10.0.0.1\n")
    inventory = load_inventory(str(inventory_file), None)
    with pytest.raises(BadInput, match="container_runtime_nvidia_name=nvidia-cdi on gpu1"):
        config_from_inventory(inventory, {})
    config = config_from_inventory(inventory, {"gpustack_k8s_runtime_class": "nvidia-cdi"})
    assert config.runtime_class == "nvidia-cdi"
