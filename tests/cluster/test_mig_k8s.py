"""MIG install tests left on the Kubernetes API emulator: install derives the device plugin's MIG
strategy from the layouts the nvidia_mig role applied, and its report must pass, which takes the
verification pod's `nvidia-smi -L` output (the emulator's images print it; the real control plane
of tests/kube/ had no log endpoint for kwok's pods when the rest of the MIG flow moved to
tests/kube/test_mig.py).

The cluster is the emulator (real client, real HTTP, its DaemonSet controller, kubelet, device
manager and emulated device plugin); the layouts come from the MIG test fixture `nvidia-smi`
(tests/unit/mig_local.py). Proven here: gpustack's strategy and checks on those stand-ins only.
"""

from __future__ import annotations

import pytest

from gpustack.k8s.cluster import flow
from tests.cluster.helpers import gpu_cluster, gpu_facts, inventory, run_result
from tests.unit.mig_local import FixtureNode

NS = "gpustack-system"
H100 = "NVIDIA H100 80GB HBM3"


def installed_with_layout(emu, kubeconfig, clock, tmp_path, layout, extravars=None):
    """install on gpu1 after the nvidia_mig role applied `layout` (its real fact, from the
    fixture); the node's GPU shows the MIG devices the fixture holds."""
    fixture = FixtureNode(tmp_path / "host", ["H100-SXM5-80GB"])
    fact = fixture.apply(layout)
    assert fact["state"] == "success"
    gpu_cluster(emu, {"gpu1": 1})
    gpu = emu.hardware("gpu1").gpus[0]
    gpu.name = H100
    applied = fact["gpus"][0]["applied"]
    if fact["gpus"][0]["mode_current"] == "Enabled":
        gpu.mig = [p for p, n in applied.items() for _ in range(n)]
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
