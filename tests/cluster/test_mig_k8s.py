"""The label-driven MIG flow against the Kubernetes API emulator (issue 15, "Against the emulator").

The cluster is the emulator (real client, real HTTP, its DaemonSet controller, kubelet, device
manager and emulated device plugin); the host side is the FixtureMigApplier TEST DOUBLE
(tests/cluster/mig_doubles.py): the nvidia_mig role's own applier driving the MIG test fixture
`nvidia-smi`. Proven here: gpustack's sequence, labels and checks on those stand-ins only.
"""

from __future__ import annotations

import pytest

from gpustack.fleet.mig import CONFIG_LABEL, STATE_LABEL, reconfigure_node
from gpustack.k8s.cluster import flow
from gpustack.k8s.cluster.connect import connect
from gpustack.k8s.cluster.mig import (
    CORDON_ANNOTATION,
    PAUSED,
    PAUSED_ANNOTATION,
    REASON_ANNOTATION,
    MigKubernetesBackend,
)
from gpustack.k8s.cluster.upgrade import KubernetesBackend
from gpustack.upgrade.backend import StepOptions
from tests.cluster.helpers import gpu_cluster, gpu_facts, inventory, run_result
from tests.cluster.mig_doubles import FixtureMigApplier
from tests.unit.mig_local import FixtureNode

NS = "gpustack-system"
H100 = "NVIDIA H100 80GB HBM3"
PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
OPTS = StepOptions(poll=1, pod_deletion_timeout=60, validation_timeout=60)


def label(kubeconfig, node: str, labels: dict) -> None:
    """What the admin does: `kubectl label node ... nvidia.com/mig.config=...` (real client)."""
    cluster = connect(str(kubeconfig))
    cluster.raw("PATCH", f"/api/v1/nodes/{node}", body={"metadata": {"labels": labels}},
                ctype="application/merge-patch+json")  # fmt: skip
    cluster.close()


@pytest.fixture
def mig_node(cluster, kubeconfig, clock, tmp_path):
    """gpu1: one SIMULATED "H100 80GB" (MIG off), gpustack's k8s side installed (mixed)."""
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 1})
    emu.hardware("gpu1").gpus[0].name = H100
    extravars = {"gpustack_k8s_mig_strategy": "mixed"}
    session = flow.prepare(str(kubeconfig), inventory(tmp_path, ["gpu1"]), extravars)
    report = flow.install(session, run_result({"gpu1": gpu_facts("gpu1", 1)}), clock=clock)
    assert report.passed, report.to_dict()
    fixture = FixtureNode(tmp_path / "host", ["H100-SXM5-80GB"])
    applier = FixtureMigApplier(emu, {"gpu1": fixture})
    backend = MigKubernetesBackend(KubernetesBackend(connect(str(kubeconfig)), {"gpu1": "gpu1"}))
    return emu, fixture, applier, backend


def node(emu):
    return emu.get("v1", "Node", "gpu1")


def gpu_allocatable(emu) -> dict:
    """Non-zero GPU resources (the kubelet keeps a resource no plugin advertises any more at 0)."""
    alloc = node(emu)["status"]["allocatable"]
    return {k: v for k, v in alloc.items()
            if k.startswith(("nvidia.com/gpu", "nvidia.com/mig-")) and v != "0"}  # fmt: skip


def plugin_pods(emu) -> list[dict]:
    return [p for p in emu.pods_on("gpu1")
            if p["metadata"].get("namespace") == NS and PLUGIN in (p["spec"].get("nodeSelector") or {})]  # fmt: skip


