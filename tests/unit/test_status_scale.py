"""`status` on large fleets: host ↔ node matching stays linear, the list reads pause the
cyclic GC and give it back. (The flows against a real API server are in
tests/kube/test_status.py; the figures in benchmarks/status_10000_nodes.py.)"""

from __future__ import annotations

import gc
import random

import pytest

from gpustack.errors import GpustackError
from gpustack.k8s.cluster import nodes, status
from gpustack.k8s.cluster.flow import Session
from gpustack.k8s.manifests import ClusterConfig


def node(name: str, hostname: str | None = None, ip: str | None = None) -> dict:
    addresses = [{"type": "Hostname", "address": hostname or name}]
    if ip:
        addresses.insert(0, {"type": "InternalIP", "address": ip})
    return {"metadata": {"name": name, "labels": {"kubernetes.io/hostname": hostname or name}},
            "status": {"addresses": addresses}}  # fmt: skip


def reference_candidates(host, name, variables, fleet) -> list[str]:
    """The matching rule, written the obvious (quadratic) way."""
    keys = {host, host.split(".")[0], name, name.split(".")[0]}
    if variables.get("ansible_host") and variables["ansible_host"] not in ("127.0.0.1", "::1"):
        keys.add(str(variables["ansible_host"]))
    return [
        n["metadata"]["name"]
        for n in fleet
        if keys & nodes._identities(n) or n["metadata"]["name"].split(".")[0] in keys
    ]


@pytest.mark.parametrize("seed", range(10))
def test_matching_finds_what_a_full_scan_finds(seed):
    rng = random.Random(seed)
    fleet, wanted, hostvars = [], {}, {}
    for i in range(rng.randint(1, 80)):
        short = f"gpu{i}"
        fleet.append(node(rng.choice([short, f"{short}.cluster.local"]),
                          hostname=rng.choice([None, f"h-{short}"]),
                          ip=rng.choice([None, f"10.0.0.{i}"])))  # fmt: skip
        if rng.random() < 0.2:
            continue  # a node no host names
        host = rng.choice([short, f"{short}.example.com", f"h-{short}", f"other{i}"])
        wanted[host] = rng.choice([host, fleet[-1]["metadata"]["name"]])
        if rng.random() < 0.3:
            hostvars[host] = {"ansible_host": rng.choice([f"10.0.0.{i}", "127.0.0.1"])}
    rng.shuffle(fleet)
    found = nodes.match_hosts(wanted, hostvars, fleet)
    for host, name in wanted.items():
        match = found[host]
        if match.node is not None:
            assert match.node["metadata"]["name"] == name
            continue
        expected = reference_candidates(host, name, hostvars.get(host) or {}, fleet)
        if expected:
            assert f"set k8s_node_name={expected[0]} for {host}" in match.hint
            shown = ", ".join(repr(c) for c in expected[:3])
            assert match.error.endswith(f"the cluster has {shown} that matches it")
        else:
            assert match.error == f"no Node named {name!r} for host {host}"
            assert "(nodes: " in match.hint


def test_matching_reads_each_node_once_however_many_hosts_are_missing(monkeypatch):
    seen = []
    original = nodes._identities

    def counting(n):
        seen.append(n["metadata"]["name"])
        return original(n)

    monkeypatch.setattr(nodes, "_identities", counting)
    fleet = [node(f"gpu{i}") for i in range(300)]
    named = nodes.match_hosts({f"gpu{i}": f"gpu{i}" for i in range(300)}, {}, fleet)
    assert all(m.node for m in named.values()) and seen == []  # all found by name: no scan
    fqdn = {f"gpu{i}.example.com": f"gpu{i}.example.com" for i in range(300)}
    found = nodes.match_hosts(fqdn, {}, fleet)
    assert found["gpu7.example.com"].hint == "set k8s_node_name=gpu7 for gpu7.example.com in the inventory"  # fmt: skip
    assert len(seen) == 300  # once per node, not once per node and host


class FakeCluster:
    """TEST DOUBLE for gpustack.k8s.cluster.connect.Cluster: list answers from memory."""

    def __init__(self, fail: str = ""):
        self.fail = fail
        self.gc_during: list[bool] = []
        self.closed = False

    def list_all(self, path, what, page=500, **query):
        self.gc_during.append(gc.isenabled())
        if self.fail and self.fail in path:
            raise GpustackError(f"cannot {what}: 403 forbidden", "check RBAC")
        if path == "/api/v1/nodes":
            return [node("gpu1")]
        assert query == {"labelSelector": status.DEVICE_PLUGIN_SELECTOR}
        return [{"metadata": {"name": "plugin-gpu1"}, "spec": {"nodeName": "gpu1"},
                 "status": {"conditions": [{"type": "Ready", "status": "True"}]}}]  # fmt: skip

    def close(self):
        self.closed = True


def session(cluster) -> Session:
    config = ClusterConfig(gfd_enabled=False)  # no NFD discovery call: the two lists only
    return Session(cluster, config, "v1.33.0", {"gpu1": "gpu1"}, {})


def test_read_nodes_pauses_the_cyclic_gc_and_gives_it_back():
    cluster = FakeCluster()
    assert gc.isenabled()
    views = status.read_nodes(session(cluster))
    assert views["gpu1"]["device_plugin_ready"] is True
    assert cluster.gc_during == [False, False] and gc.isenabled() and cluster.closed
    gc.disable()
    try:  # a caller that runs without the collector keeps it off
        status.read_nodes(session(FakeCluster()))
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.parametrize("failing", ["/pods", "/nodes"])
def test_a_failed_list_still_gives_the_gc_back_and_closes(failing):
    cluster = FakeCluster(fail=failing)
    with pytest.raises(GpustackError, match="403 forbidden"):
        status.read_nodes(session(cluster))
    assert gc.isenabled() and cluster.closed
