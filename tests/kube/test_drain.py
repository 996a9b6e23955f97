"""The upgrade's node steps (cordon, GPU pod eviction) against a real control plane: the
Eviction API, a real PodDisruptionBudget kept by kube-controller-manager's disruption
controller, the Deployment and ReplicaSet controllers and the scheduler placing replacements.

The nodes are kwok's STAND-IN nodes: their "GPUs" are allocatable numbers the test writes,
and kwok plays the kubelet (pods Running and Ready, deletions finished)."""

from __future__ import annotations

import base64
import contextlib
import http.server
import itertools
import json
import ssl
import threading
import time
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from gpustack.errors import BadInput
from gpustack.k8s.cluster.connect import connect
from gpustack.k8s.cluster.upgrade import MIRROR_ANNOTATION, KubernetesBackend
from gpustack.upgrade.backend import StepFailed, StepOptions
from gpustack.upgrade.executors import RealClock
from tests.conftest import wait_until
from tests.kube.stand_ins import kwok_node

pytestmark = pytest.mark.kube
JSON = "application/json"

GPU = "nvidia.com/gpu"


def running_pods(cluster, namespace: str) -> list[dict]:
    pods = cluster.raw("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
    return [
        p
        for p in pods
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]


def test_gpu_pods_leave_one_at_a_time_under_a_real_pdb(kubeconfig, unique):
    cluster = connect(str(kubeconfig))
    old, new, ns = f"old-{unique}", f"new-{unique}", f"work-{unique}"
    kwok_node(cluster, old, gpus=8)
    kwok_node(cluster, new, gpus=8, unschedulable=True)  # both replicas start on `old`
    cluster.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}},
                ctype="application/json")  # fmt: skip
    labels = {"app": "trainer"}
    # fmt: off
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "trainer", "namespace": ns},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [{"matchExpressions": [{
                            "key": "kubernetes.io/hostname", "operator": "In",
                            "values": [old, new]}]}]}}},
                    "containers": [{
                        "name": "train", "image": "lab.gpustack.local/trainer:1",
                        "resources": {"limits": {GPU: "1"}}}],
                },
            },
        },
    }
    # fmt: on
    cluster.raw(
        "POST",
        f"/apis/apps/v1/namespaces/{ns}/deployments",
        body=deployment,
        ctype="application/json",
    )  # fmt: skip
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "trainer", "namespace": ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}},
    }
    cluster.raw("POST", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", body=pdb,
                ctype="application/json")  # fmt: skip
    wait_until(lambda: len(running_pods(cluster, ns)) == 2, what="2 trainer pods Running")
    assert {p["spec"]["nodeName"] for p in running_pods(cluster, ns)} == {old}
    wait_until(
        lambda: (
            cluster.raw("GET", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/trainer")
            .get("status", {})
            .get("disruptionsAllowed")
            == 1
        ),
        what="the disruption controller to allow one disruption",
    )
    backend = KubernetesBackend(cluster, {old: old, new: new})
    opts = StepOptions(pod_deletion_timeout=120, poll=0.5)
    backend.cordon(old, RealClock(), opts)
    first, second = sorted(p["metadata"]["name"] for p in running_pods(cluster, ns))
    # The budget allows one disruption: the API server takes the first eviction and refuses
    # the second with 429 until a replacement is Ready. `new` stays cordoned until then: kwok
    # makes a replacement Ready within milliseconds, before a second eviction could be refused.
    assert backend._evict_one(ns, first) == ("", 0)
    refused, wait = backend._evict_one(ns, second)
    assert refused.startswith("blocked by a PodDisruptionBudget") and wait == 0, refused
    assert "disruption budget trainer needs 1 healthy pods" in refused, refused
    cluster.raw("PATCH", f"/api/v1/nodes/{new}", body={"spec": {"unschedulable": False}},
                ctype="application/merge-patch+json")  # fmt: skip
    wait_until(lambda: first not in {p["metadata"]["name"] for p in backend.pods_on(old)},
         what="the evicted pod gone")  # fmt: skip
    message = backend.evict_gpu_pods(old, RealClock(), opts)

    assert message == "evicted 1 GPU pod(s)"  # the second; the first was gone already
    pods = wait_until(lambda: len(running_pods(cluster, ns)) == 2 and running_pods(cluster, ns),
                what="replacements Running")  # fmt: skip
    assert {p["spec"]["nodeName"] for p in pods} == {new}


def test_an_accepted_eviction_is_not_asked_again_while_the_pod_terminates(kube, kubeconfig, unique):
    """A pod that takes a while to go (a finalizer holds it here; on a kubelet, its grace period)
    was evicted once: gpustack waits for it and posts no more evictions (each would be another
    DELETE of a terminating pod)."""
    cluster = connect(str(kubeconfig))
    node, ns = f"slow-{unique}", f"slow-{unique}"
    kwok_node(cluster, node, gpus=8)
    cluster.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}},
                ctype="application/json")  # fmt: skip
    labels = {"app": "slow"}
    cluster.raw("POST", f"/apis/apps/v1/namespaces/{ns}/replicasets", ctype="application/json",
                body={"metadata": {"name": "slow"}, "spec": {
                    "replicas": 1, "selector": {"matchLabels": labels}, "template": {
                        "metadata": {"labels": labels},
                        "spec": {"nodeSelector": {"kubernetes.io/hostname": node},
                                 "containers": [{"name": "c", "image": "slow:1",
                                                 "resources": {"limits": {GPU: "1"}}}]}}}})  # fmt: skip
    pod = wait_until(lambda: next(iter(running_pods(cluster, ns)), None), what="the pod Running")
    name = pod["metadata"]["name"]
    held = {"metadata": {"finalizers": ["gpustack.io/test-hold"]}}
    cluster.raw("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}", body=held,
                ctype="application/merge-patch+json")  # fmt: skip
    backend = KubernetesBackend(cluster, {node: node})
    opts = StepOptions(pod_deletion_timeout=20, poll=0.1)
    backend.cordon(node, RealClock(), opts)  # the ReplicaSet's replacement stays Pending
    mark = kube.audit_mark()
    done = []
    evicting = threading.Thread(target=lambda: done.append(
        backend.evict_gpu_pods(node, RealClock(), opts)))  # fmt: skip
    evicting.start()
    try:
        wait_until(lambda: cluster.raw("GET", f"/api/v1/namespaces/{ns}/pods/{name}")["metadata"]
                   .get("deletionTimestamp"), what="the pod terminating", interval=0.05)  # fmt: skip
        time.sleep(1)  # ten of gpustack's polls with the pod still there
    finally:
        cluster.raw("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}",
                    body={"metadata": {"finalizers": None}}, ctype="application/merge-patch+json")  # fmt: skip
        evicting.join(30)

    assert done == ["evicted 1 GPU pod(s)"]
    evictions = [e for e in kube.audit_events(mark)
                 if (e.get("objectRef") or {}).get("subresource") == "eviction"]  # fmt: skip
    assert [e["objectRef"]["name"] for e in evictions] == [name], evictions
    cluster.raw("DELETE", f"/api/v1/namespaces/{ns}")
    cluster.raw("DELETE", f"/api/v1/nodes/{node}")


