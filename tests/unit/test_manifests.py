"""Rendered manifests: valid against real Kubernetes OpenAPI schemas, and saying what we mean."""

from __future__ import annotations

import copy

import kubernetes_validate
import pytest
import yaml

from gpustack.errors import BadInput
from gpustack.k8s.manifests import (
    COMMON_LABELS,
    ClusterConfig,
    manifest_filename,
    plugin_config,
    render,
    render_verify_pod,
)

# Three recent minor versions whose schemas kubernetes-validate ships.
K8S_VERSIONS = ("1.35.0", "1.36.0", "1.37.0")

CONFIGS = {
    "default": {},
    "mig-mixed": {"mig_strategy": "mixed"},
    "mig-single-timeslicing": {"mig_strategy": "single", "time_slicing_replicas": 2},
    "time-slicing-4": {"time_slicing_replicas": 4},
    "time-slicing-renamed": {"time_slicing_replicas": 4, "rename_by_default": True},
    "mps": {"mps_replicas": 4},
    "registry-override": {"registry": "registry.example:5000/nvidia-mirror"},
    "gfd-off": {"gfd_enabled": False},
    "gfd-node-feature-api": {"gfd_mode": "node-feature-api"},
    "dcgm-off": {"dcgm_exporter_enabled": False},
    "namespace-digest": {
        "namespace": "gpu-ops",
        "device_plugin_tag": "sha256:" + "a" * 64,
    },
}


def _objects(name: str, servicemonitor: bool = True) -> tuple[ClusterConfig, list[dict]]:
    config = ClusterConfig(**CONFIGS[name])
    return config, render(config, servicemonitor=servicemonitor)


def _by_kind(objects, kind):
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def _pod_specs(objects):
    for obj in objects:
        if obj["kind"] == "DaemonSet":
            yield obj, obj["spec"]["template"]["spec"]


