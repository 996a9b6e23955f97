"""Pure parts of MIG on Kubernetes: the strategy a layout implies, what the device plugin should
advertise for it (k8s-device-plugin's rules), drift, and which client labels are paused."""

import pytest

from gpustack.fleet.mig import derive_strategy, expected_resources, node_strategy, resource_drift
from gpustack.k8s.cluster.mig import PAUSED
from gpustack.k8s.cluster.pause import paused_clients, paused_values


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


def test_the_dra_kubelet_plugin_is_a_client_and_another_reasons_pause_is_left_alone():
    labels = {
        "nvidia.com/gpu.deploy.dra-driver": "true",
        "nvidia.com/gpu.deploy.dcgm-exporter": "paused-for-driver-upgrade",
        "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
    }
    assert paused_values(labels) == {"nvidia.com/gpu.deploy.dra-driver": "true",
                                     "nvidia.com/gpu.deploy.gpu-feature-discovery": "true"}  # fmt: skip
    assert paused_clients(labels) == {"dcgm-exporter": "driver-upgrade"}


def test_a_real_driver_s_no_mig_devices_answer_with_exit_0_reads_as_no_instances():
    """Driver 580.159.04 on an H100 (lead's capture): `nvidia-smi mig -lgi/-lci` print "No
    MIG-enabled devices found." with exit 0 (the fixture exits 6). Both read as no instances."""
    from tests.unit.mig_local import apply, plan

    smi = apply.smi  # the module the role's applier reads GPUs with
    answer = "No MIG-enabled devices found."
    assert plan.parse_lgi(answer) == [] and plan.parse_lci(answer) == []

    class Host:
        smi = "nvidia-smi"

        def __init__(self, code):
            self.code = code

        def run(self, argv):
            if "--query-gpu" in argv[1]:
                return 0, ("0, GPU-a, NVIDIA H100 80GB HBM3, 00000000:18:00.0, 0x233010DE, "
                           "0x16C110DE, Enabled, Enabled")  # fmt: skip
            return (self.code, answer) if argv[2] in ("-lgi", "-lci") else (0, "")

    for code in (0, 6):  # the real driver's exit code, the fixture's
        gpus, error = smi.read_gpus(Host(code))
        assert error is None and gpus[0]["instances"] == {} and gpus[0]["empty_gis"] == 0
