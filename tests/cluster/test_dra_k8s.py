"""gpustack_k8s_gpu_allocation=dra against the emulator: NVIDIA's DRA driver instead of the plugin.

What this shows: gpustack renders and applies the DRA kubelet plugin, DeviceClasses and RBAC
through the real client; the emulated plugin (SIMULATED, tests/cluster/emulator/images.py)
publishes ResourceSlices; verification pods get their GPU through a ResourceClaimTemplate that
the emulated scheduler allocates (tests/cluster/emulator/dra.py). Nothing here ran NVIDIA's DRA
driver or a real kube-apiserver, scheduler or kubelet.
"""

from __future__ import annotations

import copy

import pytest

from gpustack.errors import BadInput
from gpustack.k8s.cluster import flow
from tests.cluster.emulator.errors import ApiError
from tests.cluster.helpers import gpu_cluster, gpu_facts, inventory, run_result, verify_pods

NS = "gpustack-system"
DRA = {"gpustack_k8s_gpu_allocation": "dra"}
RES = "resource.k8s.io/v1"


def session_for(kubeconfig, hosts, extravars=None):
    extravars = DRA if extravars is None else extravars
    return flow.prepare(str(kubeconfig), inventory(kubeconfig.parent, hosts), extravars)


def test_dra_install_publishes_devices_and_verifies_each_node_with_a_claim(
    cluster, kubeconfig, clock
):
    emu = cluster.emulator
    uuids = gpu_cluster(emu, {"gpu1": 2, "gpu2": 1})
    facts = {"gpu1": gpu_facts("gpu1", 2), "gpu2": gpu_facts("gpu2", 1)}

    report = flow.install(session_for(kubeconfig, ["gpu1", "gpu2"]), run_result(facts), clock=clock)

    assert report.passed, report.to_dict()
    for node in report.nodes:
        assert [c.name for c in node.checks] == ["node", "gpus", "operands", "devices", "pod", "gfd"]
        assert node.check("pod").status == "passed", node.check("pod").message
        assert "one of the devices gpu.nvidia.com publishes" in node.check("pod").message
    applied = {(a.kind, a.name) for a in report.applied}
    assert ("DeviceClass", "gpu.nvidia.com") in applied
    assert ("DaemonSet", "nvidia-dra-driver-gpu-kubelet-plugin") in applied
    assert ("DaemonSet", "nvidia-device-plugin") not in applied
    assert emu.get("apps/v1", "DaemonSet", "nvidia-device-plugin", NS) is None
    # the emulated kubelet plugin published one slice per node, one device per GPU
    slices = {s["spec"]["nodeName"]: s for s in emu.objects(RES, "ResourceSlice")}
    assert sorted(slices) == ["gpu1", "gpu2"]
    published = [d["attributes"]["uuid"]["string"] for d in slices["gpu1"]["spec"]["devices"]]
    assert published == uuids["gpu1"]
    labels = emu.get("v1", "Node", "gpu1")["metadata"]["labels"]
    assert labels["nvidia.com/gpu.deploy.dra-driver"] == "true"
    assert "nvidia.com/gpu.deploy.device-plugin" not in labels
    # the pods went through the scheduler (no nodeName in what gpustack posted)
    posted = emu.request_bodies("POST", f"/api/v1/namespaces/{NS}/pods")
    assert len(posted) == 2 and all("nodeName" not in p["spec"] for p in posted)
    assert all("runtimeClassName" not in p["spec"] for p in posted)
    # cleaned up: pods, their generated claims (GC), the template
    assert verify_pods(emu) == []
    assert emu.objects(RES, "ResourceClaim", NS) == []
    assert emu.objects(RES, "ResourceClaimTemplate", NS) == []
    assert emu.count("POST", f"/apis/{RES}/namespaces/{NS}/resourceclaimtemplates") == 1


def _store_snapshot(emu):
    with emu.lock:
        return copy.deepcopy(emu.store.objects), emu.store.rv


def test_a_cluster_without_resource_k8s_io_v1_is_refused_before_anything_is_applied(
    cluster, kubeconfig, clock
):
    emu = cluster.emulator
    emu.without_dra()
    gpu_cluster(emu, {"gpu1": 1})
    before = _store_snapshot(emu)
    writes_before = sum(emu.count(m) for m in ("POST", "PUT", "PATCH", "DELETE"))

    with pytest.raises(BadInput) as caught:
        session_for(kubeconfig, ["gpu1"])

    assert "resource.k8s.io/v1" in caught.value.message
    assert "does not serve" in caught.value.message and "nothing was applied" in caught.value.message
    assert "1.34" in caught.value.hint and "device-plugin" in caught.value.hint
    assert _store_snapshot(emu) == before
    assert sum(emu.count(m) for m in ("POST", "PUT", "PATCH", "DELETE")) == writes_before


def test_the_same_cluster_is_accepted_with_the_device_plugin(cluster, kubeconfig):
    emu = cluster.emulator
    emu.without_dra()
    session = session_for(kubeconfig, ["gpu1"], extravars={})
    assert session is not None and session.config.gpu_allocation == "device-plugin"