def _containers(spec):
    return spec.get("initContainers", []) + spec["containers"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_manifest_validates_against_the_kubernetes_schema(name, version):
    _, objects = _objects(name)
    checked = 0
    for obj in objects:
        if obj["kind"] == "ServiceMonitor":  # a CRD: checked in its own test
            continue
        kubernetes_validate.validate(obj, version, strict=True)
        checked += 1
    assert checked == len(objects) - (name != "dcgm-off") and checked >= 5


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_verify_pods_validate_against_the_kubernetes_schema(version):
    config = ClusterConfig(vector_add_image="nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0")
    for kind in ("nvidia-smi", "vectoradd"):
        pod = render_verify_pod(config, node_name="gpu-1", gpus=2, name=f"v-{kind}", kind=kind)
        kubernetes_validate.validate(pod, version, strict=True)


def test_the_schema_check_is_not_vacuous():
    _, objects = _objects("default")
    daemonset = copy.deepcopy(_by_kind(objects, "DaemonSet")["nvidia-device-plugin"])
    daemonset["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, K8S_VERSIONS[-1], strict=True)
    daemonset = copy.deepcopy(_by_kind(objects, "DaemonSet")["nvidia-device-plugin"])
    daemonset["spec"]["template"]["spec"]["nodeSelectr"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(daemonset, K8S_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_every_object_carries_the_common_labels_and_the_namespace(name):
    config, objects = _objects(name)
    for obj in objects:
        labels = obj["metadata"]["labels"]
        assert COMMON_LABELS.items() <= labels.items(), obj["metadata"]["name"]
        if obj["kind"] not in ("Namespace", "RuntimeClass"):
            assert obj["metadata"]["namespace"] == config.namespace
    names = [manifest_filename(o) for o in objects]
    assert len(set(names)) == len(names)


def test_apply_order_and_the_namespace():
    _, objects = _objects("default")
    assert [o["kind"] for o in objects[:2]] == ["Namespace", "RuntimeClass"]
    namespace = objects[0]
    assert namespace["metadata"]["name"] == "gpustack-system"
    for mode in ("enforce", "audit", "warn"):
        assert namespace["metadata"]["labels"][f"pod-security.kubernetes.io/{mode}"] == "privileged"
    runtime_class = objects[1]
    assert runtime_class["apiVersion"] == "node.k8s.io/v1"
    assert (runtime_class["metadata"]["name"], runtime_class["handler"]) == ("nvidia", "nvidia")
    # every ConfigMap comes before the DaemonSet that mounts it
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objects]
    assert kinds.index(("ConfigMap", "nvidia-device-plugin-config")) < kinds.index(
        ("DaemonSet", "nvidia-device-plugin")
    )
    assert kinds.index(("ConfigMap", "dcgm-exporter-metrics")) < kinds.index(
        ("DaemonSet", "dcgm-exporter")
    )


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_daemonsets_run_only_on_gpu_nodes_as_critical_pods(name):
    _, objects = _objects(name)
    gates = {
        "nvidia-device-plugin": "device-plugin",
        "nvidia-device-plugin-mps-control-daemon": "device-plugin",
        "gpu-feature-discovery": "gpu-feature-discovery",
        "dcgm-exporter": "dcgm-exporter",
    }
    configmaps = set(_by_kind(objects, "ConfigMap"))
    for daemonset, spec in _pod_specs(objects):
        name_ = daemonset["metadata"]["name"]
        assert spec["nodeSelector"][f"nvidia.com/gpu.deploy.{gates[name_]}"] == "true"
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec[
            "tolerations"
        ]
        assert spec["priorityClassName"] == "system-node-critical"
        assert spec["runtimeClassName"] == "nvidia"
        selector = daemonset["spec"]["selector"]["matchLabels"]
        assert selector.items() <= daemonset["spec"]["template"]["metadata"]["labels"].items()
        volumes = {v["name"]: v for v in spec["volumes"]}
        for container in _containers(spec):
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, (name_, mount["name"])
        for volume in volumes.values():
            if "configMap" in volume:
                assert volume["configMap"]["name"] in configmaps


def _plugin_file(objects) -> dict:
    text = _by_kind(objects, "ConfigMap")["nvidia-device-plugin-config"]["data"]["config.yaml"]
    return yaml.safe_load(text)


def test_device_plugin_config_default():
    config, objects = _objects("default")
    document = _plugin_file(objects)
    assert document == {"version": "v1", "flags": {"migStrategy": "none", "failOnInitError": True}}
    plugin = _by_kind(objects, "DaemonSet")["nvidia-device-plugin"]
    spec = plugin["spec"]["template"]["spec"]
    container = spec["containers"][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CONFIG_FILE"] == "/config/config.yaml"
    assert env["MIG_STRATEGY"] == "none"
    assert container["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert "/var/lib/kubelet/device-plugins" in host_paths
    assert config.gpus_per_device == 1 and config.resource_name == "nvidia.com/gpu"
    assert "nvidia-device-plugin-mps-control-daemon" not in _by_kind(objects, "DaemonSet")


def test_device_plugin_config_mig_mixed():
    config, objects = _objects("mig-mixed")
    assert _plugin_file(objects)["flags"]["migStrategy"] == "mixed"
    container = _by_kind(objects, "DaemonSet")["nvidia-device-plugin"]["spec"]["template"]["spec"][
        "containers"
    ][0]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["MIG_STRATEGY"] == "mixed" and env["NVIDIA_MIG_MONITOR_DEVICES"] == "all"
    assert container["securityContext"]["capabilities"]["add"] == ["SYS_ADMIN"]
    gfd_env = {
        e["name"]: e.get("value")
        for e in _by_kind(objects, "DaemonSet")["gpu-feature-discovery"]["spec"]["template"][
            "spec"
        ]["containers"][0]["env"]
    }
    assert gfd_env["MIG_STRATEGY"] == "mixed"
    assert not config.capacity_predictable


def test_device_plugin_config_time_slicing():
    config, objects = _objects("time-slicing-4")
    assert _plugin_file(objects)["sharing"] == {
        "timeSlicing": {
            "renameByDefault": False,
            "resources": [{"name": "nvidia.com/gpu", "replicas": 4}],
        }
    }
    assert config.gpus_per_device == 4 and config.resource_name == "nvidia.com/gpu"
    renamed = ClusterConfig(**CONFIGS["time-slicing-renamed"])
    assert plugin_config(renamed)["sharing"]["timeSlicing"]["renameByDefault"] is True
    assert renamed.resource_name == "nvidia.com/gpu.shared"


def test_mps_adds_the_control_daemon():
    config, objects = _objects("mps")
    assert _plugin_file(objects)["sharing"] == {
        "mps": {"renameByDefault": False, "resources": [{"name": "nvidia.com/gpu", "replicas": 4}]}
    }
    daemonsets = _by_kind(objects, "DaemonSet")
    mps = daemonsets["nvidia-device-plugin-mps-control-daemon"]["spec"]["template"]["spec"]
    assert mps["nodeSelector"]["nvidia.com/mps.capable"] == "true"
    assert mps["containers"][0]["command"] == ["mps-control-daemon"]
    plugin = daemonsets["nvidia-device-plugin"]["spec"]["template"]["spec"]
    assert {"/run/nvidia/mps", "/run/nvidia/mps/shm"} <= {
        v["hostPath"]["path"] for v in plugin["volumes"] if "hostPath" in v
    }
    assert config.gpus_per_device == 4 and config.sharing == "mps"


def test_config_hash_rolls_pods_when_the_plugin_config_changes():
    def annotation(config):
        daemonset = _by_kind(render(config), "DaemonSet")["nvidia-device-plugin"]
        return daemonset["spec"]["template"]["metadata"]["annotations"]["gpustack.io/config-hash"]

    assert annotation(ClusterConfig()) == annotation(ClusterConfig())
    assert annotation(ClusterConfig()) != annotation(ClusterConfig(time_slicing_replicas=2))


def test_gfd_uses_the_device_plugin_image_and_can_be_turned_off():
    _, objects = _objects("default")
    gfd = _by_kind(objects, "DaemonSet")["gpu-feature-discovery"]["spec"]["template"]["spec"]
    assert gfd["nodeSelector"] == {"nvidia.com/gpu.deploy.gpu-feature-discovery": "true"}
    assert gfd["containers"][0]["image"] == "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
    assert gfd["containers"][0]["command"] == ["gpu-feature-discovery"]
    _, objects = _objects("gfd-off")
    assert "gpu-feature-discovery" not in _by_kind(objects, "DaemonSet")
    config = ClusterConfig(gfd_image="registry.local/gfd", gfd_tag="v0.17.4")
    assert config.image("gfd") == "registry.local/gfd:v0.17.4"


@pytest.mark.parametrize(
    ("mode", "nfd_api", "api"),
    [("auto", False, False), ("auto", True, True), ("feature-file", True, False),
     ("node-feature-api", False, True)],
)  # fmt: skip
def test_gfd_mode_service_account_and_role(mode, nfd_api, api):
    objects = render(ClusterConfig(gfd_mode=mode), nfd_api=nfd_api)
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objects]
    gfd = ("gpu-feature-discovery",)
    sa, role, binding, ds = (
        kinds.index((k, *gfd)) for k in ("ServiceAccount", "Role", "RoleBinding", "DaemonSet")
    )
    assert sa < role < binding < ds  # RBAC exists before the pods that need it
    rules = _by_kind(objects, "Role")["gpu-feature-discovery"]["rules"]
    assert rules == [
        {"apiGroups": ["nfd.k8s-sigs.io"], "resources": ["nodefeatures"],
         "verbs": ["get", "list", "watch", "create", "update"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
    ]  # fmt: skip
    rb = _by_kind(objects, "RoleBinding")["gpu-feature-discovery"]
    assert rb["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "Role",
        "name": "gpu-feature-discovery",
    }
    assert rb["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpu-feature-discovery", "namespace": "gpustack-system"}
    ]
    assert "ClusterRole" not in {o["kind"] for o in objects}
    spec = _by_kind(objects, "DaemonSet")["gpu-feature-discovery"]["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == "gpu-feature-discovery"
    assert spec["automountServiceAccountToken"] is api
    env = {e["name"]: e.get("value", e.get("valueFrom")) for e in spec["containers"][0]["env"]}
    assert env["USE_NODE_FEATURE_API"] == ("true" if api else "false")
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert next(m["mountPath"] for m in spec["containers"][0]["volumeMounts"]) == (
        "/etc/kubernetes/node-feature-discovery/features.d"
    )


def test_dcgm_exporter_service_and_metrics():
    _, objects = _objects("default", servicemonitor=False)
    assert "ServiceMonitor" not in {o["kind"] for o in objects}
    service = _by_kind(objects, "Service")["dcgm-exporter"]
    assert service["spec"]["ports"] == [
        {"name": "gpu-metrics", "port": 9400, "targetPort": "gpu-metrics", "protocol": "TCP"}
    ]
    daemonset = _by_kind(objects, "DaemonSet")["dcgm-exporter"]
    pod_labels = daemonset["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    container = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert container["ports"][0] == {
        "name": "gpu-metrics",
        "containerPort": 9400,
        "protocol": "TCP",
    }
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["DCGM_EXPORTER_LISTEN"] == ":9400"
    counters = _by_kind(objects, "ConfigMap")["dcgm-exporter-metrics"]["data"]["counters.csv"]
    fields = {line.split(",")[0].strip() for line in counters.splitlines() if line[:1].isalpha()}
    assert {
        "DCGM_FI_DEV_GPU_TEMP",
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_XID_ERRORS",
    } <= fields
    mount_dir = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "counters")
    assert env["DCGM_EXPORTER_COLLECTORS"] == f"{mount_dir}/counters.csv"
    _, objects = _objects("dcgm-off")
    assert not any("dcgm" in o["metadata"]["name"] for o in objects)


def test_servicemonitor_structure():
    config, objects = _objects("default", servicemonitor=True)
    monitor = _by_kind(objects, "ServiceMonitor")["dcgm-exporter"]
    service = _by_kind(objects, "Service")["dcgm-exporter"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["namespace"] == config.namespace
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector and selector.items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [config.namespace]}
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == "gpu-metrics"
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"
    assert {
        "sourceLabels": ["__meta_kubernetes_pod_node_name"],
        "targetLabel": "node",
        "action": "replace",
    } in endpoint["relabelings"]
    assert objects[-1] is monitor  # applied after the Service it selects


def test_servicemonitor_labels_interval_and_honor_labels_as_the_gpu_operators():
    config = ClusterConfig(servicemonitor_labels={"release": "kube-prometheus-stack"},
                           servicemonitor_interval="1m", servicemonitor_honor_labels=True)  # fmt: skip
    monitor = _by_kind(render(config, servicemonitor=True), "ServiceMonitor")["dcgm-exporter"]
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert monitor["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "gpustack"
    (endpoint,) = monitor["spec"]["endpoints"]
    assert (endpoint["interval"], endpoint["honorLabels"]) == ("1m", True)
    default = _by_kind(render(ClusterConfig(servicemonitor_interval=""), servicemonitor=True),
                       "ServiceMonitor")["dcgm-exporter"]  # fmt: skip
    assert "interval" not in default["spec"]["endpoints"][0]  # Prometheus' global interval
    assert "honorLabels" not in default["spec"]["endpoints"][0]


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        ({"gpustack_k8s_servicemonitor_labels": "release"}, "expected KEY=VALUE pairs"),
        (
            {"gpustack_k8s_servicemonitor_labels": "app.kubernetes.io/name=x"},
            "gpustack's own label",
        ),
        ({"gpustack_k8s_servicemonitor_labels": "a=b c"}, "'b c' (of a) is not a label value"),
        ({"gpustack_k8s_servicemonitor_labels": {"-a": "b"}}, "'-a' is not a label key"),
        ({"gpustack_k8s_servicemonitor_interval": "30 s"}, "is not a Prometheus duration"),
    ],
)
def test_bad_servicemonitor_settings_are_refused(variables, message):
    from gpustack.errors import BadInput
    from gpustack.k8s.manifests import config_from_inventory

    with pytest.raises(BadInput) as caught:
        config_from_inventory({"gpu1": {}}, variables)
    assert message in caught.value.message and caught.value.hint


def test_servicemonitor_labels_from_e_as_ansible_playbook_gives_them():
    from gpustack.k8s.manifests import config_from_inventory

    given = {"gpustack_k8s_servicemonitor_labels": "release=kps, team=ml"}
    assert config_from_inventory({"gpu1": {}}, given).servicemonitor_labels == {
        "release": "kps", "team": "ml"}  # fmt: skip


def test_registry_override_rewrites_every_image():
    config, objects = _objects("registry-override")
    images = [c["image"] for _, spec in _pod_specs(objects) for c in _containers(spec)] + [
        render_verify_pod(config, node_name="n", gpus=1, name="v")["spec"]["containers"][0]["image"]
    ]
    assert images
    for image in images:
        assert image.startswith("registry.example:5000/nvidia-mirror/nvidia/"), image
    assert config.image("device_plugin") == (
        "registry.example:5000/nvidia-mirror/nvidia/k8s-device-plugin:v0.20.0"
    )
    assert config.image("dcgm_exporter") == (
        "registry.example:5000/nvidia-mirror/nvidia/k8s/dcgm-exporter:4.6.0-4.8.3-distroless"
    )


@pytest.mark.parametrize(
    ("settings", "which", "expected"),
    [
        ({}, "verify", "nvcr.io/nvidia/cuda:12.9.1-base-ubuntu22.04"),
        (
            {"registry": "localhost:5000"},
            "verify",
            "localhost:5000/nvidia/cuda:12.9.1-base-ubuntu22.04",
        ),
        (
            {"registry": "mirror.local/"},
            "device_plugin",
            "mirror.local/nvidia/k8s-device-plugin:v0.20.0",
        ),
        ({"verify_image": "busybox", "verify_tag": "1.36"}, "verify", "busybox:1.36"),
        (
            {"verify_image": "busybox", "verify_tag": "1.36", "registry": "r.io"},
            "verify",
            "r.io/busybox:1.36",
        ),
        (
            {"device_plugin_tag": "sha256:" + "b" * 64},
            "device_plugin",
            "nvcr.io/nvidia/k8s-device-plugin@sha256:" + "b" * 64,
        ),
        (
            {
                "vector_add_image": "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0",
                "registry": "m.local:443",
            },
            "vector_add",
            "m.local:443/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0",
        ),
        (
            {"vector_add_image": "localhost:5000/vectoradd:1"},
            "vector_add",
            "localhost:5000/vectoradd:1",
        ),
    ],
)
def test_image_reference_composition(settings, which, expected):
    assert ClusterConfig(**settings).image(which) == expected


def test_verify_pod():
    config = ClusterConfig(namespace="gpu-ops", time_slicing_replicas=2, rename_by_default=True)
    pod = render_verify_pod(config, node_name="gpu-7", gpus=2, name="gpustack-verify-gpu-7")
    spec = pod["spec"]
    assert pod["metadata"]["namespace"] == "gpu-ops"
    assert pod["metadata"]["labels"]["gpustack.io/verify"] == "true"
    assert COMMON_LABELS.items() <= pod["metadata"]["labels"].items()
    assert spec["nodeName"] == "gpu-7" and spec["runtimeClassName"] == "nvidia"
    assert spec["restartPolicy"] == "Never"
    assert spec["containers"][0]["command"] == ["nvidia-smi", "-L"]
    assert spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu.shared": 2}
    assert spec["containers"][0]["resources"]["requests"] == {"nvidia.com/gpu.shared": 2}
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
    pod = render_verify_pod(config, node_name="n", gpus=1, name="v", resource="nvidia.com/gpu")
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}
    with pytest.raises(BadInput, match="vectorAdd"):
        render_verify_pod(config, node_name="n", gpus=1, name="v", kind="vectoradd")
    sample = ClusterConfig(vector_add_image="nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0")
    pod = render_verify_pod(sample, node_name="n", gpus=1, name="v", kind="vectoradd")
    assert "command" not in pod["spec"]["containers"][0]
    assert pod["spec"]["containers"][0]["image"].endswith("cuda-sample:vectoradd-cuda12.5.0")
    with pytest.raises(ValueError):
        render_verify_pod(config, node_name="n", gpus=0, name="v")


def test_manifest_modules_do_not_import_the_kubernetes_client():
    import ast
    from pathlib import Path

    import gpustack

    package = Path(gpustack.__file__).parent / "k8s"
    for module in ["manifests.py", *(p.name for p in package.glob("manifests_*.py"))]:
        tree = ast.parse((package / module).read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not any(n == "kubernetes" or n.startswith("kubernetes.") for n in names), module


def test_templates_ship_in_the_wheel_and_resolve_there(tmp_path, monkeypatch):
    import tomllib
    from pathlib import Path

    from gpustack import paths

    root = Path(paths.__file__).resolve().parent.parent
    pyproject = tomllib.loads((root / "pyproject.toml").read_text())
    include = pyproject["tool"]["hatch"]["build"]["targets"]["wheel"]["force-include"]
    assert include["templates"] == "gpustack/_content/templates"
    assert paths.templates_dir() == root / "templates"  # source checkout
    bundled = tmp_path / "gpustack" / "_content"
    for sub in ("playbooks", "roles", "templates"):
        (bundled / sub).mkdir(parents=True)
    monkeypatch.setattr(paths, "_PACKAGE_DIR", tmp_path / "gpustack")
    assert paths.templates_dir() == bundled / "templates"  # installed wheel
