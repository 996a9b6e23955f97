"""Pure parts of MIG on Kubernetes: the strategy a layout implies, what the device plugin should
advertise for it (k8s-device-plugin's rules), drift, and which client labels are paused."""

import pytest

from gpustack.fleet.mig import derive_strategy, expected_resources, node_strategy, resource_drift
from gpustack.k8s.cluster.mig import PAUSED, paused_values


def gpu(desired=None, mode="Enabled", capable=True, applied=None):
    return {"mig_capable": capable, "desired_mode": mode, "desired": desired,
            "mode_current": mode, "applied": applied if applied is not None else desired}  # fmt: skip


OFF = gpu(None, mode="Disabled")
ALL_1G = gpu({"1g.10gb": 7})
BALANCED = gpu({"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1})
EMPTY = gpu({})  # all-enabled: MIG on, no instances
NOT_CAPABLE = gpu(None, mode="[N/A]", capable=False)


@pytest.mark.parametrize(
    ("gpus", "strategy"),
    [
        ([OFF, OFF], "none"),
        ([ALL_1G, ALL_1G], "single"),
        ([ALL_1G, OFF], "mixed"),  # the device plugin refuses single with mixed MIG modes
        ([BALANCED], "mixed"),  # more than one MIG device type
        ([ALL_1G, gpu({"3g.40gb": 2})], "mixed"),
        ([EMPTY], "mixed"),  # single needs MIG devices on every MIG GPU
        ([ALL_1G, NOT_CAPABLE], "single"),  # a GPU without MIG does not count
        ([], "none"),
    ],
)  # fmt: skip
def test_node_strategy(gpus, strategy):
    assert node_strategy(gpus) == strategy


def test_cluster_strategy():
    assert derive_strategy({"a": [OFF], "b": [OFF]}) == "none"
    assert derive_strategy({"a": [ALL_1G], "b": [OFF]}) == "single"
    assert derive_strategy({"a": [ALL_1G], "b": [gpu({"3g.40gb": 2})]}) == "single"
    assert derive_strategy({"a": [ALL_1G], "b": [BALANCED]}) == "mixed"


def test_expected_resources_follow_the_device_plugin():
    gpus = [ALL_1G, BALANCED, OFF]
    assert expected_resources(gpus, "none") == {"nvidia.com/gpu": 3}
    assert expected_resources(gpus, "mixed") == {
        "nvidia.com/mig-1g.10gb": 9, "nvidia.com/mig-2g.20gb": 1, "nvidia.com/mig-3g.40gb": 1,
        "nvidia.com/gpu": 1}  # fmt: skip
    assert expected_resources([ALL_1G, ALL_1G], "single") == {"nvidia.com/gpu": 14}
    assert expected_resources([EMPTY], "mixed") == {}
    applied_differs = gpu({"1g.10gb": 7}, applied={"1g.10gb": 3})
    assert expected_resources([applied_differs], "mixed", desired=False) == {
        "nvidia.com/mig-1g.10gb": 3
    }


def test_resource_drift_names_each_difference():
    assert resource_drift({"nvidia.com/mig-1g.10gb": 7},
                          {"nvidia.com/mig-1g.10gb": "7", "nvidia.com/gpu": "0", "cpu": "8"}) == ""  # fmt: skip
    assert resource_drift({"nvidia.com/mig-1g.10gb": 7}, {"nvidia.com/gpu": "1"}) == (
        "nvidia.com/gpu: 1 (layout: 0), nvidia.com/mig-1g.10gb: 0 (layout: 7)"
    )


def test_paused_values_leave_forced_off_and_absent_labels_alone():
    labels = {
        "nvidia.com/gpu.deploy.device-plugin": "true",
        "nvidia.com/gpu.deploy.dcgm-exporter": "false",
        "nvidia.com/gpu.deploy.gpu-feature-discovery": PAUSED,  # an earlier run's: not re-recorded
        "other": "x",
    }
    assert paused_values(labels) == {"nvidia.com/gpu.deploy.device-plugin": "true"}