# -- which pods leave, as kubectl drain decides (k8s.io/kubectl@v0.36.3/pkg/drain/filters.go) --


def _namespace_and_node(cluster, unique: str, prefix: str) -> tuple[str, str]:
    node, ns = f"{prefix}-{unique}", f"{prefix}-{unique}"
    kwok_node(cluster, node, gpus=8)
    cluster.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}},
                ctype="application/json")  # fmt: skip
    return node, ns


def _replicaset(cluster, ns: str, node: str, name: str, volumes=None) -> str:
    """A one-replica GPU ReplicaSet on `node`; returns its Running pod's name."""
    labels = {"app": name}
    spec = {"nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [{"name": "c", "image": f"{name}:1",
                            "resources": {"limits": {GPU: "1"}}}]}  # fmt: skip
    if volumes:
        spec["volumes"] = volumes
        spec["containers"][0]["volumeMounts"] = [
            {"name": v["name"], "mountPath": f"/{v['name']}"} for v in volumes
        ]
    cluster.raw("POST", f"/apis/apps/v1/namespaces/{ns}/replicasets", ctype="application/json",
                body={"metadata": {"name": name}, "spec": {
                    "replicas": 1, "selector": {"matchLabels": labels},
                    "template": {"metadata": {"labels": labels}, "spec": spec}}})  # fmt: skip
    pod = wait_until(
        lambda: next((p for p in running_pods(cluster, ns)
                      if p["metadata"]["labels"].get("app") == name), None),
        what=f"the {name} pod Running",
    )  # fmt: skip
    return pod["metadata"]["name"]


def _uids(cluster, ns: str) -> set[str]:
    return {p["metadata"]["uid"] for p in cluster.raw("GET", f"/api/v1/namespaces/{ns}/pods")["items"]}  # fmt: skip


