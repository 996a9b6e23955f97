"""Every operand's environment and securityContext in every mode gpustack renders.

The modes: MIG strategy none/single/mixed, sharing with and without renameByDefault, the
CPU manager compatibility, and GPUs allocated through DRA or HAMi. Field-by-field values against
upstream live in docs/upstream-parity.yaml (tests/unit/test_upstream_parity.py); these tests
state the rules behind them, for every mode at once.
"""

from __future__ import annotations

import pytest

from gpustack.k8s.manifests import ClusterConfig, render

MODES = {
    "mig-none": {},
    "mig-single": {"mig_strategy": "single"},
    "mig-mixed": {"mig_strategy": "mixed"},
    "mig-single-time-slicing": {"mig_strategy": "single", "time_slicing_replicas": 2},
    "time-slicing-renamed": {"time_slicing_replicas": 4, "rename_by_default": True},
    "mps-renamed": {"mps_replicas": 4, "rename_by_default": True},
    "cpu-manager": {"compat_with_cpu_manager": True},
    "cpu-manager-mig-mixed": {"compat_with_cpu_manager": True, "mig_strategy": "mixed"},
    "dra": {"gpu_allocation": "dra"},
    "dra-mig-mixed": {"gpu_allocation": "dra", "mig_strategy": "mixed"},
    "hami": {"gpu_allocation": "hami", "hami_kube_scheduler_tag": "v1.36.3"},
    "volcano": {"gpu_allocation": "volcano"},
    "gfd-node-feature-api": {"gfd_mode": "node-feature-api"},
}


def _containers(settings: dict) -> list[tuple[str, dict]]:
    out = []
    for obj in render(ClusterConfig(**settings)):
        if obj["kind"] != "DaemonSet":
            continue
        spec = obj["spec"]["template"]["spec"]
        for container in spec.get("initContainers", []) + spec["containers"]:
            out.append((f"{obj['metadata']['name']}/{container['name']}", container))
    return out


def _env(container: dict) -> dict[str, str | None]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def _has_cap_sys_admin(container: dict) -> bool:
    context = container.get("securityContext") or {}
    added = (context.get("capabilities") or {}).get("add") or []
    return bool(context.get("privileged")) or "SYS_ADMIN" in added


@pytest.mark.parametrize("mode", sorted(MODES))
def test_mig_capability_requests_come_with_cap_sys_admin(mode):
    """The toolkit's legacy hook refuses to start a container that sets
    NVIDIA_MIG_MONITOR_DEVICES or NVIDIA_MIG_CONFIG_DEVICES without CAP_SYS_ADMIN in its
    bounding set ("cannot set MIG_MONITOR_DEVICES in non privileged container",
    NVIDIA/nvidia-container-toolkit cmd/nvidia-container-runtime-hook/container_config.go
    @v1.20.0 and @v1.17.8, where legacy is the default mode); the device plugin chart pairs
    the two (nvidia-device-plugin.requiresCapSysAdmin and addMigMonitorDevices)."""
    checked = 0
    for name, container in _containers(MODES[mode]):
        env = _env(container)
        for variable in ("NVIDIA_MIG_MONITOR_DEVICES", "NVIDIA_MIG_CONFIG_DEVICES"):
            if env.get(variable):
                checked += 1
                assert _has_cap_sys_admin(container), f"{name} sets {variable} without SYS_ADMIN"
    if MODES[mode].get("mig_strategy", "none") != "none":
        assert checked, "a MIG mode renders no container that monitors MIG devices"


@pytest.mark.parametrize("strategy", ["none", "single", "mixed"])
def test_gfd_monitors_mig_devices_only_with_a_mig_strategy(strategy):
    """As the chart's daemonset-gfd.yml (addMigMonitorDevices) and the operator's
    applyMIGConfiguration: NVIDIA_MIG_MONITOR_DEVICES=all only when MIG is possible. With
    strategy none GFD runs with every capability dropped, where the variable made the
    legacy hook refuse the container."""
    (gfd,) = [c for n, c in _containers({"mig_strategy": strategy}) if n.startswith("gpu-feat")]
    env = _env(gfd)
    if strategy == "none":
        assert "NVIDIA_MIG_MONITOR_DEVICES" not in env
        assert gfd["securityContext"] == {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        }
    else:
        assert env["NVIDIA_MIG_MONITOR_DEVICES"] == "all"
        assert gfd["securityContext"] == {"capabilities": {"add": ["SYS_ADMIN"]}}
    assert env["MIG_STRATEGY"] == strategy


@pytest.mark.parametrize("mode", sorted(MODES))
def test_device_plugin_and_gfd_agree_on_the_mig_environment(mode):
    """The plugin and GFD read one config file; their MIG variables follow the same rule."""
    by_name = dict(_containers(MODES[mode]))
    plugin = by_name.get("nvidia-device-plugin/nvidia-device-plugin")
    gfd = by_name["gpu-feature-discovery/gpu-feature-discovery"]
    strategy = MODES[mode].get("mig_strategy", "none")
    for container in filter(None, (plugin, gfd)):
        env = _env(container)
        assert env["MIG_STRATEGY"] == strategy
        assert ("NVIDIA_MIG_MONITOR_DEVICES" in env) == (strategy != "none")


@pytest.mark.parametrize("mode", sorted(m for m in MODES if MODES[m].get("rename_by_default")))
def test_renaming_shared_resources_changes_no_environment(mode):
    """renameByDefault lives in the config file only (api/config/v1 sharing.go): upstream's
    charts render the same env and securityContext with and without it."""
    settings = MODES[mode]
    plain = {k: v for k, v in settings.items() if k != "rename_by_default"}
    renamed = {n: (_env(c), c.get("securityContext")) for n, c in _containers(settings)}
    unrenamed = {n: (_env(c), c.get("securityContext")) for n, c in _containers(plain)}
    assert renamed == unrenamed
