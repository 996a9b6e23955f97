"""Acceptance: install + verify against the stricter emulator in every sharing mode, with and
without Node Feature Discovery, and the three defects of issue 12.

The GPUs are SIMULATED (tests/cluster/helpers.py builds host facts and node hardware from the
same UUIDs); the cluster side is the emulator's kubelet, device manager, DaemonSet controller,
RBAC and NFD. Nothing here was run on a real GPU cluster.
"""

from __future__ import annotations

import pytest

from gpustack.k8s.cluster import flow
from tests.cluster.helpers import gpu_cluster, gpu_facts, inventory, run_result, verify_pods

NS = "gpustack-system"
MIG_SINGLE = {i: ["1g.10gb"] * 7 for i in range(4)}
MIG_MIXED = {
    0: ["1g.10gb"] * 7,
    1: ["3g.40gb"] * 2,
    2: ["3g.40gb", "2g.20gb", "1g.10gb"],
    3: ["7g.80gb"],
}

# mode -> (extravars, MIG layout, capacity check message, resource the verification pod asks for)
MODES = {
    "default": ({}, None, "nvidia.com/gpu: 4", "nvidia.com/gpu"),
    "time-slicing": ({"gpustack_k8s_time_slicing_replicas": "4"}, None, "nvidia.com/gpu: 16",
                     "nvidia.com/gpu"),
    "mps": ({"gpustack_k8s_mps_replicas": "4"}, None, "nvidia.com/gpu: 16", "nvidia.com/gpu"),
    "mig-single": ({"gpustack_k8s_mig_strategy": "single"}, MIG_SINGLE, "nvidia.com/gpu: 28",
                   "nvidia.com/gpu"),
    "mig-mixed": ({"gpustack_k8s_mig_strategy": "mixed"}, MIG_MIXED,
                  "nvidia.com/mig-1g.10gb: 8, nvidia.com/mig-2g.20gb: 1, "
                  "nvidia.com/mig-3g.40gb: 3, nvidia.com/mig-7g.80gb: 1",
                  "nvidia.com/mig-1g.10gb"),
}  # fmt: skip


def session(kubeconfig, hosts, extravars):
    return flow.prepare(str(kubeconfig), inventory(kubeconfig.parent, hosts), extravars)


def checks(report, host="gpu1"):
    node = next(n for n in report.nodes if n.host == host)
    return {c.name: (c.status, c.message) for c in node.checks}


def verification_requests(emu) -> list[dict]:
    bodies = emu.request_bodies("POST", f"/api/v1/namespaces/{NS}/pods")
    return [b["spec"]["containers"][0]["resources"]["limits"] for b in bodies]


def workload(emu, node, name, resource="nvidia.com/gpu", count=1, ns="ml"):
    """A user's GPU pod already running on the node (SIMULATED workload: it just runs)."""
    if emu.get("v1", "Namespace", ns) is None:
        emu.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    return emu.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
                       "spec": {"nodeName": node, "containers": [{"name": "train", "image": "ml/train:1",
                                "resources": {"limits": {resource: count}}}]}})  # fmt: skip


@pytest.mark.parametrize("nfd", [True, False], ids=["nfd", "no-nfd"])
@pytest.mark.parametrize("mode", list(MODES))
def test_install_and_verify_pass_in_every_mode(cluster, kubeconfig, clock, mode, nfd):
    emu = cluster.emulator
    extravars, mig, capacity, resource = MODES[mode]
    if nfd:
        emu.install_nfd()
    gpu_cluster(emu, {"gpu1": 4}, mig={"gpu1": mig} if mig else None)
    facts = {"gpu1": gpu_facts("gpu1", 4)}

    report = flow.install(session(kubeconfig, ["gpu1"], extravars), run_result(facts), clock=clock)
    assert report.passed, report.to_dict()
    again = flow.verify_cluster(
        session(kubeconfig, ["gpu1"], extravars), run_result(facts), clock=clock
    )
    assert again.passed, again.to_dict()

    for result in (checks(report), checks(again)):
        assert result["operands"][0] == "passed"
        assert result["capacity"] == ("passed", capacity)
        assert result["pod"][0] == "passed"
        if nfd:
            assert result["gfd"][0] == "passed", result["gfd"]
        else:
            assert result["gfd"][0] == "skipped"
            assert "GFD labels need Node Feature Discovery running" in result["gfd"][1]
    assert verification_requests(emu) == [{resource: 1}, {resource: 1}]
    assert report.gfd_mode == ("node-feature-api" if nfd else "feature-file")
    assert verify_pods(emu) == []
    for ds in emu.objects("apps/v1", "DaemonSet", NS):
        assert ds["status"]["numberReady"] == ds["status"]["desiredNumberScheduled"] == 1
    if mode == "mps":
        assert emu.get("apps/v1", "DaemonSet", "nvidia-device-plugin-mps-control-daemon", NS)


