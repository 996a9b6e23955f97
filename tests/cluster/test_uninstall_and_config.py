"""install keeps a RuntimeClass nvidia of someone else's and verification passes with it.

This stays on the emulator because its verdict is the verification pod's output (nvidia-smi -L),
which kwok cannot serve yet (no kubelet log endpoint), and because the emulator's kubelet checks
that the node has the RuntimeClass's handler. The rest of what this file held moved:
uninstall, the API server's side of a kept RuntimeClass (labels, managedFields, uninstall
leaves it) and the refused one to tests/kube/test_uninstall.py (a real control plane);
kubeconfig problems to tests/unit/test_kubeconfig_problems.py (no cluster needed).
"""

from __future__ import annotations

from gpustack.k8s.cluster import flow
from tests.cluster.helpers import gpu_cluster, gpu_facts, inventory, run_result

K3S_RUNTIMECLASS = {  # what k3s's deploy controller creates (k3s-io/k3s issue 8700)
    "apiVersion": "node.k8s.io/v1",
    "kind": "RuntimeClass",
    "metadata": {"name": "nvidia", "labels": {"objectset.rio.cattle.io/hash": "0123abcd"}},
    "handler": "nvidia",
}


def test_verification_passes_with_a_runtimeclass_of_someone_elses(cluster, kubeconfig, clock):
    """k3s and the GPU Operator create RuntimeClass nvidia themselves: gpustack uses it as it is,
    and its verification pods run with it."""
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 1})
    emu.create(K3S_RUNTIMECLASS)
    session = flow.prepare(str(kubeconfig), inventory(kubeconfig.parent, ["gpu1"]), {})

    report = flow.install(session, run_result({"gpu1": gpu_facts("gpu1", 1)}), clock=clock)

    assert report.passed, report.to_dict()
    actions = {(a.kind, a.name): a.action for a in report.applied}
    assert actions[("RuntimeClass", "nvidia")] == "kept (not gpustack's)"
    runtime_class = emu.get("node.k8s.io/v1", "RuntimeClass", "nvidia")
    assert runtime_class["metadata"]["labels"] == K3S_RUNTIMECLASS["metadata"]["labels"]
