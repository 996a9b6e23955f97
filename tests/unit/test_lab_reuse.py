"""`gpustack lab up` reuses a node of an earlier `up` only when it is really there."""

import subprocess

import pytest

from gpustack.lab import nodes

NODE = nodes.Node("demo-node1", "debian12", 40000, "gpustack-demo-node1")
IMAGE = "localhost/gpustack-lab:debian12"


@pytest.fixture
def podman(monkeypatch):
    """podman as the lab sees it: inspect answers `state`, exec answers `exec_rc`."""
    calls: list[list[str]] = []
    answers = {"state": "running", "exec_rc": 0, "start_rc": 0}

    def info(container):
        return {"ImageName": IMAGE, "State": {"Status": answers["state"]}}

    def run(args, check=True, **_):
        calls.append(args)
        rc = answers["exec_rc"] if args[1] == "exec" else answers["start_rc"]
        return subprocess.CompletedProcess(args, rc, b"", b"")

    monkeypatch.setattr(nodes, "_container_info", info)
    monkeypatch.setattr(nodes, "run", run)
    return answers, calls


def test_a_running_node_that_answers_is_reused(podman):
    _, calls = podman
    assert nodes._reuse_node(NODE, IMAGE) is True
    assert calls == [["podman", "exec", NODE.container, "true"]]


def test_a_node_podman_calls_running_but_whose_processes_are_gone_is_replaced(podman):
    # podman 4.3: "runc: exec failed: cannot exec in a stopped container", State.Status "running"
    answers, calls = podman
    answers["exec_rc"] = 125
    assert nodes._reuse_node(NODE, IMAGE) is False
    assert calls == [["podman", "exec", NODE.container, "true"]]  # no `podman start` tried


def test_a_stopped_node_is_started_again(podman):
    answers, calls = podman
    answers["state"] = "exited"
    assert nodes._reuse_node(NODE, IMAGE) is True
    assert calls == [["podman", "start", NODE.container]]
