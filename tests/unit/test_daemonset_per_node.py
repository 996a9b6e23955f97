"""The operands check judges each node by its own DaemonSet pod (gpustack/k8s/cluster/apply.py
`node_verdict`, `wait_daemonsets`; flow.py `_operands`): a broken node elsewhere in the cluster
fails nothing here. Pure logic and a fake API answering the two lists the wait makes."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpustack.k8s.cluster import apply, flow

LONG_AGO = "2026-01-01T00:00:00Z"
SELECTOR = {"matchLabels": {"app.kubernetes.io/name": "nvidia-device-plugin"}}


def daemonset(name="nvidia-device-plugin", generation=1, template_generation="1", observed=None,
              min_ready=0):  # fmt: skip
    return {
        "metadata": {"name": name, "namespace": "gs", "uid": f"uid-{name}",
                     "generation": generation,
                     "annotations": {apply.TEMPLATE_GENERATION: template_generation}},
        "spec": {"selector": SELECTOR, "minReadySeconds": min_ready,
                 "template": {"spec": {"nodeSelector": {f"deploy.{name}": "true"}}}},
        "status": {"observedGeneration": generation if observed is None else observed,
                   # the DaemonSet as a whole: a node outside the check is broken
                   "desiredNumberScheduled": 2, "numberReady": 1, "updatedNumberScheduled": 2},
    }  # fmt: skip


def pod(node, name=None, ready=True, since=LONG_AGO, generation="1", hash_="h1", restarts=0,
        owner="uid-nvidia-device-plugin", bound=True, waiting=None, deleting=False):  # fmt: skip
    meta = {"name": name or f"plugin-{node}", "uid": f"uid-{name or node}-{restarts}",
            "creationTimestamp": LONG_AGO,
            "labels": {apply.GENERATION_LABEL: generation, apply.HASH_LABEL: hash_},
            "ownerReferences": [{"uid": owner, "controller": True, "kind": "DaemonSet"}]}  # fmt: skip
    if deleting:
        meta["deletionTimestamp"] = LONG_AGO
    state = {"waiting": waiting} if waiting else {"running": {"startedAt": since}}
    spec = {"nodeName": node} if bound else {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]}}}}  # fmt: skip
    return {
        "metadata": meta,
        "spec": spec,
        "status": {"phase": "Running" if ready or not waiting else "Pending",
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                   "lastTransitionTime": since}],
                   "containerStatuses": [{"name": "plugin", "ready": ready, "state": state,
                                          "restartCount": restarts}]},
    }  # fmt: skip


NOW = datetime(2026, 6, 1, tzinfo=UTC).timestamp()


def verdict(pods, node="gpu1", ds=None, current_hash=None, now=NOW):
    return apply.node_verdict(ds or daemonset(), pods, node, current_hash, now)


def test_a_ready_pod_of_the_current_template_is_ready():
    assert verdict([pod("gpu1")]).state == apply.READY


def test_no_pod_on_the_node():
    got = verdict([])
    assert (got.state, got.text) == (apply.NOT_READY, "on gpu1: no pod scheduled yet")


def test_a_pod_being_deleted_does_not_count():
    got = verdict([pod("gpu1", deleting=True)])
    assert got.state == apply.NOT_READY and "being deleted" in got.text


def test_not_ready_pod_says_the_kubelets_reason():
    crash = {"reason": "CrashLoopBackOff", "message": "back-off 40s restarting failed container"}
    got = verdict([pod("gpu1", ready=False, waiting=crash, restarts=3)])
    assert got.state == apply.NOT_READY
    assert got.text == (
        "on gpu1: pod plugin-gpu1 Pending, not Ready: container plugin CrashLoopBackOff: "
        "back-off 40s restarting failed container; restarted 3 time(s)"
    )


def test_old_template_is_not_ready_unless_its_hash_is_current():
    ds = daemonset(generation=3, template_generation="2")
    old = pod("gpu1", generation="1", hash_="h1")
    got = verdict([old], ds=ds, current_hash="h2")
    assert got.state == apply.NOT_READY
    assert "pod plugin-gpu1 is of an old template (generation 1, the DaemonSet's is 2)" in got.text
    # the template changed back to revision h1: the controller keeps that pod (IsPodUpdated)
    assert verdict([old], ds=ds, current_hash="h1").state == apply.READY


def test_an_unbound_pod_is_for_the_node_its_affinity_names():
    unbound = pod("gpu1", bound=False, ready=False)
    assert apply.target_node(unbound) == "gpu1"
    assert apply.target_node(pod("gpu2")) == "gpu2"


def test_just_ready_is_settling_for_the_steady_seconds_or_min_ready_seconds():
    since = datetime.fromtimestamp(NOW - 2, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    got = verdict([pod("gpu1", since=since, restarts=2)])
    assert got.state == apply.SETTLING and got.need == apply.STEADY_SECONDS
    assert got.text == "on gpu1: pod plugin-gpu1 Ready after 2 restart(s) for 2 s of the 5 s"
    assert verdict([pod("gpu1", since=since)], now=NOW + 10).state == apply.READY
    slow = daemonset(min_ready=30)
    assert verdict([pod("gpu1", since=since)], ds=slow, now=NOW + 10).need == 30


def test_selector_query():
    selector = {"matchLabels": {"b": "2", "a": "1"},
                "matchExpressions": [{"key": "c", "operator": "In", "values": ["x", "y"]},
                                     {"key": "d", "operator": "DoesNotExist"}]}  # fmt: skip
    assert apply.selector_query(selector) == "a=1,b=2,c in (x,y),!d"


# ----------------------------------------------------------------------------- the wait


class Clock:
    def __init__(self):
        self.t = 0.0

    def now(self):
        return self.t

    def sleep(self, seconds):
        self.t += seconds


class FakeCluster:
    """The DaemonSets and pods the wait reads; `looks` calls `on_look(n)` before the n-th pod
    list, so a test can change the pods while gpustack waits. Counts the lists it answers."""

    def __init__(self, daemonsets, pods, revisions=()):
        self.daemonsets, self.pods, self.revisions = daemonsets, pods, list(revisions)
        self.pod_lists: list[str] = []
        self.revision_lists = 0
        self.on_look = None
        self.deployments: list[dict] = []

    def raw(self, method, path, query=None):
        if "/controllerrevisions" in path:
            self.revision_lists += 1
            return {"items": self.revisions}
        name = path.rsplit("/", 1)[1]
        if "/deployments/" in path:
            if self.on_look:
                self.on_look(len(self.pod_lists))
            return next(d for d in self.deployments if d["metadata"]["name"] == name)
        return next(d for d in self.daemonsets if d["metadata"]["name"] == name)

    def list_all(self, path, what, **query):
        if self.on_look:
            self.on_look(len(self.pod_lists))
        self.pod_lists.append(query["labelSelector"])
        return list(self.pods)


LABELS = {"gpu1": {"deploy.nvidia-device-plugin": "true"},
          "gpu2": {"deploy.nvidia-device-plugin": "true"}}  # fmt: skip


def wait(cluster, nodes=("gpu1",), timeout=10, clock=None):
    labels = {n: LABELS[n] for n in nodes}
    return apply.wait_daemonsets(cluster, "gs", ["nvidia-device-plugin"], labels, timeout,
                                 clock or Clock())  # fmt: skip


def test_a_broken_pod_on_a_node_outside_the_check_fails_nothing():
    crash = {"reason": "CrashLoopBackOff", "message": "back-off"}
    cluster = FakeCluster([daemonset()], [pod("gpu1"), pod("other", ready=False, waiting=crash)])
    [result] = wait(cluster)
    assert result.ready and result.problems == {}
    assert result.message == "ready on 1 node(s); not Ready elsewhere (not checked): other"
    assert cluster.pod_lists == ["app.kubernetes.io/name=nvidia-device-plugin"]  # one look
    assert apply.daemonset_state(cluster.daemonsets[0], 1)[0] is False  # the old, whole verdict
    assert flow._operands([result], ["gpu1"]) == {"gpu1": (True, "nvidia-device-plugin")}


def test_the_nodes_own_broken_pod_fails_it_and_names_the_node():
    crash = {"reason": "CrashLoopBackOff", "message": "back-off"}
    pods = [pod("gpu1"), pod("gpu2", ready=False, waiting=crash, restarts=4)]
    clock = Clock()
    [result] = wait(FakeCluster([daemonset()], pods), nodes=("gpu1", "gpu2"), clock=clock)
    assert not result.ready and list(result.problems) == ["gpu2"]
    assert result.problems["gpu2"].startswith(
        "not ready after 10 s: on gpu2: pod plugin-gpu2 Pending, not Ready: container plugin "
        "CrashLoopBackOff: back-off; restarted 4 time(s)"
    )
    assert clock.t >= 10
    state = flow._operands([result], ["gpu1", "gpu2"])
    assert state["gpu1"] == (True, "nvidia-device-plugin")
    assert state["gpu2"][0] is False
    assert state["gpu2"][1].startswith("DaemonSet nvidia-device-plugin not ready after 10 s: "
                                       "on gpu2: pod plugin-gpu2")  # fmt: skip


def test_a_rollout_that_keeps_progressing_is_waited_for_beyond_the_timeout():
    """Ten nodes whose pods get ready one every 6 s: 60 s in all, with a 10 s timeout. Each
    node's progress restarts the timeout; once nothing progresses for 10 s the wait ends."""
    nodes = [f"gpu{i}" for i in range(10)]
    for node in nodes:
        LABELS.setdefault(node, {"deploy.nvidia-device-plugin": "true"})
    clock = Clock()
    cluster = FakeCluster([daemonset()], [])

    def kubelet(look):  # one more node's pod Ready every 6 looks (a look a second)
        up = nodes[: min(len(nodes), look // 6 + 1)]
        cluster.pods = [pod(n) for n in up] + [pod(n, ready=False) for n in nodes if n not in up]

    cluster.on_look = kubelet
    [result] = wait(cluster, nodes=nodes, clock=clock)
    assert result.ready, result.message
    assert 54 <= clock.t <= 60

    def stalls(look):  # three nodes, then nothing more
        up = nodes[: min(3, look // 6 + 1)]
        cluster.pods = [pod(n) for n in up] + [pod(n, ready=False) for n in nodes if n not in up]

    cluster, clock = FakeCluster([daemonset()], []), Clock()
    cluster.on_look = stalls
    [result] = wait(cluster, nodes=nodes, clock=clock)
    assert not result.ready and len(result.problems) == 7
    assert result.message.startswith("not ready after 22 s, the last 10 s without progress: ")


def test_a_pod_just_ready_is_watched_for_the_steady_seconds():
    fresh = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    cluster = FakeCluster([daemonset()], [pod("gpu1", since=fresh)])
    clock = Clock()
    [result] = wait(cluster, clock=clock)
    assert result.ready
    assert apply.STEADY_SECONDS <= clock.t <= apply.STEADY_SECONDS + 1
    assert len(cluster.pod_lists) == int(clock.t) + 1


def test_a_crash_looping_pod_ready_for_a_moment_does_not_pass():
    """Ready for one look, then crashed and restarted (a new restart count): never steady."""
    fresh = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    crash = {"reason": "CrashLoopBackOff", "message": "back-off 10s"}
    cluster = FakeCluster([daemonset()], [])

    def kubelet(look):  # Ready at every third look, with one more restart each time
        restarts = look // 3
        cluster.pods = [pod("gpu1", since=fresh, restarts=restarts) if look % 3 == 0
                        else pod("gpu1", ready=False, waiting=crash, restarts=restarts)]  # fmt: skip

    cluster.on_look = kubelet
    [result] = wait(cluster, timeout=20)
    assert not result.ready
    assert "on gpu1: pod plugin-gpu1" in result.problems["gpu1"]


def test_old_template_pods_ask_for_the_current_revision_once_per_look():
    ds = daemonset(generation=2, template_generation="2")
    revisions = [
        {"metadata": {"name": "r1", "labels": {apply.HASH_LABEL: "h1"},
                      "ownerReferences": [{"uid": "uid-nvidia-device-plugin", "controller": True}]},
         "revision": 1},
        {"metadata": {"name": "r2", "labels": {apply.HASH_LABEL: "h2"},
                      "ownerReferences": [{"uid": "uid-nvidia-device-plugin", "controller": True}]},
         "revision": 2},
    ]  # fmt: skip
    cluster = FakeCluster([ds], [pod("gpu1", generation="1", hash_="h1")], revisions)
    [result] = wait(cluster, timeout=2)
    assert not result.ready and "old template" in result.problems["gpu1"]
    assert cluster.revision_lists == len(cluster.pod_lists)
    cluster = FakeCluster([ds], [pod("gpu1", generation="1", hash_="h2")], revisions)
    assert wait(cluster)[0].ready  # its hash is the current revision's


def test_not_observed_generation_fails_every_checked_node_without_reading_pods():
    cluster = FakeCluster([daemonset(generation=2, observed=1)], [pod("gpu1")])
    [result] = wait(cluster, timeout=1)
    assert result.problems == {
        "gpu1": "not ready after 1 s: the controller has not observed generation 2 yet"
    }
    assert cluster.pod_lists == []


def test_not_found_ends_the_wait_and_fails_every_node():
    class Missing(FakeCluster):
        def raw(self, method, path, query=None):
            from kubernetes.client.exceptions import ApiException

            raise ApiException(status=404)

    clock = Clock()
    [result] = wait(Missing([], []), clock=clock)
    assert clock.t == 0 and result.message.startswith("not found")
    ok, message = flow._operands([result], ["gpu1"])["gpu1"]
    assert not ok and message.startswith("DaemonSet nvidia-device-plugin not found")


@pytest.mark.parametrize("owner", ["uid-someone-else"])
def test_pods_of_another_controller_are_not_the_daemonsets(owner):
    cluster = FakeCluster([daemonset()], [pod("gpu1", owner=owner)])
    [result] = wait(cluster, timeout=1)
    assert result.problems["gpu1"].endswith("on gpu1: no pod scheduled yet")


def deployment(updated=1, available=1, replicas=None, observed=1, conditions=()):
    return {"metadata": {"name": "hami-scheduler", "generation": 1},
            "spec": {"replicas": 1},
            "status": {"observedGeneration": observed, "updatedReplicas": updated,
                       "replicas": updated if replicas is None else replicas,
                       "availableReplicas": available, "conditions": list(conditions)}}  # fmt: skip


def wait_with_scheduler(cluster, clock, timeout=10):
    return apply.wait_daemonsets(cluster, "gs", ["nvidia-device-plugin"], {"gpu1": LABELS["gpu1"]},
                                 timeout, clock, deployments=["hami-scheduler"])  # fmt: skip


@pytest.mark.parametrize(("status", "why"), [
    ({"available": 0}, "0 of 1 updated replica(s) available"),
    ({"updated": 0, "available": 0}, "0 of 1 replica(s) updated"),
    ({"replicas": 2}, "1 old replica(s) pending termination"),
    ({"observed": 0}, "the controller has not observed its newest generation yet"),
    ({"available": 0, "conditions": [{"type": "Progressing", "status": "False",
                                      "reason": "ProgressDeadlineExceeded",
                                      "message": 'ReplicaSet "x" has timed out progressing.'}]},
     'its rollout exceeded its progress deadline: ReplicaSet "x" has timed out progressing.'),
])  # fmt: skip
def test_a_deployment_not_rolled_out_fails_every_node_as_kubectl_rollout_status_would(status, why):
    """HAMi's scheduler places every GPU pod: every labelled node needs it rolled out."""
    cluster = FakeCluster([daemonset()], [pod("gpu1")])
    cluster.deployments = [deployment(**status)]
    clock = Clock()
    plugin, scheduler = wait_with_scheduler(cluster, clock)
    assert plugin.ready and not scheduler.ready
    assert scheduler.kind == "Deployment" and scheduler.message == f"not ready after 10 s: {why}"
    assert flow._operands([plugin, scheduler], ["gpu1", "gpu2"]) == {
        "gpu1": (False, f"Deployment hami-scheduler not ready after 10 s: {why}"),
        "gpu2": (False, "no gpustack DaemonSet selects this node (labels missing?)"),
    }


def test_a_deployment_that_becomes_available_ends_the_wait_and_counts_as_progress():
    cluster = FakeCluster([daemonset()], [pod("gpu1")])
    cluster.deployments = [deployment(available=0)]

    def controller(look):  # available after 15 looks: longer than the timeout, with progress
        if look >= 15:
            cluster.deployments = [deployment()]

    cluster.on_look = controller
    clock = Clock()
    plugin, scheduler = wait_with_scheduler(cluster, clock, timeout=20)
    assert scheduler.ready and scheduler.message == "1 replica(s) available"
    assert 14 <= clock.t <= 16
    assert flow._operands([plugin, scheduler], ["gpu1"]) == {
        "gpu1": (True, "hami-scheduler, nvidia-device-plugin")
    }
