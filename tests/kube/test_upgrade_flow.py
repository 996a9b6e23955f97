"""Rolling driver upgrades, the Kubernetes side (cordon, wait for jobs, GPU pod eviction, drain,
validation, uncordon, the state labels) against a real control plane: kube-apiserver (merge
patches of nodes, the Eviction API, PodDisruptionBudgets, admission of the verification pods),
kube-controller-manager (ReplicaSet, DaemonSet, disruption and garbage collection controllers:
workloads have real owners, and evicted pods are replaced) and kube-scheduler.

STAND-INS, each named where it is used:
- the hosts: FakeHostUpgrader (tests/upgrade_doubles.py) answers instead of Ansible;
- the nodes: kwok nodes with 8 "GPUs" as allocatable numbers the test writes; while a host
  "upgrades", the test sets its allocatable to 0 and back (`set_gpu_allocatable`), as the
  kubelet does when the device plugin restarts. No GPU, driver or device plugin is involved;
- the verification pod's container (`nvidia-smi -L`): kwok runs nothing, so `VerificationPods`
  serves, as the pod's log, the line nvidia-smi -L prints for one GPU (by default one of the
  node's, `uuids_for`) and ends the pod as a kubelet reports a container that exited 0. The
  upgrade's validation reads that log with verify's own parser, as it would a real one; whether
  nvidia-smi would succeed on the node is not tested here;
- a batch pod's process finishing (`finish_pod`), for the wait for jobs.

Each test has its own nodes (`gpuNNN-<unique>`, labelled with the test's fleet label), its own
namespaces and its own RuntimeClass: the control plane is shared by the tests of a worker.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from gpustack.k8s.cluster import apply
from gpustack.k8s.cluster import pods as cluster_pods
from gpustack.k8s.cluster.connect import Cluster, connect
from gpustack.k8s.cluster.upgrade import ADMIN_ANNOTATION, REASON_ANNOTATION, KubernetesBackend
from gpustack.k8s.manifests import ClusterConfig, node_labels, render
from gpustack.upgrade.backend import StepOptions
from gpustack.upgrade.command import UpgradeOptions, run_upgrade
from gpustack.upgrade.executors import ThreadExecutor
from gpustack.upgrade.orchestrator import Orchestrator, RolloutPolicy
from gpustack.upgrade.planner import Limits, resolve_max_unavailable
from gpustack.upgrade.session import open_run
from gpustack.upgrade.state import SKIP_LABEL, STATE_LABEL, MemoryStateStore, Target
from tests.builders import gpu_facts, inventory, smi_output, uuids_for
from tests.conftest import wait_until
from tests.kube.stand_ins import (
    VERIFY_SELECTOR,
    Outcome,
    VerificationPods,
    finish_pod,
    kwok_node,
    node_ready,
    set_gpu_allocatable,
)
from tests.upgrade_doubles import NEW, FakeHostUpgrader, in_progress_intervals

pytestmark = pytest.mark.kube

GPU = "nvidia.com/gpu"
JSON = "application/json"
MERGE = "application/merge-patch+json"
FLEET_LABEL = "gpustack.test/fleet"


@pytest.fixture(autouse=True)
def fast_verification_poll(monkeypatch):
    """gpustack polls its verification pods every second; kwok and the stand-in answer within
    milliseconds, so a second per node would only make 50-node rollouts slow."""
    monkeypatch.setattr(cluster_pods, "POLL_SECONDS", 0.05)


@dataclass
class Fleet:
    cluster: Cluster
    kubeconfig: Path
    unique: str
    hosts: list[str] = field(default_factory=list)
    verified: list[str] = field(default_factory=list)  # verification pods the stand-in ended
    listings: dict[str, Outcome] = field(default_factory=dict)  # node -> other than its GPU

    @property
    def ns(self) -> str:  # the workloads'
        return f"work-{self.unique}"

    @property
    def gpustack_ns(self) -> str:  # gpustack's namespace: the verification pods run there
        return f"gs-{self.unique}"

    @property
    def group_vars(self) -> dict[str, str]:
        runtime = f"nvidia-{self.unique}"
        return {"gpustack_k8s_namespace": self.gpustack_ns,
                "gpustack_k8s_runtime_class": runtime, "container_runtime_nvidia_name": runtime}  # fmt: skip

    def name(self, i: int) -> str:
        return f"gpu{i:03d}-{self.unique}"

    def node(self, name: str) -> dict:
        return self.cluster.raw("GET", f"/api/v1/nodes/{name}")

    def labels(self, name: str) -> dict:
        return self.node(name)["metadata"].get("labels") or {}

    def cordoned(self, name: str) -> bool:
        return bool(self.node(name).get("spec", {}).get("unschedulable"))

    def pods(self, namespace: str | None = None) -> list[dict]:
        return self.cluster.raw("GET", f"/api/v1/namespaces/{namespace or self.ns}/pods")["items"]

    def uids(self) -> set[str]:
        return {p["metadata"]["uid"] for p in self.pods()}


def admin_patch(fleet: Fleet, name: str, patch: dict) -> None:
    """What an admin does with kubectl (cordon, label), through the real client."""
    fleet.cluster.raw("PATCH", f"/api/v1/nodes/{name}", body=patch, ctype=MERGE)


class OneOfItsGpus:
    """The stand-in's outputs for the fleet's nodes (VerificationPods' `outcomes`): what
    `nvidia-smi -L` prints in a pod given the last of the node's 8 GPUs, unless the test set
    another listing for the node in `fleet.listings`."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet

    def __contains__(self, node: object) -> bool:
        return isinstance(node, str) and node.endswith(f"-{self.fleet.unique}")

    def __getitem__(self, node: str) -> Outcome:
        if node not in self:
            raise KeyError(node)
        return self.fleet.listings.get(node) or Outcome(smi_output(uuids_for(node, 8)[-1:]))


@pytest.fixture
def fleet(kubeconfig, unique, tmp_path):
    """gpustack's k8s side as the upgrade needs it (its namespace, where the verification pods
    run with its RuntimeClass), a namespace for workloads; nodes come from `gpu_fleet`. The
    verification pods' containers list one of the node's GPUs and exit 0 (the stand-in)
    while the test runs."""
    cluster = connect(str(kubeconfig))
    fleet = Fleet(cluster, kubeconfig, unique)
    for ns in (fleet.ns, fleet.gpustack_ns):
        cluster.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}}, ctype=JSON)
    runtime = fleet.group_vars["gpustack_k8s_runtime_class"]
    cluster.raw("POST", "/apis/node.k8s.io/v1/runtimeclasses", ctype=JSON,
                body={"metadata": {"name": runtime}, "handler": runtime})  # fmt: skip
    for ns in (fleet.ns, fleet.gpustack_ns):  # the ServiceAccount admission needs it
        wait_until(lambda ns=ns: cluster.raw("GET", f"/api/v1/namespaces/{ns}/serviceaccounts")["items"],
                   what=f"ServiceAccount default in {ns}", timeout=30, interval=0.1)  # fmt: skip
    with VerificationPods(cluster, tmp_path, OneOfItsGpus(fleet)) as pods:
        fleet.verified = pods.handled
        yield fleet
    for name in fleet.hosts:
        cluster.raw("DELETE", f"/api/v1/nodes/{name}")
    for ns in (fleet.ns, fleet.gpustack_ns):
        cluster.raw("DELETE", f"/api/v1/namespaces/{ns}")
    cluster.raw("DELETE", f"/apis/node.k8s.io/v1/runtimeclasses/{runtime}")
    cluster.close()