# ----------------------------------------------------------------------------- defect 1: GFD


def test_gfd_runs_without_nfd_and_writes_its_feature_file(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 1})
    report = flow.install(
        session(kubeconfig, ["gpu1"], {}), run_result({"gpu1": gpu_facts("gpu1", 1)}), clock=clock
    )

    assert checks(report)["operands"][0] == "passed", checks(report)["operands"]
    pod = emu.objects("v1", "Pod", NS, selector="app.kubernetes.io/name=gpu-feature-discovery")[0]
    assert pod["spec"]["serviceAccountName"] == "gpu-feature-discovery"
    assert pod["status"]["containerStatuses"][0]["restartCount"] == 0
    written = emu.hardware("gpu1").files["/etc/kubernetes/node-feature-discovery/features.d/gfd"]
    assert "nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB" in written
    assert "nvidia.com/gpu.product" not in emu.get("v1", "Node", "gpu1")["metadata"]["labels"]


def test_gfd_publishes_node_features_when_nfd_runs(cluster, kubeconfig, clock):
    emu = cluster.emulator
    emu.install_nfd()
    gpu_cluster(emu, {"gpu1": 1})
    report = flow.install(
        session(kubeconfig, ["gpu1"], {}), run_result({"gpu1": gpu_facts("gpu1", 1)}), clock=clock
    )

    assert report.passed, report.to_dict()
    feature = emu.get("nfd.k8s-sigs.io/v1alpha1", "NodeFeature", "nvidia-features-for-gpu1", NS)
    assert feature["metadata"]["labels"] == {"nfd.node.kubernetes.io/node-name": "gpu1"}
    assert feature["spec"]["labels"]["nvidia.com/gpu.count"] == "1"
    assert [r["kind"] for r in feature["metadata"]["ownerReferences"]] == ["DaemonSet", "Pod"]
    labels = emu.get("v1", "Node", "gpu1")["metadata"]["labels"]
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-A100-SXM4-80GB"  # put there by NFD
    assert checks(report)["gfd"] == (
        "passed",
        "GFD labels present (nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB)",
    )


def test_nfd_api_without_a_running_master_fails_the_gfd_check_plainly(cluster, kubeconfig, clock):
    emu = cluster.emulator
    emu.install_nfd(master=False, worker=False)  # CRDs left behind, NFD itself not running
    gpu_cluster(emu, {"gpu1": 1})
    report = flow.install(session(kubeconfig, ["gpu1"], {"gpustack_k8s_capacity_timeout": 20}),
                          run_result({"gpu1": gpu_facts("gpu1", 1)}), clock=clock)  # fmt: skip

    status, message = checks(report)["gfd"]
    assert status == "failed"
    assert "GFD labels need Node Feature Discovery running" in message and "nfd-master" in message


