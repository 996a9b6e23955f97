"""Waiting and verification outcomes against the emulator (fake clock: timeouts cost no time).

Every outcome here comes from what the emulated cluster does with the rendered manifests and
the SIMULATED node hardware (tests/cluster/helpers.py): no test sets a DaemonSet's or a
pod's status.
"""

from __future__ import annotations

import pytest

from gpustack.k8s.cluster import flow
from tests.cluster.emulator import SERVICEMONITOR_CRD, PodFate
from tests.cluster.helpers import (
    gpu_cluster,
    gpu_facts,
    inventory,
    no_gpu_facts,
    run_result,
    smi_output,
    uuids_for,
    verify_pods,
)

NS = "gpustack-system"
PLUGIN_IMAGE = "nvcr.io/nvidia/k8s-device-plugin:v0.20.0"
VERIFY_IMAGE = "nvcr.io/nvidia/cuda:12.9.1-base-ubuntu22.04"


def install(kubeconfig, clock, facts, hostvars=None, extravars=None, failed=()):
    session = flow.prepare(
        str(kubeconfig), inventory(kubeconfig.parent, list(facts), hostvars), extravars or {}
    )
    return flow.install(session, run_result(facts, failed), clock=clock)


def checks(report, host):
    node = next(n for n in report.nodes if n.host == host)
    return {c.name: (c.status, c.message) for c in node.checks}


def test_waits_for_daemonsets_to_become_ready(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 1})
    emu.pause_kubelet("gpu1")  # the node's kubelet is slow to start the operand pods
    clock.on_sleep = lambda t: emu.resume_kubelet("gpu1") if t >= 5 else None

    report = install(kubeconfig, clock, {"gpu1": gpu_facts("gpu1", 1)})

    assert report.passed, report.to_dict()
    assert 5 <= clock.t < 10  # it polled until the pods ran, not longer
    assert all(d.ready for d in report.daemonsets)


def test_daemonsets_never_ready_fail_the_node(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 1})
    emu.unpullable.add(PLUGIN_IMAGE)  # not mirrored into this (air-gapped) registry

    report = install(
        kubeconfig,
        clock,
        {"gpu1": gpu_facts("gpu1", 1)},
        extravars={"gpustack_k8s_daemonset_timeout": 20},
    )

    assert not report.passed
    status, message = checks(report, "gpu1")["operands"]
    assert status == "failed"
    assert "nvidia-device-plugin not ready after 20 s: 0/1 ready" in message
    assert "capacity" not in checks(report, "gpu1")
    assert emu.count("POST", f"/api/v1/namespaces/{NS}/pods") == 0
    pod = emu.objects("v1", "Pod", NS, selector="app.kubernetes.io/name=nvidia-device-plugin")[0]
    assert pod["status"]["containerStatuses"][0]["state"]["waiting"]["reason"] == "ErrImagePull"


def test_capacity_timeout_says_what_was_expected(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 2}, unhealthy={"gpu1": 1})  # one GPU fell off the bus

    report = install(
        kubeconfig,
        clock,
        {"gpu1": gpu_facts("gpu1", 2)},
        extravars={"gpustack_k8s_capacity_timeout": 30},
    )

    status, message = checks(report, "gpu1")["capacity"]
    assert status == "failed"
    assert "allocatable nvidia.com/gpu is 1 after 30 s, expected 2 (2 GPU(s))" in message
    assert "device plugin" in message
    assert 30 <= clock.t < 32
    assert emu.count("POST", f"/api/v1/namespaces/{NS}/pods") == 0
    node = emu.get("v1", "Node", "gpu1")["status"]
    assert (node["capacity"]["nvidia.com/gpu"], node["allocatable"]["nvidia.com/gpu"]) == ("2", "1")


def test_time_slicing_capacity_and_a_one_unit_verification_pod(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 2})

    report = install(
        kubeconfig,
        clock,
        {"gpu1": gpu_facts("gpu1", 2)},
        extravars={"gpustack_k8s_time_slicing_replicas": "4"},
    )

    assert report.passed, report.to_dict()
    assert checks(report, "gpu1")["capacity"] == ("passed", "nvidia.com/gpu: 8")
    bodies = emu.request_bodies("POST", f"/api/v1/namespaces/{NS}/pods")
    resources = [b["spec"]["containers"][0]["resources"] for b in bodies]
    assert resources == [{"requests": {"nvidia.com/gpu": 1}, "limits": {"nvidia.com/gpu": 1}}]


