"""The upgrade's validation judges its verification pod by verify's own `pod` check: what
nvidia-smi printed in the pod must show one of the host's GPUs, not only a pod that exited 0."""

from __future__ import annotations

import pytest

from gpustack.k8s.cluster.upgrade import _judged
from gpustack.k8s.cluster.verify import dra_pod_verdict, host_gpus, pod_verdict
from gpustack.k8s.manifests import ClusterConfig
from gpustack.upgrade.backend import HostOnlyBackend, StepFailed
from tests.builders import smi_output, uuids_for
from tests.conftest import ROOT
from tests.unit.test_upgrade_orchestrator import new_run, orchestrate
from tests.upgrade_doubles import FakeHostUpgrader

REAL = ROOT / "tests" / "fixtures" / "gpu-host" / "h100-nvidia-smi-L.txt"  # a real H100's
H100 = "GPU-ebfab540-029d-5747-e4f8-7a648117c213"
DEVICE_PLUGIN = ClusterConfig()
HAMI = ClusterConfig(gpu_allocation="hami", hami_verify_memory=1024)


def test_the_real_h100_listing_passes_when_its_gpu_is_the_hosts():
    ok, message = pod_verdict(DEVICE_PLUGIN, [H100], REAL.read_text(encoding="utf-8"))
    assert ok, message
    assert _judged("gpu1", ok, message) == (
        f"verification pod succeeded: GPU {H100} seen, UUID matches one of the host's 1"
    )


@pytest.mark.parametrize(
    ("output", "reason"),
    [
        ("", "nvidia-smi in the pod listed no GPU"),
        (smi_output(uuids_for("gpu2", 1)),
         f"GPU UUID mismatch: not on the host {uuids_for('gpu2', 1)[0]}; the host has {H100}"),
        (smi_output([H100, *uuids_for("gpu2", 1)]),
         "the pod asked for one unit but nvidia-smi in it listed 2 GPUs"),
    ],
    ids=["no-gpu", "another-nodes-gpu", "two-gpus"],
)  # fmt: skip
def test_a_pod_that_exited_0_without_the_hosts_gpu_fails_validation(output, reason):
    ok, message = pod_verdict(DEVICE_PLUGIN, [H100], output)
    assert not ok
    with pytest.raises(StepFailed) as failed:
        _judged("gpu1", ok, message)
    assert str(failed.value).startswith(f"validation: verification pod on gpu1: {reason}")


def test_without_the_hosts_uuids_one_gpu_is_enough_and_none_is_not():
    assert pod_verdict(DEVICE_PLUGIN, None, smi_output([H100])) == (
        True, f"1 GPU seen ({H100}); host UUIDs unknown (no driver facts)")  # fmt: skip
    assert not pod_verdict(DEVICE_PLUGIN, None, "")[0]


def test_under_hami_the_csv_listing_and_the_memory_limit_are_judged():
    limited = f"NVIDIA H100 80GB HBM3, {H100}, 1024 MiB\n"
    whole = f"NVIDIA H100 80GB HBM3, {H100}, 81559 MiB\n"
    assert pod_verdict(HAMI, [H100], limited)[0]
    ok, message = pod_verdict(HAMI, [H100], whole)
    assert not ok and "HAMi-core's memory limit is not in effect" in message
    # an -L listing is not what HAMi's pod prints: no GPU seen
    assert pod_verdict(HAMI, [H100], REAL.read_text(encoding="utf-8")) == (
        False, "nvidia-smi in the pod listed no GPU")  # fmt: skip


def test_under_dra_the_gpu_must_also_be_one_the_nodes_slices_publish():
    device = {"name": "gpu-0", "attributes": {"uuid": {"string": H100}}}
    ok, message = dra_pod_verdict([H100], smi_output([H100]), [device])
    assert ok and message.endswith("one of the devices gpu.nvidia.com publishes for the node")
    ok, message = dra_pod_verdict([H100], smi_output([H100]), [])
    assert not ok and "do not publish: the GPU did not come from the DRA driver" in message
    assert not dra_pod_verdict([H100], smi_output(uuids_for("gpu2", 1)), [device])[0]


def test_the_expected_gpus_are_those_the_driver_role_read():
    role = {"gpus": [{"name": "NVIDIA H100 80GB HBM3", "uuid": H100, "memory_mib": 81559}],
            "nvidia_smi": {"rc": "0", "message": "ok"}}  # fmt: skip
    assert host_gpus({"gpustack_driver": role}).uuids == [H100]
    failed_smi = {"gpus": [], "nvidia_smi": {"rc": "9", "message": "failed"}}
    assert host_gpus({"gpustack_driver": failed_smi}).uuids is None
    # a run recorded before validation kept the GPUs: unknown, not "none"
    assert host_gpus({"gpustack_driver": {"installed_version": "x"}}).uuids is None


class RecordingBackend(HostOnlyBackend):
    def __init__(self):
        self.drivers: dict[str, dict | None] = {}

    def validate(self, name, clock, opts, driver=None):
        self.drivers[name] = driver
        return "validated"


def test_the_orchestrator_hands_validation_the_gpus_the_driver_role_read():
    backend = RecordingBackend()
    uuids = {"node1": uuids_for("node1", 2)}
    result = orchestrate(new_run(2), FakeHostUpgrader(gpus=uuids), backend=backend).execute()
    assert result.status == "done"
    assert [g["uuid"] for g in backend.drivers["node1"]["gpus"]] == uuids["node1"]
    assert host_gpus({"gpustack_driver": backend.drivers["node1"]}).uuids == uuids["node1"]
    assert "gpus" not in backend.drivers["node2"]  # the role published none: unknown