def user_pod(emu, name="train"):
    if emu.get("v1", "Namespace", "ml") is None:
        emu.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ml"}})
    emu.create({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "ml", "ownerReferences": [
                    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "uid": "u1",
                     "controller": True}]},
                "spec": {"nodeName": "gpu1", "containers": [{"name": "c", "image": "ml:1",
                         "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})  # fmt: skip


def test_label_drives_pending_then_success_and_the_node_advertises_the_layout(
    mig_node, kubeconfig, clock
):
    emu, fixture, applier, backend = mig_node
    assert gpu_allocatable(emu) == {"nvidia.com/gpu": "1"}
    user_pod(emu)
    label(kubeconfig, "gpu1", {CONFIG_LABEL: "all-1g.10gb"})

    result = reconfigure_node("gpu1", backend, applier, clock, OPTS, "mixed")

    assert (result.state, result.states) == ("success", ["pending", "success"]), result
    labels = node(emu)["metadata"]["labels"]
    assert labels[STATE_LABEL] == "success" and labels[PLUGIN] == "true"
    annotations = node(emu)["metadata"].get("annotations") or {}
    assert not {REASON_ANNOTATION, PAUSED_ANNOTATION, CORDON_ANNOTATION} & set(annotations)
    assert not node(emu)["spec"].get("unschedulable")
    # the GPU was idle when it changed: the user's pod was evicted first, the plugin paused
    assert emu.get("v1", "Pod", "train", "ml") is None
    assert "evicted 1 GPU pod(s)" in result.steps
    assert (
        "paused GPU clients (dcgm-exporter, device-plugin, gpu-feature-discovery)" in result.steps
    )
    # what the emulated device plugin advertises now is the layout the fixture holds
    assert gpu_allocatable(emu) == {"nvidia.com/mig-1g.10gb": "7"}
    assert "node advertises the layout (nvidia.com/mig-1g.10gb: 7)" in result.steps
    assert len(plugin_pods(emu)) == 1
    assert [c[2] for c in applier.calls] == [True, False]

    changing = len(fixture.mutating_calls())
    again = reconfigure_node("gpu1", backend, applier, clock, OPTS, "mixed")
    assert (again.state, again.states, again.steps) == ("success", ["success"], [])
    assert len(fixture.mutating_calls()) == changing  # re-run: nothing changed on the "host"


def test_switch_layout_and_back_to_disabled(mig_node, kubeconfig, clock):
    emu, _, applier, backend = mig_node
    for layout, advertised in (
        ("all-1g.10gb", {"nvidia.com/mig-1g.10gb": "7"}),
        ("all-balanced", {"nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-2g.20gb": "1",
                          "nvidia.com/mig-3g.40gb": "1"}),
        ("all-disabled", {"nvidia.com/gpu": "1"}),
    ):  # fmt: skip
        label(kubeconfig, "gpu1", {CONFIG_LABEL: layout})
        result = reconfigure_node("gpu1", backend, applier, clock, OPTS, "mixed")
        assert result.states == ["pending", "success"], (layout, result)
        assert gpu_allocatable(emu) == advertised, layout


def test_a_fixture_error_sets_failed_with_its_reason_and_resumes_the_clients(
    mig_node, kubeconfig, clock
):
    emu, fixture, applier, backend = mig_node
    label(kubeconfig, "gpu1", {CONFIG_LABEL: "all-1g.10gb"})
    proc = fixture.use_gpu(0)  # a process outside Kubernetes holds the GPU: eviction cannot help
    try:
        result = reconfigure_node("gpu1", backend, applier, clock, OPTS, "mixed")
    finally:
        proc.kill()
        proc.wait()

    assert result.states == ["pending", "failed"], result
    meta = node(emu)["metadata"]
    assert meta["labels"][STATE_LABEL] == "failed"
    reason = meta["annotations"][REASON_ANNOTATION]
    assert str(proc.pid) in reason and reason == result.reason
    assert meta["labels"][PLUGIN] == "true" and PAUSED_ANNOTATION not in meta["annotations"]
    assert len(plugin_pods(emu)) == 1  # the device plugin is back
    assert node(emu)["spec"]["unschedulable"] is True  # the GPUs' layout is unknown: stays cordoned
    assert fixture.mutating_calls() == []
    assert gpu_allocatable(emu) == {"nvidia.com/gpu": "1"}

    # the process is gone: the next run changes the layout and gives the node back
    again = reconfigure_node("gpu1", backend, applier, clock, OPTS, "mixed")
    assert again.states == ["pending", "success"], again
    assert not node(emu)["spec"].get("unschedulable")
    assert CORDON_ANNOTATION not in (node(emu)["metadata"].get("annotations") or {})
    assert gpu_allocatable(emu) == {"nvidia.com/mig-1g.10gb": "7"}


def test_a_profile_the_gpu_does_not_offer_fails_with_the_role_s_reason(mig_node, kubeconfig, clock):
    emu, _, applier, backend = mig_node
    label(kubeconfig, "gpu1", {CONFIG_LABEL: "all-7g.141gb"})  # an H200 layout on an H100

    result = reconfigure_node("gpu1", backend, applier, clock, OPTS, "mixed")

    # MIG off, the driver lists no profiles: only enabling MIG shows the profile is missing;
    # the role switches the mode back, and the node says why.
    assert result.states == ["pending", "failed"], result
    assert result.reason.startswith(
        "GPU 0 (NVIDIA H100 80GB HBM3): profile 7g.141gb is not offered"
    )
    assert result.reason.endswith("MIG mode set back to Disabled")
    meta = node(emu)["metadata"]
    assert meta["annotations"][REASON_ANNOTATION] == result.reason
    assert meta["labels"][PLUGIN] == "true" and len(plugin_pods(emu)) == 1
    assert gpu_allocatable(emu) == {"nvidia.com/gpu": "1"}


def test_admin_cordon_and_forced_off_clients_are_kept(mig_node, kubeconfig, clock):
    emu, _, applier, backend = mig_node
    label(kubeconfig, "gpu1", {CONFIG_LABEL: "all-1g.10gb", "nvidia.com/gpu.deploy.dcgm-exporter": "false"})  # fmt: skip
    cluster = connect(str(kubeconfig))
    cluster.raw("PATCH", "/api/v1/nodes/gpu1", body={"spec": {"unschedulable": True}},
                ctype="application/merge-patch+json")  # fmt: skip
    cluster.close()
    result = reconfigure_node("gpu1", backend, applier, clock, OPTS, "mixed")

    assert result.states == ["pending", "success"], result
    patches = [b["metadata"]["labels"] for b in emu.request_bodies("PATCH", "/api/v1/nodes/gpu1")
               if "labels" in (b.get("metadata") or {})]  # fmt: skip
    paused = [p for p in patches if p.get(PLUGIN) == PAUSED]
    assert len(paused) == 1 and "nvidia.com/gpu.deploy.dcgm-exporter" not in paused[0]
    labels = node(emu)["metadata"]["labels"]
    assert labels["nvidia.com/gpu.deploy.dcgm-exporter"] == "false"  # forced off: left alone
    assert labels[PLUGIN] == "true"
    assert node(emu)["spec"]["unschedulable"] is True  # the admin's cordon stays
    assert "gpu1 stays cordoned (an admin had cordoned it)" in result.steps


def test_no_label_is_nothing_to_do(mig_node, clock):
    emu, _, applier, backend = mig_node
    result = reconfigure_node("gpu1", backend, applier, clock, OPTS, "mixed")
    assert (result.state, result.states, applier.calls) == ("", [], [])
    assert STATE_LABEL not in node(emu)["metadata"]["labels"]


def test_rebooting_left_over_with_the_mode_still_unchanged_is_failed(mig_node, kubeconfig, clock):
    _, fixture, applier, backend = mig_node
    label(kubeconfig, "gpu1", {CONFIG_LABEL: "all-1g.10gb", STATE_LABEL: "rebooting"})
    result = reconfigure_node("gpu1", backend, applier, clock, OPTS, "mixed")
    assert result.states == ["failed"]
    assert result.reason == "MIG mode change did not take effect after rebooting"
    assert fixture.mutating_calls() == []


def reboot_node(emu, cluster, kubeconfig, tmp_path, clock):
    """gpu1 whose GPU cannot be reset (nvidia_mig_reset=false): a mode change needs a reboot."""
    gpu_cluster(emu, {"gpu1": 1})
    emu.hardware("gpu1").gpus[0].name = H100
    session = flow.prepare(str(kubeconfig), inventory(tmp_path, ["gpu1"]),
                           {"gpustack_k8s_mig_strategy": "mixed"})  # fmt: skip
    assert flow.install(session, run_result({"gpu1": gpu_facts("gpu1", 1)}), clock=clock).passed
    fixture = FixtureNode(tmp_path / "host", ["H100-SXM5-80GB"])
    applier = FixtureMigApplier(emu, {"gpu1": fixture}, reset=False)
    backend = MigKubernetesBackend(KubernetesBackend(connect(str(kubeconfig)), {"gpu1": "gpu1"}))
    label(kubeconfig, "gpu1", {CONFIG_LABEL: "all-1g.10gb"})
    return fixture, applier, backend


def test_reboot_for_the_mode_change_goes_pending_rebooting_success(
    cluster, kubeconfig, clock, tmp_path
):
    emu = cluster.emulator
    fixture, applier, backend = reboot_node(emu, cluster, kubeconfig, tmp_path, clock)

    result = reconfigure_node("gpu1", backend, applier, clock, OPTS, "mixed", reboot=applier.reboot)

    assert result.states == ["pending", "rebooting", "success"], result
    assert [c[2] for c in applier.calls] == [True, False, "reboot"]
    assert not [c for c in fixture.mutating_calls() if "-r" in c]  # no reset: the reboot did it
    assert gpu_allocatable(emu) == {"nvidia.com/mig-1g.10gb": "7"}
    assert node(emu)["metadata"]["labels"][PLUGIN] == "true"
    assert not node(emu)["spec"].get("unschedulable")


def test_without_a_reboot_the_node_waits_pending_then_a_later_run_finishes(
    cluster, kubeconfig, clock, tmp_path
):
    emu = cluster.emulator
    _, applier, backend = reboot_node(emu, cluster, kubeconfig, tmp_path, clock)

    first = reconfigure_node("gpu1", backend, applier, clock, OPTS, "mixed")
    assert first.states == ["pending", "pending"] and "reboot required" in first.reason
    meta = node(emu)["metadata"]
    assert meta["labels"][STATE_LABEL] == "pending" and meta["labels"][PLUGIN] == PAUSED
    assert node(emu)["spec"]["unschedulable"] is True  # idle GPUs until the reboot
    assert plugin_pods(emu) == []

    waiting = reconfigure_node("gpu1", backend, applier, clock, OPTS, "mixed")
    assert waiting.state == "pending" and "waiting for a reboot" in waiting.reason

    applier.reboot("gpu1", "all-1g.10gb")  # the admin reboots; the boot unit applies the layout
    done = reconfigure_node("gpu1", backend, applier, clock, OPTS, "mixed")
    assert done.states == ["success"], done
    labels = node(emu)["metadata"]["labels"]
    assert labels[PLUGIN] == "true" and labels[STATE_LABEL] == "success"
    assert not node(emu)["spec"].get("unschedulable")
    assert gpu_allocatable(emu) == {"nvidia.com/mig-1g.10gb": "7"}


def test_a_boot_that_did_not_switch_the_mode_is_failed(cluster, kubeconfig, clock, tmp_path):
    emu = cluster.emulator
    _, applier, backend = reboot_node(emu, cluster, kubeconfig, tmp_path, clock)

    result = reconfigure_node("gpu1", backend, applier, clock, OPTS, "mixed",
                              reboot=lambda h, c: applier.reboot(h, c, takes=False))  # fmt: skip
    assert result.states == ["pending", "rebooting", "failed"], result
    assert result.reason == "MIG mode change did not take effect after rebooting"
    assert node(emu)["metadata"]["annotations"][REASON_ANNOTATION] == result.reason
    assert node(emu)["metadata"]["labels"][PLUGIN] == "true"


def test_the_flow_uses_the_strategy_the_device_plugin_runs_with(mig_node, kubeconfig, tmp_path):
    from gpustack.k8s.cluster.mig import connect_backend

    emu = mig_node[0]
    inv = inventory(tmp_path, ["gpu1"])
    _, strategy = connect_backend(str(kubeconfig), inv, {})  # configured: none; deployed: mixed
    assert strategy == "mixed"
    emu.delete("apps/v1", "DaemonSet", "nvidia-device-plugin", NS)
    _, strategy = connect_backend(str(kubeconfig), inv, {"gpustack_k8s_mig_strategy": "single"})
    assert strategy == "single"


# ---------------------------------------------- item 2: the strategy and the advertised resources


def installed_with_layout(emu, kubeconfig, clock, tmp_path, layout, extravars=None, shown=None):
    """install on gpu1 after the nvidia_mig role applied `layout` (its real fact, from the
    fixture); the node's GPU shows `shown` MIG devices (default: what the fixture holds)."""
    fixture = FixtureNode(tmp_path / "host", ["H100-SXM5-80GB"])
    fact = fixture.apply(layout)
    assert fact["state"] == "success"
    gpu_cluster(emu, {"gpu1": 1})
    gpu = emu.hardware("gpu1").gpus[0]
    gpu.name = H100
    applied = fact["gpus"][0]["applied"]
    if fact["gpus"][0]["mode_current"] == "Enabled":
        gpu.mig = shown if shown is not None else [p for p, n in applied.items() for _ in range(n)]
    facts = {"gpu1": {**gpu_facts("gpu1", 1), "gpustack_mig": fact}}
    session = flow.prepare(str(kubeconfig), inventory(tmp_path, ["gpu1"]), extravars or {})
    return flow.install(session, run_result(facts), clock=clock)


def deployed_strategy_env(emu) -> str:
    ds = emu.get("apps/v1", "DaemonSet", "nvidia-device-plugin", NS)
    env = ds["spec"]["template"]["spec"]["containers"][0]["env"]
    return next(e["value"] for e in env if e["name"] == "MIG_STRATEGY")


def capacity(report):
    node = next(n for n in report.nodes if n.host == "gpu1")
    return next((c.status, c.message) for c in node.checks if c.name == "capacity")


@pytest.mark.parametrize(
    ("layout", "strategy", "message"),
    [
        ("all-1g.10gb", "single", "nvidia.com/gpu: 7"),
        ("all-balanced", "mixed",
         "nvidia.com/mig-1g.10gb: 2, nvidia.com/mig-2g.20gb: 1, nvidia.com/mig-3g.40gb: 1"),
        ("all-disabled", "none", "nvidia.com/gpu: 1"),
    ],
)  # fmt: skip
def test_install_derives_the_strategy_from_the_layout(
    cluster, kubeconfig, clock, tmp_path, layout, strategy, message
):
    emu = cluster.emulator
    report = installed_with_layout(emu, kubeconfig, clock, tmp_path, layout)
    assert report.passed, report.to_dict()
    assert report.mig_strategy == strategy and deployed_strategy_env(emu) == strategy
    assert capacity(report) == ("passed", message)


def test_a_strategy_the_user_set_wins(cluster, kubeconfig, clock, tmp_path):
    emu = cluster.emulator
    report = installed_with_layout(emu, kubeconfig, clock, tmp_path, "all-1g.10gb",
                                   {"gpustack_k8s_mig_strategy": "mixed"})  # fmt: skip
    assert report.passed and deployed_strategy_env(emu) == "mixed"
    assert capacity(report) == ("passed", "nvidia.com/mig-1g.10gb: 7")


def test_verification_fails_when_the_advertised_mig_devices_differ_from_the_layout(
    cluster, kubeconfig, clock, tmp_path
):
    emu = cluster.emulator
    # the node shows 3 MIG devices where the layout has 7 (e.g. instances lost, plugin stale)
    report = installed_with_layout(emu, kubeconfig, clock, tmp_path, "all-1g.10gb",
                                   {"gpustack_k8s_mig_strategy": "mixed",
                                    "gpustack_k8s_capacity_timeout": 20},
                                   shown=["1g.10gb"] * 3)  # fmt: skip
    assert not report.passed
    status, message = capacity(report)
    assert status == "failed"
    assert message.startswith("advertised nvidia.com/mig-1g.10gb: 3 (layout: 7) after 20 s")