def test_pod_failed_reports_exit_code_and_log(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 1})
    # SIMULATED host-side failure of the verification container (a broken runtime hook).
    emu.pod_policy = lambda pod: PodFate.failed(
        "Failed to initialize NVML: Unknown Error\n", exit_code=255
    )

    report = install(kubeconfig, clock, {"gpu1": gpu_facts("gpu1", 1)})

    status, message = checks(report, "gpu1")["pod"]
    assert status == "failed"
    assert "failed: Error (exit code 255)" in message
    assert "Failed to initialize NVML" in message
    assert verify_pods(emu) == []


def test_pod_stuck_pending_surfaces_the_kubelets_words(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 1})
    emu.unpullable.add(VERIFY_IMAGE)  # the CUDA image was not mirrored

    report = install(
        kubeconfig,
        clock,
        {"gpu1": gpu_facts("gpu1", 1)},
        extravars={"gpustack_k8s_verify_timeout": 40},
    )

    status, message = checks(report, "gpu1")["pod"]
    assert status == "failed"
    assert "still Pending after 40 s" in message
    assert f'ErrImagePull: Failed to pull image "{VERIFY_IMAGE}"' in message
    assert verify_pods(emu) == []


def test_pending_without_condition_uses_events(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 1})
    sync = emu.kubelet.sync

    def kubelet_stalls_on_verification_pods(restart):
        if verify_pods(emu):  # the node's kubelet hangs: the pod gets no status at all
            emu.kubelet.pause("gpu1")
        sync(restart)

    def another_component_reports(t):
        for pod in verify_pods(emu):
            if not emu.objects("v1", "Event", NS, selector=""):
                emu.create({"apiVersion": "v1", "kind": "Event",
                            "metadata": {"name": "e1", "namespace": NS},
                            "involvedObject": {"kind": "Pod", "name": pod["metadata"]["name"]},
                            "reason": "FailedCreatePodSandBox", "type": "Warning",
                            "message": 'no runtime for "nvidia" is configured'})  # fmt: skip

    emu.kubelet.sync = kubelet_stalls_on_verification_pods
    clock.on_sleep = another_component_reports
    report = install(
        kubeconfig,
        clock,
        {"gpu1": gpu_facts("gpu1", 1)},
        extravars={"gpustack_k8s_verify_timeout": 10},
    )

    _, message = checks(report, "gpu1")["pod"]
    assert 'FailedCreatePodSandBox: no runtime for "nvidia" is configured' in message


def test_uuid_mismatch_is_reported(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 2})
    other = uuids_for("elsewhere", 2)
    # SIMULATED: the container sees a GPU that is not the host's (a wrong node mapping).
    emu.pod_policy = lambda pod: PodFate.succeeded(smi_output([other[1]]))

    report = install(kubeconfig, clock, {"gpu1": gpu_facts("gpu1", 2)})

    status, message = checks(report, "gpu1")["pod"]
    assert status == "failed"
    assert message.startswith("GPU UUID mismatch")
    assert uuids_for("gpu1", 2)[1] in message and other[1] in message


def test_a_pod_that_sees_more_gpus_than_it_was_given_fails(cluster, kubeconfig, clock):
    emu = cluster.emulator
    uuids = gpu_cluster(emu, {"gpu1": 2})
    emu.pod_policy = lambda pod: PodFate.succeeded(smi_output(uuids["gpu1"]))  # SIMULATED leak

    report = install(kubeconfig, clock, {"gpu1": gpu_facts("gpu1", 2)})

    status, message = checks(report, "gpu1")["pod"]
    assert status == "failed" and "listed 2 GPUs" in message and "isolation" in message


def test_pods_are_deleted_when_interrupted(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 1, "gpu2": 1})
    emu.unpullable.add(VERIFY_IMAGE)

    def interrupt(t):
        if verify_pods(emu):
            raise KeyboardInterrupt

    clock.on_sleep = interrupt
    with pytest.raises(KeyboardInterrupt):
        install(kubeconfig, clock, {"gpu1": gpu_facts("gpu1", 1), "gpu2": gpu_facts("gpu2", 1)})
    assert emu.count("POST", f"/api/v1/namespaces/{NS}/pods") == 2
    assert verify_pods(emu) == []


