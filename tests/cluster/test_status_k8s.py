"""`gpustack status` Kubernetes columns against the API emulator over real HTTP."""

from __future__ import annotations

import json
import re

from gpustack.k8s.cluster import status as cluster_status
from gpustack.k8s.cluster.nodes import NodeMatch
from tests.cluster.status_helpers import gpu_node, install_device_plugin
from tests.conftest import run_cli
from tests.unit.test_status import facts


def test_node_views_are_pure_and_map_pods_to_nodes():
    node = {
        "metadata": {"name": "n1", "labels": {cluster_status.UPGRADE_STATE_LABEL: "upgrade-done"}},
        "spec": {"unschedulable": True},
        "status": {"allocatable": {"nvidia.com/gpu": "4"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip
    pods = [
        {"metadata": {"name": "p1"}, "spec": {"nodeName": "n1"},
         "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        {"metadata": {"name": "p2"}, "spec": {"nodeName": "other"}, "status": {}},
    ]  # fmt: skip
    views = cluster_status.node_views(
        {"h1": NodeMatch("h1", "n1", node), "h2": NodeMatch("h2", "n2", None, "no Node", "hint")},
        pods,
    )
    assert views["h1"] == {
        "node": "n1", "ready": True, "cordoned": True, "allocatable_gpus": 4,
        "device_plugin_ready": True, "device_plugin_pods": ["p1"], "upgrade_state": "upgrade-done",
        "gfd_labels": False,
    }  # fmt: skip
    assert views["h2"] == {"node": None, "error": "no Node", "hint": "hint"}
    # A node meant to run GFD but without its labels gets a note, worded by NFD's presence.
    node["metadata"]["labels"]["nvidia.com/gpu.deploy.gpu-feature-discovery"] = "true"
    match = {"h1": NodeMatch("h1", "n1", node)}
    note = cluster_status.node_views(match, pods, nfd_api=False)["h1"]["note"]
    assert (
        note.startswith("GFD labels need Node Feature Discovery running")
        and "not installed" in note
    )
    note = cluster_status.node_views(match, pods, nfd_api=True)["h1"]["note"]
    assert "is nfd-master running?" in note
    node["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-A100-SXM4-80GB"
    view = cluster_status.node_views(match, pods, nfd_api=False)["h1"]
    assert view["gfd_labels"] is True and "note" not in view


def _local_inventory(tmp_path, hosts: dict[str, str]):
    lines = ["[gpu_nodes]"] + [
        f"{h} ansible_connection=local ansible_python_interpreter=/usr/bin/python3 k8s_node_name={n}"
        for h, n in hosts.items()
    ]
    path = tmp_path / "inv.ini"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_status_reads_nodes_and_plugin_pods_with_list_calls(
    tmp_path, cluster, kubeconfig, state_dir
):
    em = cluster.emulator
    gpu_node(em, "node-a", 1, gfd=True, state="upgrade-done")
    gpu_node(em, "node-b", 0)  # labelled for the plugin but without a GPU: it crash-loops
    em.add_nodes(3, prefix="cpu")
    install_device_plugin(em)
    inv = _local_inventory(
        tmp_path, {"local-a": "node-a", "local-b": "node-b", "local-c": "missing"}
    )
    before = em.count()
    proc = run_cli("status", str(inv), "--kubeconfig", str(kubeconfig), "-o", "json", timeout=300)
    assert proc.returncode == 5, proc.stderr
    doc = json.loads(proc.stdout)
    a, b, c = (doc["nodes"][h]["kubernetes"] for h in ("local-a", "local-b", "local-c"))
    assert a["node"] == "node-a" and a["allocatable_gpus"] == 1 and a["device_plugin_ready"] is True
    assert doc["nodes"]["local-a"]["upgrade_state"] == "upgrade-done"
    assert b["allocatable_gpus"] == 0 and b["device_plugin_ready"] is False
    assert a["gfd_labels"] is False and "note" not in b  # b is not meant to run GFD
    assert a["note"].startswith("GFD labels need Node Feature Discovery running")
    assert c["node"] is None
    assert "no Node named 'missing' for host local-c" in doc["drift"]["local-c"]
    # Reads only: GET /version, NFD's API discovery, one page of nodes and one of plugin pods.
    assert em.count() - before == 4
    assert em.count("GET", "/apis/nfd.k8s-sigs.io/v1alpha1") == 1
    assert em.count("GET", "/api/v1/nodes") == 1
    assert em.count("GET", "/api/v1/namespaces/gpustack-system/pods") == 1
    assert em.count("POST") == em.count("PATCH") == em.count("DELETE") == 0
    text = run_cli("status", str(inv), "--kubeconfig", str(kubeconfig), "-o", "wide", timeout=300)
    assert text.returncode == 5
    assert re.search(r"local-a .* node-a\s+1\s+ready\s+upgrade-done", text.stdout), text.stdout
    short = run_cli("status", str(inv), "--kubeconfig", str(kubeconfig), timeout=300)
    assert re.search(r"local-a .* 1\s+upgrade-done", short.stdout), short.stdout  # gpus column
    assert max(len(line) for line in short.stdout.splitlines()) <= 120
    assert "Note: GFD labels need Node Feature Discovery running" in text.stdout


def test_kubernetes_drift_for_a_gpu_node():
    gpu = facts(gpus=1, loaded="535.261.03")
    from gpustack.fleet import status as fleet

    ok = fleet.node_status("h", gpu, {"node": "n", "allocatable_gpus": 1, "device_plugin_ready": True},
                           k8s_expected=True)  # fmt: skip
    assert ok.drift == []
    missing = fleet.node_status(
        "h", gpu, {"node": None, "error": "no Node named 'n'"}, k8s_expected=True
    )
    assert missing.drift == ["no Node named 'n'"]


def test_pagination_follows_continue_tokens(cluster, kubeconfig, tmp_path):
    """1200 nodes and 1200 plugin pods: three pages each, never one request per node."""
    em = cluster.emulator
    names = [f"gpu{i:04d}" for i in range(1200)]
    for name in names:
        gpu_node(em, name, 8)
    install_device_plugin(em)
    from gpustack.ansible.inventory import load_inventory

    inv = tmp_path / "big.ini"
    inv.write_text("[gpu_nodes]\n" + "\n".join(names) + "\n")
    inventory = load_inventory(inv)
    session = cluster_status.prepare(str(kubeconfig), inventory, {})
    before = em.count()
    views = cluster_status.read_nodes(session)
    assert len(views) == 1200 and all(v["device_plugin_ready"] for v in views.values())
    assert all(v["allocatable_gpus"] == 8 for v in views.values())
    assert em.count() - before == 7  # 3 pages of nodes, 3 of pods, NFD's API discovery