def test_forcing_the_node_feature_api_without_nfd_crash_loops_gfd(cluster, kubeconfig, clock):
    """What upstream's default does without NFD: the GET 404s, the create 404s, GFD exits."""
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 1})
    extravars = {"gpustack_k8s_gfd_mode": "node-feature-api", "gpustack_k8s_daemonset_timeout": 10}
    report = flow.install(
        session(kubeconfig, ["gpu1"], extravars),
        run_result({"gpu1": gpu_facts("gpu1", 1)}),
        clock=clock,
    )

    status, message = checks(report)["operands"]
    assert status == "failed" and "DaemonSet gpu-feature-discovery not ready" in message
    pod = emu.objects("v1", "Pod", NS, selector="app.kubernetes.io/name=gpu-feature-discovery")[0]
    container = pod["status"]["containerStatuses"][0]
    assert container["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert container["restartCount"] > 1
    log = emu.kubelet.log(emu.store.get(emu.kind("v1", "Pod"), NS, pod["metadata"]["name"]), None)
    assert "the server could not find the requested resource" in log


# ----------------------------------------------------------------------------- defect 2: one unit


def test_verify_on_a_node_whose_gpus_are_in_use(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 4})
    facts = {"gpu1": gpu_facts("gpu1", 4)}
    assert flow.install(session(kubeconfig, ["gpu1"], {}), run_result(facts), clock=clock).passed
    busy = [workload(emu, "gpu1", f"train-{i}") for i in range(3)]

    report = flow.verify_cluster(session(kubeconfig, ["gpu1"], {}), run_result(facts), clock=clock)

    assert report.passed, report.to_dict()
    assert "1 nvidia.com/gpu of 1 free" in checks(report)["pod"][1]
    for before in busy:
        after = emu.get("v1", "Pod", before["metadata"]["name"], "ml")
        assert after["metadata"]["uid"] == before["metadata"]["uid"]  # never disturbed
        assert after["status"]["phase"] == "Running"
        assert "deletionTimestamp" not in after["metadata"]
        assert after["status"]["containerStatuses"][0]["restartCount"] == 0


def test_verify_on_a_node_whose_gpus_are_all_in_use_starts_no_pod(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 2})
    facts = {"gpu1": gpu_facts("gpu1", 2)}
    assert flow.install(session(kubeconfig, ["gpu1"], {}), run_result(facts), clock=clock).passed
    posted = emu.count("POST", f"/api/v1/namespaces/{NS}/pods")
    workload(emu, "gpu1", "big", count=2)

    report = flow.verify_cluster(session(kubeconfig, ["gpu1"], {}), run_result(facts), clock=clock)

    status, message = checks(report)["pod"]
    assert status == "skipped" and report.passed
    assert "every GPU unit is in use (2/2 nvidia.com/gpu) by ml/big" in message
    assert emu.count("POST", f"/api/v1/namespaces/{NS}/pods") == posted
    assert emu.get("v1", "Pod", "big", "ml")["status"]["phase"] == "Running"


def test_verify_with_mps_asks_for_one_replica(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 2})
    report = flow.install(session(kubeconfig, ["gpu1"], {"gpustack_k8s_mps_replicas": "4"}),
                          run_result({"gpu1": gpu_facts("gpu1", 2)}), clock=clock)  # fmt: skip

    assert report.passed, report.to_dict()
    assert verification_requests(emu) == [{"nvidia.com/gpu": 1}]


# ----------------------------------------------------------------------------- defect 3: MIG mixed


def test_mig_mixed_all_mig_node_counts_mig_resources(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 2}, mig={"gpu1": {0: ["3g.40gb"] * 2, 1: ["3g.40gb"] * 2}})
    report = flow.install(session(kubeconfig, ["gpu1"], {"gpustack_k8s_mig_strategy": "mixed"}),
                          run_result({"gpu1": gpu_facts("gpu1", 2)}), clock=clock)  # fmt: skip

    assert report.passed, report.to_dict()
    allocatable = emu.get("v1", "Node", "gpu1")["status"]["allocatable"]
    assert "nvidia.com/gpu" not in allocatable and allocatable["nvidia.com/mig-3g.40gb"] == "4"
    assert checks(report)["capacity"] == ("passed", "nvidia.com/mig-3g.40gb: 4")
    assert verification_requests(emu) == [{"nvidia.com/mig-3g.40gb": 1}]
    assert "MIG device MIG-" in checks(report)["pod"][1]
