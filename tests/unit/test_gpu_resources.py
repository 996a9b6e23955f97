"""Pure parts of verification: GPU resource families, free units, UUID comparison."""

from __future__ import annotations

from gpustack.k8s.cluster import gpu_resources
from gpustack.k8s.cluster.verify import compare_uuids, smi_mig_uuids, smi_uuids


def node(**allocatable):
    return {"metadata": {"name": "n"}, "status": {"allocatable": {"cpu": "8", **allocatable}}}


def pod(name, phase="Running", init=None, **limits):
    spec = {"containers": [{"name": "c", "resources": {"limits": limits}}]}
    if init:
        spec["initContainers"] = [{"name": "i", "resources": {"limits": init}}]
    return {"metadata": {"name": name, "namespace": "ml"}, "spec": spec, "status": {"phase": phase}}


def test_both_families_count_and_cpu_does_not():
    allocatable = gpu_resources.gpu_allocatable(
        node(**{"nvidia.com/mig-1g.10gb": "7", "nvidia.com/gpu": "1", "nvidia.com/gpu.shared": "4"})
    )
    assert allocatable == {
        "nvidia.com/gpu": 1,
        "nvidia.com/gpu.shared": 4,
        "nvidia.com/mig-1g.10gb": 7,
    }


def test_free_units_subtract_what_running_pods_hold():
    found = gpu_resources.units(
        node(**{"nvidia.com/gpu": "4"}),
        [
            pod("a", **{"nvidia.com/gpu": "2"}),
            pod("done", phase="Succeeded", **{"nvidia.com/gpu": "2"}),  # finished: frees them
            pod("b", init={"nvidia.com/gpu": "1"}),  # init containers count too
        ],
    )
    unit = found["nvidia.com/gpu"]
    assert (unit.allocatable, unit.used, unit.free, unit.holders) == (4, 3, 1, ["ml/a", "ml/b"])


def test_choose_takes_mig_first_then_the_configured_resource_then_any():
    found = gpu_resources.units(
        node(
            **{"nvidia.com/gpu": "2", "nvidia.com/mig-3g.40gb": "1", "nvidia.com/mig-1g.10gb": "2"}
        ),
        [pod("x", **{"nvidia.com/mig-1g.10gb": "2"})],
    )
    assert gpu_resources.choose(found, "nvidia.com/gpu").resource == "nvidia.com/mig-3g.40gb"
    found = gpu_resources.units(node(**{"nvidia.com/gpu": "2", "nvidia.com/gpu.shared": "8"}), [])
    assert gpu_resources.choose(found, "nvidia.com/gpu.shared").resource == "nvidia.com/gpu.shared"
    assert gpu_resources.choose(found, "nvidia.com/gpu").resource == "nvidia.com/gpu"


def test_nothing_free_means_no_pod_and_says_who_holds_them():
    found = gpu_resources.units(
        node(**{"nvidia.com/gpu": "2"}), [pod("big", **{"nvidia.com/gpu": "2"})]
    )
    assert gpu_resources.choose(found, "nvidia.com/gpu") is None
    message = gpu_resources.busy_message(found)
    assert message.startswith("every GPU unit is in use (2/2 nvidia.com/gpu) by ml/big")
    assert "not disturbed" in message


SMI = (
    "GPU 0: NVIDIA A100-SXM4-80GB (UUID: GPU-aaaa-1)\n"
    "  MIG 1g.10gb     Device  0: (UUID: MIG-bbbb-2)\n"
)


def test_smi_parsing_keeps_gpus_and_mig_devices_apart():
    assert smi_uuids(SMI) == ["GPU-aaaa-1"]
    assert smi_mig_uuids(SMI) == ["MIG-bbbb-2"]


def test_one_unit_must_show_exactly_one_gpu_of_the_host():
    host = ["GPU-aaaa-1", "GPU-aaaa-2"]
    assert compare_uuids(host, ["GPU-aaaa-2"])[0] is True
    ok, message = compare_uuids(host, ["GPU-zzzz-9"])
    assert not ok and message.startswith("GPU UUID mismatch: not on the host GPU-zzzz-9")
    ok, message = compare_uuids(host, host)
    assert not ok and "listed 2 GPUs" in message and "isolation" in message
    assert compare_uuids(host, [])[0] is False
    assert compare_uuids(None, ["GPU-aaaa-1"]) == (
        True,
        "1 GPU seen (GPU-aaaa-1); host UUIDs unknown (no driver facts)",
    )
