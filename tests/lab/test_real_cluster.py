"""gpustack against a real Kubernetes on the lab: `gpustack lab up --kubernetes` starts etcd,
kube-apiserver, kube-controller-manager and kube-scheduler (gpustack/lab/components.py's pinned
versions, built from Go modules) and a real kubelet on every node, talking to the node's own
containerd: Debian 12's 1.6 and Debian 13's 1.7. (forky's containerd 2.x cannot host a kubelet
on a cgroup v1 "hybrid" machine such as the CI's: its systemd needs cgroup2, which there carries
no cpu or memory controller; docs/lab.md.)

No node has a GPU: install, status, verify and uninstall run for real and say so ("no NVIDIA
device"); what needs GPUs to be allocated is in tests/kube/ on kwok's stand-in nodes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import run_cli
from tests.fixtures import lab_fixtures

pytestmark = pytest.mark.lab

LAB = f"{os.environ.get('GPUSTACK_TEST_LAB_PREFIX', '')}rk{os.getpid()}"
OSES = ("debian12", "debian13")
NODES = [f"{LAB}-node{i + 1}" for i in range(len(OSES))]
CONTAINERS = [f"gpustack-{LAB}-node{i + 1}" for i in range(len(OSES))]


def list_nodes(kubeconfig: Path) -> list[dict]:
    """The Node objects, as `kubectl get nodes -o json` shows them."""
    from kubernetes import client, config

    api = config.new_client_from_config(str(kubeconfig))
    return api.sanitize_for_serialization(client.CoreV1Api(api).list_node())["items"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    folder = tmp_path_factory.mktemp("realk8s")
    inventory = folder / "lab.ini"
    try:
        proc = run_cli("lab", "up", "--name", LAB, "--nodes", str(len(OSES)),
                       "--os", ",".join(OSES), "--inventory", str(inventory), "--kubernetes",
                       timeout=3600)  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        kubeconfig = Path(proc.stdout.split("Kubeconfig:")[1].split()[0])
        varsfile = lab_fixtures.prepare(CONTAINERS, folder / "vars.json")
        yield inventory, kubeconfig, varsfile
    finally:
        run_cli("lab", "down", "--name", LAB)


def test_every_node_runs_a_real_kubelet_on_its_own_containerd(lab):
    _, kubeconfig, _ = lab
    nodes = {n["metadata"]["name"]: n for n in list_nodes(kubeconfig)}
    assert set(nodes) == set(NODES)
    runtimes = {}
    for name, node in nodes.items():
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"] == "v1.36.3"
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True", ready
        runtimes[name] = info["containerRuntimeVersion"]
    majors = {v.split("://")[1].split(".")[0] + "." + v.split(".")[1] for v in runtimes.values()}
    assert majors == {"1.6", "1.7"}, runtimes


def install(inventory: Path, kubeconfig: Path, varsfile: Path, *extra: str) -> tuple[int, dict]:
    proc = run_cli("install", str(inventory), "--kubeconfig", str(kubeconfig), "-e",
                   f"@{varsfile}", "--output", "json", *extra, timeout=3600)  # fmt: skip
    return proc.returncode, json.loads(proc.stdout)


def test_install_applies_for_real_and_says_there_is_no_gpu(lab):
    inventory, kubeconfig, varsfile = lab
    code, report = install(inventory, kubeconfig, varsfile)
    k8s = report["kubernetes"]
    assert code == 3, report  # verification failed: no node has a GPU, and that is said
    assert report["summary"]["failed"] == 0 and report["summary"]["ok"] == len(NODES)
    assert k8s["version"] == "v1.36.3"
    assert {a["action"] for a in k8s["applied"]} == {"created"}, k8s["applied"]
    assert ("RuntimeClass", "nvidia") in {(a["kind"], a["name"]) for a in k8s["applied"]}
    assert k8s["labels"] == {}  # no NVIDIA device: no GPU label, no operand on the node
    for node in NODES:
        checks = {c["name"]: c for c in k8s["nodes"][node]["checks"]}
        assert checks["node"]["status"] == "passed"
        assert checks["gpus"]["status"] == "failed"
        assert "no NVIDIA device" in checks["gpus"]["message"], checks

    # A second install changes nothing, on the hosts or in the API server (server-side apply
    # of the same objects keeps every resourceVersion).
    code, again = install(inventory, kubeconfig, varsfile)
    assert code == 3
    assert again["summary"]["changed"] == 0, again["summary"]
    assert {a["action"] for a in again["kubernetes"]["applied"]} == {"unchanged"}


def test_uninstall_removes_gpustacks_objects(lab):
    inventory, kubeconfig, _ = lab
    proc = run_cli("uninstall", str(inventory), "--components", "k8s", "--kubeconfig",
                   str(kubeconfig), "--yes", timeout=1200)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from kubernetes import client, config

    api = config.new_client_from_config(str(kubeconfig))
    names = [rc.metadata.name for rc in client.NodeV1Api(api).list_runtime_class().items]
    assert "nvidia" not in names
    namespace = (
        client.CoreV1Api(api).list_namespace(field_selector="metadata.name=gpustack-system").items
    )
    assert not namespace or namespace[0].status.phase == "Terminating"
