"""Which pods a drain or a GPU-pod eviction takes, as kubectl drain --ignore-daemonsets decides
(k8s.io/kubectl@v0.36.3/pkg/drain/filters.go): the pure verdict, the grouped refusal message,
and the DaemonSet lookup that makes an orphan."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.exceptions import ApiException

from gpustack.k8s.cluster.connect import backpressure, retry_after
from gpustack.k8s.cluster.upgrade import (
    EVICT,
    LOCAL_STORAGE,
    MIRROR_ANNOTATION,
    ORPHANED,
    SKIP,
    UNMANAGED,
    KubernetesBackend,
    claim_names,
    drain_verdict,
    holds_nvidia_device,
    is_gpu_pod,
)
from gpustack.upgrade.backend import StepFailed, StepOptions

GPU = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}


def pod(name="p", *, owner=None, api="apps/v1", emptydir=False, mirror=False, phase="Running"):
    meta = {"name": name, "namespace": "ns", "uid": f"uid-{name}"}
    if owner:
        meta["ownerReferences"] = [
            {"apiVersion": api, "kind": owner, "name": "o", "uid": "u", "controller": True}
        ]
    if mirror:
        meta["annotations"] = {MIRROR_ANNOTATION: "hash"}
    spec = dict(GPU)
    if emptydir:
        spec["volumes"] = [{"name": "scratch", "emptyDir": {}}]
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def verdict(p, gone=False, force=False, emptydir=False):
    return drain_verdict(p, gone, force=force, delete_emptydir_data=emptydir)


def test_a_managed_pod_is_evicted():
    assert verdict(pod(owner="ReplicaSet")) == EVICT


def test_a_bare_pod_needs_force():
    assert verdict(pod()) == UNMANAGED
    assert verdict(pod(), force=True) == EVICT


def test_an_emptydir_pod_needs_delete_emptydir_data_even_when_managed():
    p = pod(owner="ReplicaSet", emptydir=True)
    assert verdict(p) == LOCAL_STORAGE
    assert verdict(p, force=True) == LOCAL_STORAGE  # --force is not the flag for it
    assert verdict(p, emptydir=True) == EVICT


def test_a_bare_emptydir_pod_needs_both_flags():
    p = pod(emptydir=True)
    assert verdict(p, emptydir=True) == UNMANAGED
    assert verdict(p, force=True, emptydir=True) == EVICT


def test_a_mirror_pod_is_skipped_whatever_the_flags():
    p = pod(owner="Node", api="v1", mirror=True, emptydir=True)
    for force in (False, True):
        assert verdict(p, force=force) == SKIP
        assert verdict(p, force=force, emptydir=True) == SKIP
    assert verdict(pod(mirror=True)) == SKIP  # no owner reference at all: still skipped


def test_daemonset_pods_stay_unless_their_daemonset_is_gone():
    ds = pod(owner="DaemonSet", emptydir=True)
    assert verdict(ds) == SKIP  # as --ignore-daemonsets: before the emptyDir check
    assert verdict(ds, gone=True) == ORPHANED
    assert verdict(ds, gone=True, force=True) == LOCAL_STORAGE  # then the other filters run
    assert verdict(ds, gone=True, force=True, emptydir=True) == EVICT


def test_only_an_apps_v1_daemonset_is_a_daemonset():
    assert verdict(pod(owner="DaemonSet", api="apps.kruise.io/v1alpha1")) == EVICT


class Cluster:
    """Answers list-pods with `pods`, GETs of the DaemonSets in `daemonsets`, 404 otherwise."""

    def __init__(self, pods, daemonsets=()):
        self.pods, self.daemonsets, self.evicted = pods, set(daemonsets), []

    def list_all(self, path, what, **query):
        return [p for p in self.pods if p["metadata"]["name"] not in self.evicted]

    def raw(self, method, path, *args, **kw):
        if method == "POST" and path.endswith("/eviction"):
            self.evicted.append(path.split("/")[-2])
            return {}
        if "/daemonsets/" in path:
            if path.rsplit("/", 1)[1] in self.daemonsets:
                return {}
            raise ApiException(status=404, reason="Not Found")
        raise AssertionError(path)


class Clock:
    def now(self):
        return 0.0

    def sleep(self, seconds):
        raise AssertionError("no waiting expected")


def test_every_refused_pod_is_named_before_anything_is_evicted():
    pods = [
        pod("web", owner="ReplicaSet"),
        pod("scratch", owner="ReplicaSet", emptydir=True),
        pod("bare"),
        pod("orphan", owner="DaemonSet"),
        pod("static", owner="Node", api="v1", mirror=True),
    ]
    cluster = Cluster(pods)
    backend = KubernetesBackend(cluster, {"n": "n"})
    with pytest.raises(StepFailed) as failed:
        backend.drain("n", Clock(), StepOptions(drain=True))
    message = str(failed.value)
    assert "pod(s) not managed by a controller would be lost: ns/bare" in message
    assert "pod(s) whose DaemonSet is gone would be lost: ns/orphan" in message
    assert "with local storage (emptyDir) would lose its data: ns/scratch" in message
    assert "--delete-emptydir-data" in message and "--force" in message
    assert "web" not in message and "static" not in message
    assert cluster.evicted == []


def test_with_both_flags_all_but_the_mirror_and_finished_pods_leave():
    pods = [
        pod("web", owner="ReplicaSet"),
        pod("scratch", owner="ReplicaSet", emptydir=True),
        pod("bare"),
        pod("orphan", owner="DaemonSet"),  # its DaemonSet "o" is gone
        pod("static", owner="Node", api="v1", mirror=True),
        pod("done", emptydir=True, phase="Succeeded"),
    ]
    cluster = Cluster(pods)
    backend = KubernetesBackend(cluster, {"n": "n"})
    opts = StepOptions(drain=True, force=True, delete_emptydir_data=True)
    assert backend.drain("n", Clock(), opts) == "evicted 4 pod(s)"
    assert sorted(cluster.evicted) == ["bare", "orphan", "scratch", "web"]


def test_a_live_daemonset_and_a_mirror_pod_are_not_evicted_nor_waited_for():
    pods = [
        pod("agent", owner="DaemonSet"),
        pod("static", owner="Node", api="v1", mirror=True),
        pod("web", owner="ReplicaSet"),
    ]
    cluster = Cluster(pods, daemonsets={"o"})
    backend = KubernetesBackend(cluster, {"n": "n"})
    assert backend.evict_gpu_pods("n", Clock(), StepOptions()) == "evicted 1 GPU pod(s)"
    assert cluster.evicted == ["web"]


# -- GPU pods through DRA: NVIDIA/gpu-operator@a22dbf67 cmd/gpu-operator/main.go gpuPodSpecFilter


def claimed(driver="gpu.nvidia.com", admin=False) -> dict:
    result = {"request": "gpu", "driver": driver, "pool": "n1", "device": "gpu-0"}
    if admin:
        result["adminAccess"] = True
    return {"status": {"allocation": {"devices": {"results": [result]}}}}


def claim_pod(*, named=None, generated=None) -> dict:
    """A pod with one claim: named in its spec, or generated from a template (status)."""
    entry = {"name": "gpu"}
    if named:
        entry["resourceClaimName"] = named
    else:
        entry["resourceClaimTemplateName"] = "tpl"
    status = {"phase": "Running"}
    if generated:
        status["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": generated}]
    return {"metadata": {"name": "w", "namespace": "ns"},
            "spec": {"resourceClaims": [entry], "containers": [{"name": "c"}]}, "status": status}  # fmt: skip


def test_claim_names_come_from_the_spec_or_the_status_and_a_claim_not_generated_yet_has_none():
    assert claim_names(claim_pod(named="mine")) == ["mine"]
    assert claim_names(claim_pod(generated="w-gpu-x7k2p")) == ["w-gpu-x7k2p"]
    assert claim_names(claim_pod()) == []
    assert claim_names({"spec": GPU}) == []


@pytest.mark.parametrize(
    ("claim", "expected"),
    [
        (claimed(), True),
        (claimed(driver="gpu.example.com"), False),  # another driver's device
        (claimed(admin=True), False),  # admin access: monitoring, not a workload's GPU
        ({"status": {}}, False),  # not allocated
        (None, True),  # unreadable: counted, as upstream counts it
    ],
)
def test_a_pod_holding_an_nvidia_dra_device_is_a_gpu_pod(claim, expected):
    pod_ = claim_pod(generated="c1")
    assert holds_nvidia_device(claim) is expected
    assert is_gpu_pod(pod_, {"c1": claim}) is expected


def test_a_device_plugin_gpu_pod_needs_no_claim():
    assert is_gpu_pod({"spec": GPU}) and not is_gpu_pod({"spec": {"containers": [{}]}})


# -- back-pressure: a PodDisruptionBudget's refusal or the API server's throttling

# The eviction API's 429 for a budget (k8s.io/kubernetes@v1.36.3 eviction.go), as the real
# API server answered it in tests/kube/test_drain.py: no Retry-After, a DisruptionBudget cause.
BUDGET_BODY = json.dumps({
    "kind": "Status", "apiVersion": "v1", "status": "Failure",
    "message": "Cannot evict pod as it would violate the pod's disruption budget.",
    "reason": "TooManyRequests",
    "details": {"causes": [{"reason": "DisruptionBudget",
                            "message": "The disruption budget trainer needs 1 healthy pods and "
                                       "has 1 currently"}]},
    "code": 429})  # fmt: skip
# Priority and fairness's 429 (a rejected request): Retry-After, no cause.
THROTTLE_BODY = json.dumps({
    "kind": "Status", "apiVersion": "v1", "status": "Failure",
    "message": "Too many requests, please try again later.", "reason": "TooManyRequests",
    "details": {"retryAfterSeconds": 1}, "code": 429})  # fmt: skip


class Refusing:
    """TEST DOUBLE: answers every eviction with one 429."""

    def __init__(self, body: str, headers: dict):
        self.body, self.headers = body, headers

    def raw(self, method, path, *args, **kw):
        assert kw.get("retries") == 0, "an eviction is asked once per poll"
        exc = ApiException(status=429, reason="Too Many Requests")
        exc.body, exc.headers = self.body, self.headers
        raise exc


def test_a_budgets_refusal_is_told_from_the_servers_throttling():
    budget = KubernetesBackend(Refusing(BUDGET_BODY, {}), {})
    message, wait = budget._evict_one("ml", "train-0")
    assert message == ("blocked by a PodDisruptionBudget: The disruption budget trainer needs "
                       "1 healthy pods and has 1 currently") and wait == 0  # fmt: skip
    throttled = KubernetesBackend(Refusing(THROTTLE_BODY, {"Retry-After": "1"}), {})
    assert throttled._evict_one("ml", "train-0") == (
        "throttled by the API server (429 Too Many Requests; asked to retry after 1 s)", 1)  # fmt: skip


@pytest.mark.parametrize(("value", "seconds"), [("1", 1), (" 10 ", 10), ("0", 0), (None, None),
                                                 ("Fri, 04 Dec 2026 10:00:00 GMT", None), ("-1", None)])  # fmt: skip
def test_retry_after_is_read_as_client_go_reads_it(value, seconds):
    assert retry_after(value) == seconds


def test_backpressure_is_429_or_5xx():
    assert backpressure(429) and backpressure(503) and not backpressure(409)
