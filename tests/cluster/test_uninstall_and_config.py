"""uninstall --components k8s, and kubeconfig problems (Error + Hint, nothing run on hosts)."""

from __future__ import annotations

import pytest

from gpustack.errors import BadInput, GpustackError
from gpustack.k8s.cluster import connect, flow
from tests.cluster.helpers import gpu_cluster, gpu_facts, inventory, run_result, verify_pods
from tests.conftest import run_cli, runs_started

NS = "gpustack-system"


def test_uninstall_removes_only_gpustacks_objects_and_labels(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 1})
    emu.add_node("cpu1", labels={"team": "ml"})
    session = flow.prepare(str(kubeconfig), inventory(kubeconfig.parent, ["gpu1"]), {})
    flow.install(session, run_result({"gpu1": gpu_facts("gpu1", 1)}), clock=clock)
    # A user's own objects and labels, some in gpustack's namespace.
    emu.create(
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "mine", "namespace": NS}}
    )
    emu.create(
        {
            "apiVersion": "node.k8s.io/v1",
            "kind": "RuntimeClass",
            "metadata": {"name": "kata"},
            "handler": "kata",
        }
    )
    emu.merge_patch("v1", "Node", "gpu1", {"metadata": {"labels": {"team": "vision"}}})

    removed = flow.uninstall(session)

    assert "RuntimeClass nvidia" in removed["deleted"]
    assert f"DaemonSet {NS}/nvidia-device-plugin" in removed["deleted"]
    for kind in ("ServiceAccount", "Role", "RoleBinding"):
        assert f"{kind} {NS}/gpu-feature-discovery" in removed["deleted"]
    assert removed["unlabelled_nodes"] == ["gpu1"]
    assert emu.objects("apps/v1", "DaemonSet") == []
    assert emu.get("node.k8s.io/v1", "RuntimeClass", "nvidia") is None
    assert emu.get("node.k8s.io/v1", "RuntimeClass", "kata") is not None
    # gpustack created the namespace, but a user's ConfigMap lives there: it stays.
    assert emu.get("v1", "ConfigMap", "mine", NS) is not None
    assert removed["kept"] == [
        f"Namespace {NS} (it holds objects gpustack did not create: ConfigMap mine)"
    ]
    labels = emu.get("v1", "Node", "gpu1")["metadata"]["labels"]
    assert labels["team"] == "vision" and labels["kubernetes.io/hostname"] == "gpu1"
    assert not any(k.startswith("nvidia.com/") for k in labels)
    assert "gpustack.io/managed-labels" not in (
        emu.get("v1", "Node", "gpu1")["metadata"].get("annotations") or {}
    )
    assert emu.get("v1", "Node", "cpu1")["metadata"]["labels"]["team"] == "ml"
    assert verify_pods(emu) == []
    # Again: nothing left to do, no error; without the user's object the namespace goes.
    emu.delete("v1", "ConfigMap", "mine", NS)
    again = flow.uninstall(session)
    assert again == {"deleted": [f"Namespace {NS}"], "kept": [], "unlabelled_nodes": []}
    assert emu.get("v1", "Namespace", NS) is None


def test_uninstall_keeps_a_namespace_gpustack_did_not_create(cluster, kubeconfig):
    emu = cluster.emulator
    emu.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-ops"}})
    session = flow.prepare(
        str(kubeconfig),
        inventory(kubeconfig.parent, ["gpu1"]),
        {"gpustack_k8s_namespace": "gpu-ops"},
    )
    flow.uninstall(session)
    assert emu.get("v1", "Namespace", "gpu-ops") is not None


K3S_RUNTIMECLASS = {  # what k3s's deploy controller creates (k3s-io/k3s issue 8700)
    "apiVersion": "node.k8s.io/v1",
    "kind": "RuntimeClass",
    "metadata": {"name": "nvidia", "labels": {"objectset.rio.cattle.io/hash": "0123abcd"}},
    "handler": "nvidia",
}


def test_a_runtimeclass_of_someone_elses_is_kept_not_taken_over(cluster, kubeconfig, clock):
    """k3s and the GPU Operator create RuntimeClass nvidia themselves: gpustack uses it as it is
    and leaves it to its owner on uninstall."""
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
    removed = flow.uninstall(session)
    assert "RuntimeClass nvidia" not in removed["deleted"]
    assert emu.get("node.k8s.io/v1", "RuntimeClass", "nvidia") is not None


def test_a_runtimeclass_of_that_name_with_another_handler_is_refused(cluster, kubeconfig, clock):
    emu = cluster.emulator
    gpu_cluster(emu, {"gpu1": 1})
    emu.create({**K3S_RUNTIMECLASS, "handler": "runc"})
    session = flow.prepare(str(kubeconfig), inventory(kubeconfig.parent, ["gpu1"]), {})

    with pytest.raises(GpustackError) as info:
        flow.install(session, run_result({"gpu1": gpu_facts("gpu1", 1)}), clock=clock)

    assert "handler 'runc'" in info.value.message and "nothing was applied" in info.value.message
    assert "gpustack_k8s_runtime_class" in info.value.hint
    assert emu.get("v1", "Namespace", NS) is None
    assert emu.objects("apps/v1", "DaemonSet") == []
    labels = emu.get("v1", "Node", "gpu1")["metadata"]["labels"]
    assert not [key for key in labels if key.startswith("nvidia.com/gpu.deploy")]


def test_kubeconfig_missing_malformed_unreachable(tmp_path, cluster):
    with pytest.raises(BadInput, match="does not exist"):
        connect.connect(str(tmp_path / "nope"))
    bad = tmp_path / "bad"
    bad.write_text("clusters: [unclosed\n")
    with pytest.raises(BadInput, match="is not usable") as info:
        connect.connect(str(bad))
    assert "kubectl --kubeconfig" in info.value.hint
    empty = tmp_path / "empty"
    empty.write_text("apiVersion: v1\nkind: Config\n")
    with pytest.raises(BadInput, match="is not usable"):
        connect.connect(str(empty))
    dead = cluster.write_kubeconfig(tmp_path / "dead", server="http://127.0.0.1:9")
    with pytest.raises(
        BadInput, match=r"cannot reach the Kubernetes API server at http://127\.0\.0\.1:9"
    ):
        connect.check_reachable(connect.connect(str(dead)))


def test_kubeconfig_needed_for_verify(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(BadInput, match="no kubeconfig"):
        connect.connect(None)
    assert connect.connect(None, required=False) is None


@pytest.mark.parametrize(
    ("command", "problem", "message"),
    [
        ("install", "missing", "Error: kubeconfig"),
        ("install", "malformed", "is not usable"),
        ("install", "unreachable", "cannot reach the Kubernetes API server"),
        ("verify", "unreachable", "cannot reach the Kubernetes API server"),
        ("uninstall", "malformed", "is not usable"),
    ],
)
def test_cli_kubeconfig_problems_run_nothing(
    tmp_path, state_dir, cluster, command, problem, message
):
    inv = inventory(tmp_path, ["gpu1"])
    path = tmp_path / "kubeconfig"
    if problem == "malformed":
        path.write_text("this: [is not: a kubeconfig\n")
    elif problem == "unreachable":
        cluster.write_kubeconfig(path, server="http://127.0.0.1:9")
    args = [command, str(inv.path), "--kubeconfig", str(path)]
    if command == "uninstall":
        args += ["--components", "k8s,driver", "--yes"]
    result = run_cli(*args, timeout=120)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Hint:" in result.stderr
    assert "Traceback" not in result.stderr
    assert runs_started(state_dir) == []  # nothing ran on any host