def test_an_emptydir_pod_is_refused_without_delete_emptydir_data(kubeconfig, unique):
    cluster = connect(str(kubeconfig))
    node, ns = _namespace_and_node(cluster, unique, "scratch")
    name = _replicaset(cluster, ns, node, "scratch", volumes=[{"name": "cache", "emptyDir": {}}])
    backend = KubernetesBackend(cluster, {node: node})
    opts = StepOptions(pod_deletion_timeout=30, poll=0.2)
    backend.cordon(node, RealClock(), opts)
    before = _uids(cluster, ns)
    for step in (backend.evict_gpu_pods, backend.drain):
        with pytest.raises(StepFailed) as refused:
            step(node, RealClock(), opts)
        assert f"with local storage (emptyDir) would lose its data: {ns}/{name}" in str(
            refused.value
        )
        assert "pass --delete-emptydir-data" in str(refused.value)
    assert _uids(cluster, ns) == before, "nothing evicted"

    opts.delete_emptydir_data = True
    assert backend.evict_gpu_pods(node, RealClock(), opts) == "evicted 1 GPU pod(s)"
    assert name not in {p["metadata"]["name"] for p in backend.pods_on(node)}
    cluster.raw("DELETE", f"/api/v1/namespaces/{ns}")


def test_a_mirror_pod_is_skipped_and_not_waited_for(kube, kubeconfig, unique):
    """A static pod's mirror, as a kubelet writes it: the mirror annotation and its Node as
    controlling owner. The admin may create it (NodeRestriction restricts node identities)."""
    cluster = connect(str(kubeconfig))
    node, ns = _namespace_and_node(cluster, unique, "static")
    web = _replicaset(cluster, ns, node, "web")
    node_uid = cluster.raw("GET", f"/api/v1/nodes/{node}")["metadata"]["uid"]
    mirror = f"static-{node}"
    cluster.raw("POST", f"/api/v1/namespaces/{ns}/pods", ctype="application/json", body={
        "metadata": {"name": mirror, "annotations": {MIRROR_ANNOTATION: "0123abcd"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node,
                                          "uid": node_uid, "controller": True}]},
        "spec": {"nodeName": node, "containers": [
            {"name": "c", "image": "static:1", "resources": {"limits": {GPU: "1"}}}]}})  # fmt: skip
    backend = KubernetesBackend(cluster, {node: node})
    opts = StepOptions(pod_deletion_timeout=30, poll=0.2)
    backend.cordon(node, RealClock(), opts)
    mark = kube.audit_mark()

    assert backend.evict_gpu_pods(node, RealClock(), opts) == "evicted 1 GPU pod(s)"
    left = {p["metadata"]["name"] for p in backend.pods_on(node)}
    assert mirror in left and web not in left
    evictions = [e for e in kube.audit_events(mark)
                 if (e.get("objectRef") or {}).get("subresource") == "eviction"]  # fmt: skip
    assert [e["objectRef"]["name"] for e in evictions] == [web], evictions
    cluster.raw("DELETE", f"/api/v1/namespaces/{ns}/pods/{mirror}")
    cluster.raw("DELETE", f"/api/v1/namespaces/{ns}")


def test_a_pod_whose_replicaset_was_deleted_with_orphan_needs_force(kubeconfig, unique):
    """Deleting the ReplicaSet with propagationPolicy=Orphan: the garbage collector takes the
    owner reference off its pod before the ReplicaSet goes, so the pod declares no controller
    (kubectl's unreplicatedFilter) and leaves only with --force."""
    cluster = connect(str(kubeconfig))
    node, ns = _namespace_and_node(cluster, unique, "orphan")
    name = _replicaset(cluster, ns, node, "orphan")
    cluster.raw("DELETE", f"/apis/apps/v1/namespaces/{ns}/replicasets/orphan",
                body={"propagationPolicy": "Orphan"}, ctype="application/json")  # fmt: skip

    def gone() -> bool:
        try:
            cluster.raw("GET", f"/apis/apps/v1/namespaces/{ns}/replicasets/orphan")
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_until(gone, what="the ReplicaSet gone, its pod orphaned")
    backend = KubernetesBackend(cluster, {node: node})
    opts = StepOptions(pod_deletion_timeout=30, poll=0.2)
    backend.cordon(node, RealClock(), opts)
    with pytest.raises(StepFailed) as refused:
        backend.evict_gpu_pods(node, RealClock(), opts)
    assert f"not managed by a controller would be lost: {ns}/{name}" in str(refused.value)
    assert name in {p["metadata"]["name"] for p in backend.pods_on(node)}

    opts.force = True
    assert backend.evict_gpu_pods(node, RealClock(), opts) == "evicted 1 GPU pod(s)"
    cluster.raw("DELETE", f"/api/v1/namespaces/{ns}")