def test_node_missing_or_named_differently(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 1})
    emu.add_node("gpu2.cluster.example")
    facts = {h: gpu_facts(h, 1) for h in ("gpu1", "gpu2", "gpu3")}

    report = install(kubeconfig, clock, facts)

    assert checks(report, "gpu1")["pod"][0] == "passed"
    status, message = checks(report, "gpu2")["node"]
    assert status == "failed"
    assert "no Node named 'gpu2' for host gpu2" in message
    assert "set k8s_node_name=gpu2.cluster.example for gpu2" in message
    status, message = checks(report, "gpu3")["node"]
    assert "no Node named 'gpu3' for host gpu3" in message
    assert "join gpu3 to the cluster" in message
    assert (
        "nvidia.com/gpu.present"
        not in emu.get("v1", "Node", "gpu2.cluster.example")["metadata"]["labels"]
    )


def test_k8s_node_name_maps_a_host(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"worker-7": 1})
    report = install(
        kubeconfig,
        clock,
        {"gpu7": gpu_facts("worker-7", 1)},
        hostvars={"gpu7": {"k8s_node_name": "worker-7"}},
    )
    assert report.passed, report.to_dict()
    assert report.nodes[0].node == "worker-7"


def test_host_without_gpu_fails_and_is_not_labelled(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 1, "cpu1": 0})
    report = install(kubeconfig, clock, {"gpu1": gpu_facts("gpu1", 1), "cpu1": no_gpu_facts()})

    assert checks(report, "gpu1")["pod"][0] == "passed"
    assert checks(report, "cpu1")["gpus"] == (
        "failed",
        "driver installed 535.261.03-1, not loaded: no NVIDIA device",
    )
    assert not report.passed
    assert "nvidia.com/gpu.present" not in emu.get("v1", "Node", "cpu1")["metadata"]["labels"]


def test_failed_host_stack_is_not_labelled(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 1, "gpu2": 1})
    facts = {"gpu1": gpu_facts("gpu1", 1), "gpu2": gpu_facts("gpu2", 1)}
    report = install(kubeconfig, clock, facts, failed=("gpu2",))

    status, message = checks(report, "gpu2")["host"]
    assert status == "failed" and "Install the driver: apt failed" in message
    assert "nvidia.com/gpu.present" not in emu.get("v1", "Node", "gpu2")["metadata"]["labels"]
    assert emu.get("v1", "Node", "gpu1")["metadata"]["labels"]["nvidia.com/gpu.present"] == "true"


def test_servicemonitor_only_with_its_crd(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 1})
    emu.install_crd(SERVICEMONITOR_CRD)
    report = install(kubeconfig, clock, {"gpu1": gpu_facts("gpu1", 1)})
    assert ("ServiceMonitor", "dcgm-exporter") in {(a.kind, a.name) for a in report.applied}
    assert emu.get("monitoring.coreos.com/v1", "ServiceMonitor", "dcgm-exporter", NS)


def test_dcgm_scrape_and_vectoradd(cluster, kubeconfig, clock):
    emu = cluster.emulator
    uuids = gpu_cluster(emu, {"gpu1": 2})
    metrics = "".join(
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="{i}",UUID="{u}",Hostname="gpu1"}} 41\n'
        for i, u in enumerate(uuids["gpu1"][:1])
    )
    emu.set_service_proxy(NS, "dcgm-exporter", 9400, lambda path: "# HELP x\n" + metrics)
    extravars = {
        "gpustack_k8s_dcgm_scrape": "true",
        "gpustack_k8s_vector_add_image": "nvcr.io/nvidia/k8s/cuda-sample:vectoradd-cuda12.5.0",
    }
    report = install(kubeconfig, clock, {"gpu1": gpu_facts("gpu1", 2)}, extravars=extravars)

    result = checks(report, "gpu1")
    assert result["vectoradd"][0] == "passed"
    assert result["dcgm"] == ("failed", f"no DCGM_FI_DEV_GPU_TEMP sample for {uuids['gpu1'][1]}")
    assert (
        emu.count("GET", f"/api/v1/namespaces/{NS}/services/dcgm-exporter:9400/proxy/metrics") == 3
    )
    assert verify_pods(emu) == []
