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


def test_a_port_taken_before_podman_binds_it_is_replaced(monkeypatch):
    ports, started = iter([41001, 41002]), []

    def start(node, image, key, init, kubernetes=False):
        started.append(node.port)
        if node.port == 41001:
            raise nodes.LabError(
                "`podman run -d --name …` failed: bind: address already in use", ""
            )

    monkeypatch.setattr(nodes, "_free_port", lambda: next(ports))
    monkeypatch.setattr(nodes, "_start_node", start)
    spec = nodes.OS_SPECS["debian12"]
    node = nodes._start_new_node("demo-node1", spec, "gpustack-demo-node1", IMAGE, None)
    assert (node.port, started) == (41002, [41001, 41002])


def test_other_start_failures_are_not_retried(monkeypatch):
    started = []

    def start(node, image, key, init, kubernetes=False):
        started.append(node.port)
        raise nodes.LabError("`podman run -d --name …` failed: no such image", "")

    monkeypatch.setattr(nodes, "_free_port", lambda: 41003)
    monkeypatch.setattr(nodes, "_start_node", start)
    with pytest.raises(nodes.LabError, match="no such image"):
        nodes._start_new_node("demo-node1", nodes.OS_SPECS["debian12"], "c", IMAGE, None)
    assert started == [41003]