class HoldingWebhook:
    """STAND-IN for a slow admission webhook (served by the test, TLS from the control plane's
    CA): it holds every request it is sent until `release` is set. A ConfigMap created in the
    block holds the API server's only seat of a priority level for as long."""

    def __init__(self, kube, unique: str):
        crt, key = kube.cp.pki.issue(f"webhook-{unique}", "webhook", server=True, client=False,
                                     ips=("127.0.0.1",))  # fmt: skip
        self.ca = base64.b64encode(Path(kube.cp.pki.ca_cert).read_bytes()).decode()
        self.entered, self.release = threading.Event(), threading.Event()
        holder = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                holder.entered.set()
                holder.release.wait(30)
                body = json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                   "response": {"uid": review["request"]["uid"], "allowed": True}})  # fmt: skip
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(crt, key)
        self.server.socket = context.wrap_socket(self.server.socket, server_side=True)
        self.url = f"https://127.0.0.1:{self.server.server_address[1]}/"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.server.shutdown()


def test_evictions_throttled_by_priority_and_fairness_wait_the_servers_retry_after(
    kube, kubeconfig, unique
):
    """The API server's own priority and fairness throttles gpustack's evictions: a FlowSchema
    sends its user's `create` of ConfigMaps and `pods/eviction` to a priority level with no
    nominal seat, no borrowing and limit response Reject. While one of its ConfigMap creates
    waits in an admission webhook (holding the one request the server lets through), the real
    server answers each eviction 429 with Retry-After and no DisruptionBudget cause. gpustack
    says "throttled", not "blocked by a PodDisruptionBudget", asks again only after the
    server's Retry-After, and the eviction goes through once the seat is free. (gpustack runs
    as a user of its own, impersonated by the admin: system:masters is always exempt.)"""
    admin = connect(str(kubeconfig))
    node, ns = _namespace_and_node(admin, unique, "throttled")
    name = _replicaset(admin, ns, node, "train")
    user = f"gpustack-{unique}"
    rbac, apf = "/apis/rbac.authorization.k8s.io/v1", "/apis/flowcontrol.apiserver.k8s.io/v1"
    hooks = "/apis/admissionregistration.k8s.io/v1/validatingwebhookconfigurations"
    webhook = HoldingWebhook(kube, unique)
    admin.raw("POST", f"{rbac}/clusterrolebindings", ctype=JSON, body={
        "metadata": {"name": user},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                    "name": "cluster-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]})  # fmt: skip
    admin.raw("POST", f"{apf}/prioritylevelconfigurations", ctype=JSON, body={
        "metadata": {"name": user},
        "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": 0, "lendablePercent": 0, "borrowingLimitPercent": 0,
            "limitResponse": {"type": "Reject"}}}})  # fmt: skip
    admin.raw("POST", f"{apf}/flowschemas", ctype=JSON, body={
        "metadata": {"name": user},
        "spec": {"priorityLevelConfiguration": {"name": user}, "matchingPrecedence": 2,
                 "distinguisherMethod": {"type": "ByUser"},
                 "rules": [{"subjects": [{"kind": "User", "user": {"name": user}}],
                            "resourceRules": [{"verbs": ["create"], "apiGroups": [""],
                                               "resources": ["configmaps", "pods/eviction"],
                                               "namespaces": ["*"]}]}]}})  # fmt: skip
    admin.raw("POST", hooks, ctype=JSON, body={
        "metadata": {"name": user},
        "webhooks": [{"name": "hold.gpustack.test", "admissionReviewVersions": ["v1"],
                      "sideEffects": "None", "timeoutSeconds": 30, "failurePolicy": "Ignore",
                      "clientConfig": {"url": webhook.url, "caBundle": webhook.ca},
                      "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                      "rules": [{"operations": ["CREATE"], "apiGroups": [""],
                                 "apiVersions": ["v1"], "resources": ["configmaps"]}]}]})  # fmt: skip
    cluster = connect(str(kubeconfig))
    cluster.api.set_default_header("Impersonate-User", user)
    backend = KubernetesBackend(cluster, {node: node})
    holder = connect(str(kubeconfig))
    holder.api.set_default_header("Impersonate-User", user)

    def hold_the_seat():
        with contextlib.suppress(ApiException):
            holder.raw("POST", f"/api/v1/namespaces/{ns}/configmaps", ctype=JSON, retries=0,
                       body={"metadata": {"generateName": "hold-"}})  # fmt: skip

    try:
        # the webhook and APF objects take effect moments after their creation: until a held
        # create is in the webhook and an eviction of a pod that does not exist is refused
        # (classified before it is looked up) rather than answered 404
        def throttled() -> bool:
            if not webhook.entered.is_set():
                threading.Thread(target=hold_the_seat, daemon=True).start()
                webhook.entered.wait(1)
            return bool(backend._evict_one(ns, "no-such-pod")[0])

        wait_until(throttled, what="evictions throttled", timeout=30, interval=0.2)
        message, wait = backend._evict_one(ns, name)
        assert message.startswith(
            "throttled by the API server (429 Too Many Requests; asked to retry after"
        ), message
        assert wait >= 1 and "PodDisruptionBudget" not in message
        asked = []
        original = backend._evict_one
        backend._evict_one = lambda n, p: asked.append(time.monotonic()) or original(n, p)
        opts = StepOptions(pod_deletion_timeout=2.5, poll=0.05)
        with pytest.raises(StepFailed) as failed:
            backend.evict_gpu_pods(node, RealClock(), opts)
        assert f"{ns}/{name}: throttled by the API server (429" in str(failed.value)
        # asked again only after the server's Retry-After, not at every 0.05 s poll
        assert 2 <= len(asked) <= 4, asked
        assert all(b - a >= wait * 0.9 for a, b in itertools.pairwise(asked)), asked
        # any other request gpustack makes waits the server's Retry-After and asks again (up
        # to client-go's 10 times), rather than failing the run at the first 429
        created: dict = {}

        def create_with_retries():
            started = time.monotonic()
            created["object"] = cluster.raw("POST", f"/api/v1/namespaces/{ns}/configmaps",
                                            ctype=JSON, body={"metadata": {"generateName": "retried-"}})  # fmt: skip
            created["seconds"] = time.monotonic() - started

        retried = threading.Thread(target=create_with_retries)
        retried.start()
        threading.Timer(0.5, webhook.release.set).start()
        opts.pod_deletion_timeout = 60
        assert backend.evict_gpu_pods(node, RealClock(), opts) == "evicted 1 GPU pod(s)"
        retried.join(30)
        assert created["object"]["metadata"]["name"].startswith("retried-")
        assert created["seconds"] >= wait * 0.9, created
    finally:
        webhook.close()
        for client in (cluster, holder):
            client.close()
        for path in (f"{hooks}/{user}", f"{apf}/flowschemas/{user}",
                     f"{apf}/prioritylevelconfigurations/{user}",
                     f"{rbac}/clusterrolebindings/{user}", f"/api/v1/namespaces/{ns}"):  # fmt: skip
            with contextlib.suppress(ApiException):
                admin.raw("DELETE", path)
        admin.close()


