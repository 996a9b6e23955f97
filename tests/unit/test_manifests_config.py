"""ClusterConfig from gpustack_k8s_* variables, node labels, and writing manifest files."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpustack.errors import BadInput, ExitCode
from gpustack.k8s.manifests import (
    ClusterConfig,
    check_output_dir,
    config_from_inventory,
    node_labels,
    render,
    write_manifests,
)


def test_defaults_are_a_working_configuration():
    config = ClusterConfig()
    assert config.namespace == "gpustack-system"
    assert config.image("device_plugin") == "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
    assert config.image("gfd") == config.image("device_plugin")
    assert config.sharing == "none" and config.gpus_per_device == 1
    assert (config.daemonset_timeout, config.capacity_timeout, config.verify_timeout) == (
        300,
        150,
        300,
    )
    with pytest.raises(ValidationError):  # frozen: settings are read once
        config.namespace = "other"


def test_from_vars_reads_strings_as_given_by_dash_e():
    config = ClusterConfig.from_vars(
        {
            "gpustack_k8s_namespace": "gpu-ops",
            "gpustack_k8s_time_slicing_replicas": "4",
            "gpustack_k8s_gfd_enabled": "false",
            "gpustack_k8s_rename_by_default": "yes",
            "gpustack_k8s_registry": "",
            "gpustack_k8s_verify_timeout": "600",
            "nvidia_driver_branch": "580",  # not ours: ignored
        }
    )
    assert config.namespace == "gpu-ops"
    assert config.time_slicing_replicas == 4 and config.gpus_per_device == 4
    assert config.gfd_enabled is False and config.rename_by_default is True
    assert config.registry is None and config.verify_timeout == 600
    assert ClusterConfig.from_vars({}) == ClusterConfig()


def _bad(variables: dict) -> BadInput:
    with pytest.raises(BadInput) as info:
        ClusterConfig.from_vars(variables)
    assert info.value.exit_code == ExitCode.BAD_INPUT
    assert info.value.hint
    assert "validation error" not in info.value.message  # no pydantic dump
    assert "\n" not in info.value.message
    return info.value


@pytest.mark.parametrize(
    ("variables", "message", "hint"),
    [
        (
            {"gpustack_k8s_mig_strategy": "auto"},
            "gpustack_k8s_mig_strategy=auto",
            "none, single or mixed",
        ),
        ({"gpustack_k8s_time_slicing_replicas": "0"}, "greater than or equal to 1", "time-slicing"),
        (
            {"gpustack_k8s_time_slicing_replicas": "many"},
            "gpustack_k8s_time_slicing_replicas=many",
            "time-slicing",
        ),
        ({"gpustack_k8s_mps_replicas": "-2"}, "gpustack_k8s_mps_replicas=-2", "MPS"),
        (
            {"gpustack_k8s_device_plugin_image": "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"},
            "not an image repository",
            "without tag",
        ),
        (
            {"gpustack_k8s_dcgm_exporter_image": "Bad Image"},
            "not an image repository",
            "image repository",
        ),
        ({"gpustack_k8s_device_plugin_tag": "v0.20.0:latest"}, "not an image tag", "image tag"),
        ({"gpustack_k8s_registry": "https://registry.local"}, "not a registry", "registry.example"),
        (
            {"gpustack_k8s_vector_add_image": "cuda-sample"},
            "not an image reference with a tag",
            "vectoradd",
        ),
        (
            {"gpustack_k8s_namespace": "GPU_System"},
            "not a valid namespace name",
            "gpustack_k8s_namespace=",
        ),
        (
            {"gpustack_k8s_namespace": "a" * 64},
            "not a valid namespace name",
            "gpustack_k8s_namespace=",
        ),
        (
            {"gpustack_k8s_namespace": "-gpu"},
            "not a valid namespace name",
            "gpustack_k8s_namespace=",
        ),
        ({"gpustack_k8s_gfd_enabled": "maybe"}, "gpustack_k8s_gfd_enabled=maybe", "true or false"),
        (
            {"gpustack_k8s_gfd_mode": "nfd"},
            "gpustack_k8s_gfd_mode=nfd",
            "auto, node-feature-api or feature-file",
        ),
        ({"gpustack_k8s_verify_timeout": "5"}, "gpustack_k8s_verify_timeout=5", "seconds"),
    ],
)
def test_bad_values_are_bad_input_with_a_hint(variables, message, hint):
    error = _bad(variables)
    assert message in error.message
    assert hint in error.hint


def test_unknown_variable_suggests_the_closest_name():
    error = _bad({"gpustack_k8s_mig_stratgy": "mixed"})
    assert error.message == "unknown variable gpustack_k8s_mig_stratgy"
    assert error.hint == "did you mean gpustack_k8s_mig_strategy?"
    error = _bad({"gpustack_k8s_zzzz": "1"})
    assert "docs/kubernetes.md" in error.hint


def test_sharing_combinations_that_cannot_work():
    assert (
        "time-slicing or MPS"
        in _bad(
            {"gpustack_k8s_time_slicing_replicas": "2", "gpustack_k8s_mps_replicas": "2"}
        ).message
    )
    assert (
        "MIG"
        in _bad({"gpustack_k8s_mps_replicas": "2", "gpustack_k8s_mig_strategy": "mixed"}).message
    )


def test_inventory_settings_must_agree_and_dash_e_wins():
    hostvars = {
        "n1": {"gpustack_k8s_namespace": "gpu-a", "ansible_host": "1.2.3.4"},
        "n2": {"gpustack_k8s_namespace": "gpu-b"},
    }
    with pytest.raises(BadInput, match="differs between hosts"):
        config_from_inventory(hostvars, {})
    config = config_from_inventory(hostvars, {"gpustack_k8s_namespace": "gpu-c"})
    assert config.namespace == "gpu-c"
    same = {
        "n1": {"gpustack_k8s_mig_strategy": "single"},
        "n2": {"gpustack_k8s_mig_strategy": "single"},
    }
    assert config_from_inventory(same, {}).mig_strategy == "single"


# -- node labels ---------------------------------------------------------------------------

GPU_FACTS = {"gpus": {"count": 2, "devices": [{"pci_address": "0000:01:00.0"}] * 2}}
NO_GPU_FACTS = {"gpus": {"count": 0, "devices": []}}
ALL_ON = {
    "nvidia.com/gpu.present": "true",
    "nvidia.com/gpu.deploy.device-plugin": "true",
    "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
    "nvidia.com/gpu.deploy.dcgm-exporter": "true",
}


def test_gpu_node_gets_present_and_deploy_labels():
    assert node_labels(GPU_FACTS, {"kubernetes.io/hostname": "n1"}, ClusterConfig()) == ALL_ON


def test_labels_already_set_give_an_empty_patch():
    assert node_labels(GPU_FACTS, dict(ALL_ON), ClusterConfig()) == {}


def test_a_user_set_false_is_never_overwritten():
    existing = {"nvidia.com/gpu.deploy.dcgm-exporter": "false"}
    patch = node_labels(GPU_FACTS, existing, ClusterConfig())
    assert "nvidia.com/gpu.deploy.dcgm-exporter" not in patch
    assert patch["nvidia.com/gpu.deploy.device-plugin"] == "true"
    # and not on a node without GPUs either
    existing = {"nvidia.com/gpu.present": "false", "nvidia.com/gpu.deploy.device-plugin": "false"}
    assert node_labels(NO_GPU_FACTS, existing, ClusterConfig()) == {}


def test_operands_turned_off_lose_their_true_and_a_user_false_stays():
    existing = {**ALL_ON, "nvidia.com/mps.capable": "true",
                "nvidia.com/gpu.deploy.dcgm-exporter": "false"}  # fmt: skip
    config = ClusterConfig(gfd_enabled=False, dcgm_exporter_enabled=False)
    assert node_labels(GPU_FACTS, existing, config) == {
        "nvidia.com/gpu.deploy.gpu-feature-discovery": None,
        "nvidia.com/mps.capable": None,
    }


def test_a_label_paused_by_an_upgrade_or_mig_change_is_left_to_that_run():
    existing = {**ALL_ON, "nvidia.com/gpu.deploy.device-plugin": "paused-for-driver-upgrade",
                "nvidia.com/gpu.deploy.gpu-feature-discovery": "paused-for-mig-change"}  # fmt: skip
    assert node_labels(GPU_FACTS, existing, ClusterConfig()) == {}


def test_deploy_operands_false_keeps_every_operand_off():
    patch = node_labels(GPU_FACTS, {"nvidia.com/gpu.deploy.operands": "false"}, ClusterConfig())
    assert patch == {"nvidia.com/gpu.present": "true"}


def test_disabled_operands_get_no_label():
    config = ClusterConfig(gfd_enabled=False, dcgm_exporter_enabled=False)
    assert node_labels(GPU_FACTS, {}, config) == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.deploy.device-plugin": "true",
    }


def test_mps_marks_the_node_mps_capable():
    patch = node_labels(GPU_FACTS, {}, ClusterConfig(mps_replicas=2))
    assert patch["nvidia.com/mps.capable"] == "true"
    assert "nvidia.com/mps.capable" not in node_labels(GPU_FACTS, {}, ClusterConfig())


def test_node_without_gpus_loses_the_true_labels():
    existing = {**ALL_ON, "nvidia.com/gpu.deploy.gpu-feature-discovery": "false", "team": "a"}
    assert node_labels(NO_GPU_FACTS, existing, ClusterConfig()) == {
        "nvidia.com/gpu.present": None,
        "nvidia.com/gpu.deploy.device-plugin": None,
        "nvidia.com/gpu.deploy.dcgm-exporter": None,
    }
    assert node_labels({}, {}, ClusterConfig()) == {}  # no facts: nothing to say


# -- manifest files ------------------------------------------------------------------------


def test_write_manifests_creates_ordered_files(tmp_path):
    target = tmp_path / "out"
    written = write_manifests(render(ClusterConfig(), servicemonitor=True), target)
    names = sorted(p.name for p in written)
    assert names == sorted(p.name for p in target.iterdir())
    assert names[:2] == ["00-namespace.yaml", "10-runtimeclass.yaml"]
    assert "50-servicemonitor-dcgm-exporter.yaml" in names
    assert all(p.read_text().startswith("# Generated by `gpustack manifests`") for p in written)


def test_rewrite_replaces_own_files_and_removes_stale_ones(tmp_path):
    write_manifests(render(ClusterConfig(), servicemonitor=True), tmp_path)
    (tmp_path / ".gitkeep").write_text("")
    written = write_manifests(render(ClusterConfig(gfd_enabled=False)), tmp_path)
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {p.name for p in written} | {".gitkeep"}
    assert "30-daemonset-gpu-feature-discovery.yaml" not in names
    assert "50-servicemonitor-dcgm-exporter.yaml" not in names


def test_refuses_a_directory_with_foreign_files_and_writes_nothing(tmp_path):
    (tmp_path / "kustomization.yaml").write_text("resources: []\n")
    with pytest.raises(BadInput, match="did not write") as info:
        write_manifests(render(ClusterConfig()), tmp_path)
    assert info.value.exit_code == ExitCode.BAD_INPUT
    assert [p.name for p in tmp_path.iterdir()] == ["kustomization.yaml"]


def test_a_hand_edited_lookalike_is_foreign(tmp_path):
    (tmp_path / "00-namespace.yaml").write_text("apiVersion: v1\nkind: Namespace\n")
    with pytest.raises(BadInput):
        check_output_dir(tmp_path)
    (tmp_path / "00-namespace.yaml").unlink()
    (tmp_path / "sub").mkdir()
    with pytest.raises(BadInput):
        check_output_dir(tmp_path)


def test_output_dir_that_is_a_file(tmp_path):
    path = tmp_path / "file"
    path.write_text("x")
    with pytest.raises(BadInput, match="not a directory"):
        check_output_dir(path)


def _inventory_dir(path, n2_vars=None):
    from gpustack.ansible.inventory import load_inventory

    path.mkdir()
    (path / "group_vars").mkdir()
    (path / "hosts.ini").write_text(
        "[gpu_nodes]\nn1\nn2\n[gpu_nodes:vars]\ngpustack_k8s_mig_strategy=single\n"
        "[all:vars]\ngpustack_k8s_namespace=from-ini\n"
    )
    (path / "group_vars" / "all.yml").write_text("gpustack_k8s_time_slicing_replicas: 2\n")
    if n2_vars:
        (path / "host_vars").mkdir()
        (path / "host_vars" / "n2.yml").write_text(n2_vars)
    return load_inventory(path / "hosts.ini")


def test_inventory_group_vars_are_read_as_a_play_reads_them(tmp_path):
    inventory = _inventory_dir(tmp_path / "a")
    assert config_from_inventory(inventory, {}).time_slicing_replicas == 2
    config = config_from_inventory(inventory, {"gpustack_k8s_time_slicing_replicas": "3"})
    assert (config.namespace, config.mig_strategy, config.time_slicing_replicas) == (
        "from-ini",
        "single",
        3,
    )
    # Ansible caches vars files per process, hence one directory per inventory.
    inventory = _inventory_dir(tmp_path / "b", "gpustack_k8s_namespace: other\n")
    with pytest.raises(BadInput, match="differs between hosts"):
        config_from_inventory(inventory, {})
    inventory = _inventory_dir(tmp_path / "c", "gpustack_k8s_namespace: '{{ ns }}'\n")
    with pytest.raises(BadInput, match="is a template that needs what only a play has"):
        config_from_inventory(inventory, {})
