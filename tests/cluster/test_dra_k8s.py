"""gpustack_k8s_gpu_allocation=dra against the emulator: NVIDIA's DRA driver instead of the plugin.

What this shows: gpustack renders and applies the DRA kubelet plugin, DeviceClasses and RBAC
through the real client; the emulated plugin (SIMULATED, tests/cluster/emulator/images.py)
publishes ResourceSlices; verification pods get their GPU through a ResourceClaimTemplate that
the emulated scheduler allocates (tests/cluster/emulator/dra.py). Nothing here ran NVIDIA's DRA
driver or a real kube-apiserver, scheduler or kubelet.

What a real control plane can show moved to tests/kube/test_dra.py (validation, the
resourceclaim controller, kube-scheduler's allocation, install/uninstall/status/check mode,
MIG devices, busy nodes, the verification pods' output), and a cluster without
resource.k8s.io/v1 to tests/kube/test_dra_without_api.py (a real API server with the group
switched off by `--runtime-config`). Left here: the plugin image failing without a driver, the
kubelet's refusal of a pod whose claim was never allocated, the emulated runtime's view of a CUDA
image next to CDI devices, and the emulator's own CEL guard.
"""

from __future__ import annotations

import pytest

from gpustack.k8s.cluster import flow
from tests.cluster.emulator.errors import ApiError
from tests.cluster.helpers import gpu_cluster, gpu_facts, inventory, run_result

NS = "gpustack-system"
DRA = {"gpustack_k8s_gpu_allocation": "dra"}
RES = "resource.k8s.io/v1"


def session_for(kubeconfig, hosts, extravars=None):
    extravars = DRA if extravars is None else extravars
    return flow.prepare(str(kubeconfig), inventory(kubeconfig.parent, hosts), extravars)


def test_a_node_without_the_dra_plugin_running_fails_the_devices_check(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 1})
    emu.hardware("gpu1").driver = None  # the driver is not loaded: the plugin cannot start
    emu.hardware_changed()
    facts = {"gpu1": gpu_facts("gpu1", 1)}

    report = flow.install(session_for(kubeconfig, ["gpu1"]), run_result(facts), clock=clock)

    assert not report.passed
    operands = report.nodes[0].check("operands")
    assert (
        operands.status == "failed" and "nvidia-dra-driver-gpu-kubelet-plugin" in operands.message
    )
    assert emu.objects(RES, "ResourceSlice") == []


# -- what the emulator's resource.k8s.io/v1 models that the real control plane with kwok nodes
# -- cannot show (the API server's own rules moved to tests/kube/test_dra.py) ---------------


def _claim_template(emu, name, request=None, namespace="default"):
    request = request or {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
    return emu.create({
        "apiVersion": RES, "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    })  # fmt: skip


def _workload(name, template, node_name=None, runtime_class=None):
    spec = {
        "restartPolicy": "Never",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        "containers": [{"name": "c", "image": "example/train:1",
                        "resources": {"claims": [{"name": "gpu"}]}}],
    }  # fmt: skip
    if node_name:
        spec["nodeName"] = node_name
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"}, "spec": spec}  # fmt: skip


def _dra_installed(emu, kubeconfig, clock, gpus=1):
    gpu_cluster(emu, {"gpu1": gpus})
    facts = {"gpu1": gpu_facts("gpu1", gpus)}
    assert flow.install(session_for(kubeconfig, ["gpu1"]), run_result(facts), clock=clock).passed


def test_device_class_cel_outside_the_emulated_subset_is_refused(cluster):
    with pytest.raises(ApiError) as caught:
        cluster.emulator.create({
            "apiVersion": RES, "kind": "DeviceClass", "metadata": {"name": "x"},
            "spec": {"selectors": [{"cel": {"expression": "device.capacity['m'].memory > 1"}}]},
        })  # fmt: skip
    assert caught.value.code == 422 and "the emulator evaluates only" in caught.value.message


def test_a_pod_bound_by_node_name_never_gets_its_claim(cluster, kubeconfig, clock):
    emu = cluster.emulator
    _dra_installed(emu, kubeconfig, clock)
    _claim_template(emu, "one-gpu")

    emu.create(_workload("pinned", "one-gpu", node_name="gpu1"))

    pod = emu.get("v1", "Pod", "pinned", "default")
    assert pod["status"]["phase"] == "Pending"
    claim = emu.objects(RES, "ResourceClaim", "default")[0]
    assert "allocation" not in (claim.get("status") or {})
    events = [e for e in emu.objects("v1", "Event", "default")
              if e["involvedObject"]["name"] == "pinned"]  # fmt: skip
    assert any(e["reason"] == "FailedPrepareDynamicResources" and "not reserved" in e["message"]
               for e in events)  # fmt: skip


def test_the_nvidia_runtime_exposes_every_gpu_to_a_dra_pod_with_a_cuda_image(
    cluster, kubeconfig, clock
):
    """Why gpustack's DRA verification pod sets no runtimeClassName (SIMULATED model of the
    nvidia runtime honouring NVIDIA_VISIBLE_DEVICES=all next to the claim's CDI devices)."""
    from tests.cluster.emulator import PodFate  # noqa: F401  (workload policy not needed)

    emu = cluster.emulator
    _dra_installed(emu, kubeconfig, clock, gpus=2)
    _claim_template(emu, "one-gpu")
    for name, runtime in (("cdi-only", None), ("with-runtime", "nvidia")):
        pod = _workload(name, "one-gpu", runtime_class=runtime)
        pod["spec"]["containers"][0].update(
            image="nvcr.io/nvidia/cuda:12", command=["nvidia-smi", "-L"]
        )
        emu.create(pod)
    logs = {}
    for name in ("cdi-only", "with-runtime"):
        pod = emu.get("v1", "Pod", name, "default")
        logs[name] = emu.kubelet.log(pod, None)
    assert logs["cdi-only"].count("UUID: GPU-") == 1
    assert logs["with-runtime"].count("UUID: GPU-") == 2