def test_drain_takes_only_the_pods_its_selector_matches_and_a_bad_selector_is_refused_first(
    kubeconfig, unique
):
    """kubectl drain --pod-selector: the drain step evicts only the other pods that match;
    GPU pods leave whatever it says. A selector the API server cannot parse is bad input before
    any node is touched."""
    cluster = connect(str(kubeconfig))
    node, ns = _namespace_and_node(cluster, unique, "selected")
    for app in ("web", "cache"):
        cluster.raw("POST", f"/apis/apps/v1/namespaces/{ns}/replicasets", ctype=JSON, body={
            "metadata": {"name": app}, "spec": {"replicas": 1, "selector": {"matchLabels": {"app": app}},
            "template": {"metadata": {"labels": {"app": app}}, "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [{"name": "c", "image": f"{app}:1"}]}}}})  # fmt: skip
    wait_until(lambda: len(running_pods(cluster, ns)) == 2, what="web and cache Running")
    backend = KubernetesBackend(cluster, {node: node})
    with pytest.raises(BadInput) as bad:
        backend.check_selectors({"--pod-selector": "app in (web"})
    assert bad.value.message.startswith("--pod-selector 'app in (web': 400 ")
    opts = StepOptions(drain=True, drain_pod_selector="app=web", poll=0.2, drain_timeout=30)
    backend.cordon(node, RealClock(), opts)

    assert backend.drain(node, RealClock(), opts) == "evicted 1 pod(s)"
    left = {p["metadata"]["labels"]["app"] for p in backend.pods_on(node)}
    assert left == {"cache"}, left
    cluster.raw("DELETE", f"/api/v1/namespaces/{ns}")
    cluster.close()