def gpu_fleet(fleet: Fleet, count: int, skip=()) -> list[str]:
    """`count` kwok nodes with 8 "GPUs" each (a stand-in: see the module doc), all Ready."""
    fleet.hosts = [fleet.name(i) for i in range(count)]
    for name in fleet.hosts:
        labels = {FLEET_LABEL: fleet.unique}
        if name in skip:
            labels[SKIP_LABEL] = "true"
        kwok_node(fleet.cluster, name, gpus=8, labels=labels)
    wait_until(lambda: sum(node_ready(n) for n in fleet_nodes(fleet)) == count,
               what=f"{count} kwok nodes Ready", timeout=30, interval=0.1)  # fmt: skip
    return fleet.hosts


def fleet_nodes(fleet: Fleet) -> list[dict]:
    return fleet.cluster.raw("GET", "/api/v1/nodes",
                             [("labelSelector", f"{FLEET_LABEL}={fleet.unique}")])["items"]  # fmt: skip


def workload(fleet: Fleet, node: str, name: str, gpus: int = 1, owner: str | None = "ReplicaSet",
             labels: dict | None = None, restart: str = "Always") -> dict:  # fmt: skip
    """A pod on `node` owned by a real ReplicaSet or DaemonSet pinned to the node (nodeSelector),
    or a bare pod bound to it (`owner=None`); returns the pod once kwok has it Running. An
    evicted ReplicaSet pod is replaced, as on a real cluster: by a pod with another name."""
    labels = labels or {"app": name}
    resources = {"limits": {GPU: str(gpus)}} if gpus else {}
    spec = {"containers": [{"name": "c", "image": "busybox", "resources": resources}],
            "automountServiceAccountToken": False}  # fmt: skip
    ns = fleet.ns
    if owner is None:
        body = {"metadata": {"name": name, "labels": labels},
                "spec": {**spec, "nodeName": node, "restartPolicy": restart}}  # fmt: skip
        fleet.cluster.raw("POST", f"/api/v1/namespaces/{ns}/pods", body=body, ctype=JSON)
    else:
        template = {"metadata": {"labels": labels},
                    "spec": {**spec, "nodeSelector": {"kubernetes.io/hostname": node}}}  # fmt: skip
        body = {"metadata": {"name": name},
                "spec": {"selector": {"matchLabels": labels}, "template": template}}  # fmt: skip
        if owner == "ReplicaSet":
            body["spec"]["replicas"] = 1
        path = f"/apis/apps/v1/namespaces/{ns}/{owner.lower()}s"
        fleet.cluster.raw("POST", path, body=body, ctype=JSON)
    selector = ",".join(f"{k}={v}" for k, v in labels.items())

    def running():
        found = fleet.cluster.raw("GET", f"/api/v1/namespaces/{ns}/pods",
                                  [("labelSelector", selector)])["items"]  # fmt: skip
        return next((p for p in found if p["status"].get("phase") == "Running"
                     and p["spec"].get("nodeName") == node), None)  # fmt: skip

    return wait_until(running, what=f"{name}'s pod Running on {node}", timeout=30, interval=0.05)


class WatchedBackend(KubernetesBackend):
    """The real backend; after each cordon it counts the fleet's unschedulable or not Ready
    nodes, as the API server lists them; `on_cordon(name)` runs after a cordon."""

    def __init__(self, *args, fleet: Fleet, on_cordon=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.fleet = fleet
        self.on_cordon = on_cordon
        self.peak_unschedulable = 0
        self._lock = threading.Lock()

    def cordon(self, name, clock, opts):
        note = super().cordon(name, clock, opts)
        nodes = fleet_nodes(self.fleet)
        down = sum(1 for n in nodes if n.get("spec", {}).get("unschedulable") or not node_ready(n))
        with self._lock:
            self.peak_unschedulable = max(self.peak_unschedulable, down)
        if self.on_cordon:
            self.on_cordon(name)
        return note


class DevicePluginRestart:
    """STAND-IN for the device plugin restarting with the driver: the node's GPUs go (allocatable
    0) when the host upgrade starts and come back 50 ms later, written by the test."""

    def __init__(self, fleet: Fleet):
        self.fleet = fleet
        self.timers: list[threading.Timer] = []

    def __call__(self, host: str) -> None:
        set_gpu_allocatable(self.fleet.cluster, host, 0)
        timer = threading.Timer(0.05, set_gpu_allocatable, (self.fleet.cluster, host, 8))
        self.timers.append(timer)
        timer.start()

    def join(self) -> None:
        for timer in self.timers:
            timer.join(10)


def rollout(fleet: Fleet, hosts, upgrader, *, max_unavailable="10%", max_parallel=4,
            max_failures=0, steps=None, run=None, retry_failed=False, on_cordon=None):  # fmt: skip
    inv = inventory(fleet.kubeconfig.parent, hosts, **fleet.group_vars)
    base = KubernetesBackend.from_kubeconfig(str(fleet.kubeconfig), inv, {})
    assert base.config is not None and base.config.namespace == fleet.gpustack_ns
    backend = WatchedBackend(base.cluster, base.node_names, base.config, fleet=fleet,
                             on_cordon=on_cordon)  # fmt: skip
    fresh = run is None
    run = open_run(run, inventory=inv.path, target=Target(version=NEW), hosts=hosts,
                   mode="kubernetes", resume=not fresh, state_file=None)  # fmt: skip
    conditions = backend.conditions(hosts)
    for host in hosts:
        if not conditions[host].skip and not conditions[host].state:
            backend.record_state(host, "upgrade-required")
    limits = Limits(resolve_max_unavailable(max_unavailable, len(hosts)), max_parallel)
    policy = RolloutPolicy(limits=limits, max_failures=max_failures, retry_failed=retry_failed,
                           steps=steps or StepOptions(poll=0.02))  # fmt: skip
    orch = Orchestrator(run, hosts, MemoryStateStore(run), backend, upgrader, policy,
                        ThreadExecutor(max_parallel, poll=0.01))  # fmt: skip
    try:
        return orch.execute(), run, backend
    finally:
        backend.cluster.close()


def test_rolling_upgrade_of_50_nodes_within_limits(fleet):
    hosts = gpu_fleet(fleet, 50, skip=(fleet.name(20),))
    trains = [workload(fleet, fleet.name(i), f"train-{i}") for i in range(12)]
    web = workload(fleet, fleet.name(0), "web", gpus=0)  # not a GPU pod: stays without --drain
    ds_pod = workload(fleet, fleet.name(1), "gpu-ds", owner="DaemonSet")  # left alone
    for name in (fleet.name(10), fleet.name(11)):  # an admin cordoned them, with pods on them
        admin_patch(fleet, name, {"spec": {"unschedulable": True}})
    plugin = DevicePluginRestart(fleet)
    upgrader = FakeHostUpgrader(before=plugin, gpus={h: uuids_for(h, 8) for h in hosts})
    result, run, backend = rollout(fleet, hosts, upgrader)
    plugin.join()
    assert result.status == "done", result
    # 10% of 50 = 5 unavailable at most, counting the two admin-cordoned nodes.
    assert backend.peak_unschedulable <= 5
    assert upgrader.max_active <= 4
    skipped = fleet.name(20)
    assert len(upgrader.calls) == 49 and skipped not in upgrader.calls
    admin_cordoned = {fleet.name(10), fleet.name(11)}
    for node in fleet_nodes(fleet):
        meta, host = node["metadata"], node["metadata"]["name"]
        if host == skipped:
            assert STATE_LABEL not in meta["labels"], "skip label honoured: untouched"
            assert not node["spec"].get("unschedulable")
            continue
        assert meta["labels"][STATE_LABEL] == "upgrade-done"
        assert ADMIN_ANNOTATION not in (meta.get("annotations") or {})
        assert bool(node["spec"].get("unschedulable")) == (host in admin_cordoned), host
        assert node["status"]["allocatable"][GPU] == "8", host
    assert run.nodes[fleet.name(10)].admin_cordoned and not run.nodes[fleet.name(0)].admin_cordoned
    left = fleet.uids()
    assert not {p["metadata"]["uid"] for p in trains} & left, "every GPU pod was evicted"
    assert {web["metadata"]["uid"], ds_pod["metadata"]["uid"]} <= left, "the others stay"
    assert fleet.pods(fleet.gpustack_ns) == [], "verification pods deleted"
    verified = [t.note for t in run.history if t.to_state == "uncordon-required"]
    assert len(verified) == 49
    assert all("8 GPU(s) allocatable; verification pod succeeded: GPU GPU-" in n
               and n.endswith("UUID matches one of the host's 8") for n in verified), verified  # fmt: skip
    assert len(fleet.verified) == 49  # one verification pod per upgraded node
    # Upgrade intervals never overlap by more than max-parallel.
    spans = in_progress_intervals(run.history)
    points = sorted([(s, 1) for v in spans.values() for s, _ in v] + [(e, -1) for v in spans.values() for _, e in v])  # fmt: skip
    level = peak = 0
    for _, delta in points:
        level += delta
        peak = max(peak, level)
    assert peak <= 4

    # The ReplicaSets replaced their evicted pods: on the uncordoned nodes the replacements
    # run; on the nodes the admin keeps cordoned they wait for the scheduler.
    def replacements():
        pods = {p["metadata"]["labels"]["app"]: p for p in fleet.pods()
                if p["metadata"]["labels"].get("app", "").startswith("train-")}  # fmt: skip
        return len(pods) == 12 and pods

    def placed():
        pods = replacements()
        if not pods:
            return False
        for i in range(12):
            status = pods[f"train-{i}"]["status"]
            if fleet.name(i) in admin_cordoned:
                why = {c["type"]: c for c in status.get("conditions") or []}.get("PodScheduled")
                if not why or why.get("reason") != "Unschedulable":
                    return False
                assert "node(s) were unschedulable" in why["message"], why
            elif status.get("phase") != "Running":
                return False
        return pods

    pods = wait_until(placed, what="the train replacements placed", timeout=30, interval=0.1)
    for i in range(12):
        assert pods[f"train-{i}"]["spec"].get("nodeName") == (
            None if fleet.name(i) in admin_cordoned else fleet.name(i)
        )


def test_pdb_blocked_eviction_times_out_fails_the_node_and_halts(fleet):
    """Ten nodes, one at a time: the fourth one's eviction is blocked and the rollout halts
    (the six after the fourth show the halt)."""
    hosts = gpu_fleet(fleet, 10)
    db = workload(fleet, fleet.name(3), "db", labels={"app": "db"})
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget", "metadata": {"name": "db"},
           "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}}  # fmt: skip
    path = f"/apis/policy/v1/namespaces/{fleet.ns}/poddisruptionbudgets"
    fleet.cluster.raw("POST", path, body=pdb, ctype=JSON)
    wait_until(lambda: fleet.cluster.raw("GET", f"{path}/db").get("status", {}).get("currentHealthy") == 1,
               what="the disruption controller to observe the budget", timeout=30, interval=0.1)  # fmt: skip
    upgrader = FakeHostUpgrader()
    steps = StepOptions(poll=0.02, pod_deletion_timeout=0.3)
    result, run, _ = rollout(fleet, hosts, upgrader, max_unavailable="1", max_parallel=1,
                             steps=steps)  # fmt: skip
    assert result.status == "failed"
    assert upgrader.calls == hosts[:3]
    reason = run.nodes[fleet.name(3)].reason
    db_ref = f"{fleet.ns}/{db['metadata']['name']}"
    assert reason.startswith(f"GPU pod eviction timed out after 0.3 s: 1 left; {db_ref}: "
                             "blocked by a PodDisruptionBudget: The disruption budget db needs 1 healthy pods"), reason  # fmt: skip
    node = fleet.node(fleet.name(3))
    assert node["metadata"]["labels"][STATE_LABEL] == "upgrade-failed"
    assert node["metadata"]["annotations"][REASON_ANNOTATION] == reason
    assert node["spec"]["unschedulable"] is True, "a failed node stays cordoned"
    assert db["metadata"]["uid"] in fleet.uids(), "the budget kept the pod"
    assert {fleet.labels(h)[STATE_LABEL] for h in hosts[4:]} == {"upgrade-required"}


def test_unmanaged_gpu_pods_need_force_and_drain_evicts_the_rest(fleet):
    """Two nodes: the rollouts here name no other host."""
    hosts = gpu_fleet(fleet, 2)
    bare = workload(fleet, hosts[0], "bare", owner=None)
    result, run, _ = rollout(fleet, hosts[:1], FakeHostUpgrader(), max_unavailable="1")
    assert result.status == "failed"
    reason = run.nodes[hosts[0]].reason
    assert f"GPU pod(s) not managed by a controller would be lost: {fleet.ns}/bare" in reason
    assert "pass --force" in reason
    assert bare["metadata"]["uid"] in fleet.uids(), "nothing evicted without --force"
    web1 = workload(fleet, hosts[1], "web1", gpus=0)
    mon = workload(fleet, hosts[1], "mon", gpus=0, owner="DaemonSet")
    steps = StepOptions(poll=0.02, force=True, drain=True)
    result, run, _ = rollout(fleet, hosts, FakeHostUpgrader(), steps=steps, max_unavailable="2",
                             max_parallel=2, run=run, retry_failed=True)  # fmt: skip
    assert result.status == "done", run.nodes
    left = fleet.uids()
    assert {bare["metadata"]["uid"], web1["metadata"]["uid"]}.isdisjoint(left)
    assert mon["metadata"]["uid"] in left, "DaemonSet pods are not drained"
    drained = [t.note for t in run.history if t.node == hosts[1] and t.to_state == "pod-restart-required"]  # fmt: skip
    assert drained == ["evicted 1 pod(s)"]


def test_wait_for_jobs_then_validation_waits_for_gpus(fleet):
    """One node. The batch pod is a
    bare pod that the test finishes (`finish_pod`) 0.2 s after the node is cordoned: kwok would
    complete a Job's pod at once, before the upgrade could wait for it."""
    hosts = gpu_fleet(fleet, 1)
    workload(fleet, hosts[0], "job-1", gpus=0, labels={"kind": "batch"}, owner=None,
             restart="Never")  # fmt: skip
    finished_at: list[float] = []  # when the pod's status was sent: it ran until then

    def finish_job():
        finished_at.append(time.time())
        finish_pod(fleet.cluster, fleet.ns, "job-1")

    timers: list[threading.Timer] = []

    def on_cordon(name):
        timers.append(threading.Timer(0.2, finish_job))
        timers[-1].start()

    def gpus_never_return(host):  # STAND-IN: the device plugin does not come back
        set_gpu_allocatable(fleet.cluster, host, 0)

    steps = StepOptions(poll=0.02, pod_selector="kind=batch", validation_timeout=0.3)
    result, run, _ = rollout(fleet, hosts, FakeHostUpgrader(before=gpus_never_return),
                             max_unavailable="1", steps=steps, on_cordon=on_cordon)  # fmt: skip
    for timer in timers:
        timer.join(10)
    waited = next(t for t in run.history if t.to_state == "pod-deletion-required")
    assert waited.note == "no running pod matches kind=batch"
    assert finished_at and waited.at >= finished_at[0], "it waited for the running batch pod"
    assert result.status == "failed"
    assert run.nodes[hosts[0]].reason == (
        f"validation: node {hosts[0]} is Ready with 0 allocatable GPU(s) after 0.3 s "
        "(is the device plugin running there?)"
    )
    assert fleet.verified == [], "no verification pod without GPUs"


@pytest.mark.parametrize("listing", ["another-nodes-gpu", "no-gpu"])
def test_a_verification_pod_that_exits_0_without_the_nodes_gpu_fails_validation(fleet, listing):
    """After the driver role, the node's verification pod exits 0, but nvidia-smi -L in it
    listed another node's GPU (or none). Validation judges that output as `gpustack verify`
    does (against the UUIDs the driver role read on the host), so the node fails and stays
    cordoned, the reason on its annotation. STAND-INS: the pod's output (`fleet.listings`), the
    host's driver role (FakeHostUpgrader: its nvidia-smi read the node's 8 UUIDs)."""
    hosts = gpu_fleet(fleet, 1)
    host = hosts[0]
    other = uuids_for(f"elsewhere-{fleet.unique}", 1)[0]
    fleet.listings[host] = Outcome(smi_output([other]) if listing == "another-nodes-gpu" else "")
    upgrader = FakeHostUpgrader(gpus={host: uuids_for(host, 8)})
    result, run, _ = rollout(fleet, hosts, upgrader, max_unavailable="1")
    assert result.status == "failed"
    reason = (
        f"validation: verification pod on {host}: GPU UUID mismatch: not on the host {other}; "
        f"the host has {', '.join(uuids_for(host, 8))}"
        if listing == "another-nodes-gpu"
        else f"validation: verification pod on {host}: nvidia-smi in the pod listed no GPU"
    )
    assert run.nodes[host].reason == reason
    assert len(fleet.verified) == 1, "the pod ran and exited 0"
    node = fleet.node(host)
    assert node["spec"].get("unschedulable") is True, "a node that failed validation stays cordoned"
    assert node["metadata"]["labels"][STATE_LABEL] == "upgrade-failed"
    assert node["metadata"]["annotations"][REASON_ANNOTATION] == reason
    assert fleet.pods(fleet.gpustack_ns) == [], "verification pod deleted"


def test_cli_run_fails_then_resumes_from_labels_and_keeps_admin_cordon(fleet, state_dir, tmp_path, capsys):  # fmt: skip
    """`gpustack upgrade`'s command over 20 nodes (each node costs real time here; the 50-node
    rollout is the first test's)."""
    hosts = gpu_fleet(fleet, 20)
    failing, out_of_band = fleet.name(3), fleet.name(19)
    admin_patch(fleet, failing, {"spec": {"unschedulable": True}})
    inv = inventory(tmp_path, hosts, **fleet.group_vars).path
    upgrader = FakeHostUpgrader(fail={failing: "apt failed"})

    def opts(**kw):
        return UpgradeOptions(inventory=str(inv), driver_version=NEW,
                              kubeconfig=str(fleet.kubeconfig), max_unavailable="4",
                              max_parallel=2, yes=True, output="json", **kw)  # fmt: skip

    assert run_upgrade(opts(), lambda i, e: upgrader) == 1
    meta = fleet.node(failing)["metadata"]
    assert meta["labels"][STATE_LABEL] == "upgrade-failed"
    assert meta["annotations"][ADMIN_ANNOTATION] == "true"
    assert meta["annotations"][REASON_ANNOTATION] == "driver role: apt failed"
    done = {n["metadata"]["name"] for n in fleet_nodes(fleet)
            if n["metadata"]["labels"][STATE_LABEL] == "upgrade-done"}  # fmt: skip
    assert done and failing not in done
    # The cluster is the source of truth on resume: mark one pending node done out of band.
    assert out_of_band not in done
    admin_patch(fleet, out_of_band, {"metadata": {"labels": {STATE_LABEL: "upgrade-done"}}})
    upgrader.fail = {}
    upgrader.calls.clear()
    capsys.readouterr()
    assert run_upgrade(opts(resume=True, retry_failed=True), lambda i, e: upgrader) == 0
    assert set(upgrader.calls) == set(hosts) - done - {out_of_band}
    nodes = fleet_nodes(fleet)
    assert {n["metadata"]["labels"][STATE_LABEL] for n in nodes} == {"upgrade-done"}
    failed_node = fleet.node(failing)
    assert failed_node["spec"]["unschedulable"] is True, "admin cordon kept"
    assert REASON_ANNOTATION not in failed_node["metadata"].get("annotations", {})
    assert not any(
        n["spec"].get("unschedulable") for n in nodes if n["metadata"]["name"] != failing
    )
    assert fleet.cluster.raw("GET", f"/api/v1/namespaces/{fleet.gpustack_ns}/pods",
                             [("labelSelector", VERIFY_SELECTOR)])["items"] == []  # fmt: skip


def test_the_gpu_clients_are_paused_while_the_driver_reloads_and_resumed_after(fleet):
    """gpustack's own operands (rendered and applied by gpustack: device plugin, GFD,
    dcgm-exporter) run on the node with the labels install gives it. While the driver role runs,
    none of their pods may be left on the node, as NVIDIA's driver manager ensures (their
    `gpu.deploy.*` labels turn paused-for-driver-upgrade, the real DaemonSet controller deletes
    the pods, kwok removes them); afterwards the labels are as they were and the pods are back.
    STAND-IN: kwok's pods hold no GPU; what is checked is that none is left to hold one."""
    hosts = gpu_fleet(fleet, 1)
    host = hosts[0]
    config = ClusterConfig(namespace=fleet.gpustack_ns,
                           runtime_class=fleet.group_vars["gpustack_k8s_runtime_class"])  # fmt: skip
    apply.apply_objects(fleet.cluster, render(config))
    before = fleet.labels(host)
    admin_patch(fleet, host, {"metadata": {"labels": node_labels(
        gpu_facts(host, 8)["gpustack_preflight"], before, config)}})  # fmt: skip
    labelled = fleet.labels(host)
    clients = {k: v for k, v in labelled.items() if k.startswith("nvidia.com/gpu.deploy.")}
    assert set(clients) == {f"nvidia.com/gpu.deploy.{c}" for c in
                            ("device-plugin", "gpu-feature-discovery", "dcgm-exporter")}  # fmt: skip

    def client_pods() -> list[str]:
        return sorted(p["metadata"]["name"] for p in fleet.pods(fleet.gpustack_ns)
                      if p["spec"].get("nodeName") == host
                      and p["status"].get("phase") not in ("Succeeded", "Failed"))  # fmt: skip

    def running() -> list[str]:
        return [p["metadata"]["name"] for p in fleet.pods(fleet.gpustack_ns)
                if p["spec"].get("nodeName") == host and p["status"].get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")]  # fmt: skip

    wait_until(lambda: len(running()) == 3, what="the three operands Running on the node",
               timeout=30, interval=0.1)  # fmt: skip
    seen_by_driver_role: dict[str, object] = {}

    def driver_role(name):  # what the host would have had open while the module is reloaded
        seen_by_driver_role["pods"] = client_pods()
        seen_by_driver_role["labels"] = {
            k: v for k, v in fleet.labels(name).items() if k in clients
        }

    result, run, _ = rollout(fleet, hosts, FakeHostUpgrader(before=driver_role),
                             max_unavailable="1")  # fmt: skip
    assert result.status == "done", run.nodes[host].reason
    assert seen_by_driver_role == {
        "pods": [], "labels": dict.fromkeys(clients, "paused-for-driver-upgrade")}  # fmt: skip
    after = fleet.labels(host)
    assert {k: after.get(k) for k in clients} == clients
    assert "gpustack.io/driver-upgrade-paused-clients" not in fleet.node(host)["metadata"].get(
        "annotations", {})  # fmt: skip
    note = next(t.note for t in run.history if t.to_state == "validation-required")
    assert note.startswith(
        "paused GPU clients (dcgm-exporter, device-plugin, gpu-feature-discovery); driver role ran"
    ) and note.endswith("resumed GPU clients (3)"), note
    wait_until(lambda: len(running()) == 3, what="the operands back on the node",
               timeout=30, interval=0.1)  # fmt: skip
