"""Rolling driver upgrades against the Kubernetes API emulator (>= 50 simulated nodes).

The cluster is the emulator (real client, real HTTP); the host side is the FakeHostUpgrader
TEST DOUBLE (tests/upgrade_doubles.py) injected instead of Ansible. While a host "upgrades",
the double plays the device plugin: GPUs vanish from the node and come back a moment later.
"""

from __future__ import annotations

import threading

from gpustack.k8s.cluster.connect import connect
from gpustack.k8s.cluster.upgrade import ADMIN_ANNOTATION, REASON_ANNOTATION, KubernetesBackend
from gpustack.upgrade.backend import StepOptions
from gpustack.upgrade.command import UpgradeOptions, run_upgrade
from gpustack.upgrade.executors import ThreadExecutor
from gpustack.upgrade.orchestrator import Orchestrator, RolloutPolicy
from gpustack.upgrade.planner import Limits, resolve_max_unavailable
from gpustack.upgrade.session import open_run
from gpustack.upgrade.state import (
    SKIP_LABEL,
    STATE_LABEL,
    MemoryStateStore,
    Target,
)
from tests.cluster.emulator import NodeHardware, PodFate
from tests.cluster.helpers import inventory, smi_output, uuids_for
from tests.upgrade_doubles import NEW, FakeHostUpgrader, in_progress_intervals

GPU = "nvidia.com/gpu"


def admin_patch(kubeconfig, name: str, patch: dict) -> None:
    """What an admin does with kubectl (cordon, label), through the real client."""
    cluster = connect(str(kubeconfig))
    cluster.raw("PATCH", f"/api/v1/nodes/{name}", body=patch, ctype="application/merge-patch+json")
    cluster.close()


def gpu_fleet(emu, count: int, kubeconfig=None, cordoned=(), skip=()) -> list[str]:
    names = [f"gpu{i:03d}" for i in range(count)]
    for name in names:
        # SIMULATED hosts with 8 GPUs; their device plugin is the FakeHostUpgrader's concern
        # (set_allocatable), not the emulated one.
        emu.add_node(name, allocatable={GPU: "8"}, hardware=NodeHardware.gpu_node(uuids_for(name, 8)),
                     labels={SKIP_LABEL: "true"} if name in skip else None)  # fmt: skip
    for name in cordoned:
        admin_patch(kubeconfig, name, {"spec": {"unschedulable": True}})

    def fate(pod):
        if (pod["metadata"].get("labels") or {}).get("gpustack.io/verify") == "true":
            node = pod["spec"]["nodeName"]
            return PodFate.succeeded(smi_output(uuids_for(node, 8)))
        return PodFate.running()

    emu.pod_policy = fate
    # gpustack's k8s side is installed: its namespace hosts the verification pods, which run
    # with the RuntimeClass nvidia.
    emu.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpustack-system"}})
    emu.create({"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                "metadata": {"name": "nvidia"}, "handler": "nvidia"})  # fmt: skip
    return names


def workload(emu, node: str, name: str, gpus: int = 1, owner: str | None = "ReplicaSet",
             labels: dict | None = None, ns: str = "default") -> None:  # fmt: skip
    meta = {"name": name, "namespace": ns, "labels": labels or {"app": name}}
    if owner:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner, "name": f"{name}-rs",
                                    "uid": f"uid-{name}", "controller": True}]  # fmt: skip
    resources = {"limits": {GPU: str(gpus)}} if gpus else {}
    spec = {
        "nodeName": node,
        "containers": [{"name": "c", "image": "busybox", "resources": resources}],
    }
    if owner == "Job":
        spec["restartPolicy"] = "Never"  # what the Job controller requires of its pods
    emu.create({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})


def pods(emu) -> set[str]:
    return {p["metadata"]["name"] for p in emu.objects("v1", "Pod")}


def node(emu, name):
    return emu.get("v1", "Node", name)


def labels(emu, name):
    return node(emu, name)["metadata"].get("labels") or {}


class WatchedBackend(KubernetesBackend):
    """The real backend; after each cordon it counts unschedulable nodes in the emulator."""

    def __init__(self, *args, emu, **kwargs):
        super().__init__(*args, **kwargs)
        self.emu = emu
        self.peak_unschedulable = 0
        self._lock = threading.Lock()

    def cordon(self, name, clock, opts):
        note = super().cordon(name, clock, opts)
        down = sum(
            1
            for n in self.emu.objects("v1", "Node")
            if n.get("spec", {}).get("unschedulable")
            or not any(c["status"] == "True" for c in n["status"]["conditions"])
        )
        with self._lock:
            self.peak_unschedulable = max(self.peak_unschedulable, down)
        return note


def device_plugin_restart(emu):
    """Test double behaviour: GPUs disappear during the driver change and come back."""

    def before(host):
        emu.set_allocatable(host, {GPU: "0"})
        emu.later(0.05, emu.set_allocatable, host, {GPU: "8"})

    return before


def rollout(kubeconfig, emu, hosts, upgrader, *, max_unavailable="10%", max_parallel=4,
            max_failures=0, steps=None, run=None, retry_failed=False):  # fmt: skip
    inv = inventory(kubeconfig.parent, hosts)
    base = KubernetesBackend.from_kubeconfig(str(kubeconfig), inv, {})
    backend = WatchedBackend(base.cluster, base.node_names, base.config, emu=emu)
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
    return orch.execute(), run, backend


def test_rolling_upgrade_of_50_nodes_within_limits(cluster, kubeconfig):
    emu = cluster.emulator
    hosts = gpu_fleet(emu, 50, kubeconfig, cordoned=("gpu010", "gpu011"), skip=("gpu020",))
    for i in range(12):
        workload(emu, f"gpu{i:03d}", f"train-{i}")
    workload(emu, "gpu000", "web", gpus=0)  # not a GPU pod: stays without --drain
    workload(emu, "gpu001", "gpu-ds-pod", owner="DaemonSet")  # DaemonSet pods are left alone
    upgrader = FakeHostUpgrader(before=device_plugin_restart(emu))
    result, run, backend = rollout(kubeconfig, emu, hosts, upgrader)
    assert result.status == "done", result
    # 10% of 50 = 5 unavailable at most, counting the two admin-cordoned nodes.
    assert backend.peak_unschedulable <= 5
    assert upgrader.max_active <= 4
    assert len(upgrader.calls) == 49 and "gpu020" not in upgrader.calls
    for host in hosts:
        meta = node(emu, host)["metadata"]
        if host == "gpu020":
            assert STATE_LABEL not in meta["labels"], "skip label honoured: untouched"
            continue
        assert meta["labels"][STATE_LABEL] == "upgrade-done"
        assert ADMIN_ANNOTATION not in (meta.get("annotations") or {})
        cordoned = bool(node(emu, host).get("spec", {}).get("unschedulable"))
        assert cordoned == (host in ("gpu010", "gpu011")), host
    assert run.nodes["gpu010"].admin_cordoned and not run.nodes["gpu000"].admin_cordoned
    left = pods(emu)
    assert not any(p.startswith("train-") for p in left), left
    assert {"web", "gpu-ds-pod"} <= left
    assert not any(p.startswith("gpustack-verify-") for p in left), "verification pods deleted"
    verified = [t.note for t in run.history if t.to_state == "uncordon-required"]
    assert len(verified) == 49
    assert all("8 GPU(s) allocatable; verification pod succeeded" in n for n in verified)
    # Upgrade intervals never overlap by more than max-parallel.
    spans = in_progress_intervals(run.history)
    points = sorted([(s, 1) for v in spans.values() for s, _ in v] + [(e, -1) for v in spans.values() for _, e in v])  # fmt: skip
    level = peak = 0
    for _, delta in points:
        level += delta
        peak = max(peak, level)
    assert peak <= 4


def test_pdb_blocked_eviction_times_out_fails_the_node_and_halts(cluster, kubeconfig):
    emu = cluster.emulator
    hosts = gpu_fleet(emu, 50)
    workload(emu, "gpu003", "db-0", labels={"app": "db"})
    emu.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": "db", "namespace": "default"},
                "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "db"}}}})  # fmt: skip
    upgrader = FakeHostUpgrader()
    steps = StepOptions(poll=0.02, pod_deletion_timeout=0.3)
    result, run, _ = rollout(kubeconfig, emu, hosts, upgrader, max_unavailable="1",
                             max_parallel=1, steps=steps)  # fmt: skip
    assert result.status == "failed"
    assert upgrader.calls == ["gpu000", "gpu001", "gpu002"]
    reason = run.nodes["gpu003"].reason
    assert reason.startswith("GPU pod eviction timed out after 0.3 s: 1 left; default/db-0: "
                             "blocked by a PodDisruptionBudget: The disruption budget db needs 1 healthy pods")  # fmt: skip
    meta = node(emu, "gpu003")["metadata"]
    assert meta["labels"][STATE_LABEL] == "upgrade-failed"
    assert meta["annotations"][REASON_ANNOTATION] == reason
    assert node(emu, "gpu003")["spec"]["unschedulable"] is True, "a failed node stays cordoned"
    assert "db-0" in pods(emu)
    assert {labels(emu, h)[STATE_LABEL] for h in hosts[4:]} == {"upgrade-required"}


def test_unmanaged_gpu_pods_need_force_and_drain_evicts_the_rest(cluster, kubeconfig):
    emu = cluster.emulator
    hosts = gpu_fleet(emu, 50)
    workload(emu, "gpu000", "bare", owner=None)
    result, run, _ = rollout(kubeconfig, emu, hosts[:1], FakeHostUpgrader(), max_unavailable="1")
    assert result.status == "failed"
    assert "GPU pod(s) not managed by a controller would be lost: default/bare" in run.nodes["gpu000"].reason  # fmt: skip
    assert "pass --force" in run.nodes["gpu000"].reason
    workload(emu, "gpu001", "web1", gpus=0)
    workload(emu, "gpu001", "mon", gpus=0, owner="DaemonSet")
    steps = StepOptions(poll=0.02, force=True, drain=True)
    result, run, _ = rollout(kubeconfig, emu, hosts[:2], FakeHostUpgrader(), steps=steps,
                             max_unavailable="2", max_parallel=2, run=run, retry_failed=True)  # fmt: skip
    assert result.status == "done", run.nodes
    assert {"bare", "web1"}.isdisjoint(pods(emu)) and "mon" in pods(emu)
    drained = [t.note for t in run.history if t.node == "gpu001" and t.to_state == "pod-restart-required"]  # fmt: skip
    assert drained == ["evicted 1 pod(s)"]


def test_wait_for_jobs_then_validation_waits_for_gpus(cluster, kubeconfig):
    emu = cluster.emulator
    hosts = gpu_fleet(emu, 50)
    workload(emu, "gpu000", "job-1", gpus=0, labels={"kind": "batch"}, owner="Job")
    emu.later(0.2, emu.finish_workload, "default", "job-1", PodFate.succeeded())
    steps = StepOptions(poll=0.02, pod_selector="kind=batch", validation_timeout=0.3)

    def gpus_never_return(host):
        emu.set_allocatable(host, {GPU: "0"})

    result, run, _ = rollout(kubeconfig, emu, hosts[:1], FakeHostUpgrader(before=gpus_never_return),
                             max_unavailable="1", steps=steps)  # fmt: skip
    notes = {t.to_state: t.note for t in run.history}
    assert notes["pod-deletion-required"] == "no running pod matches kind=batch"
    assert result.status == "failed"
    assert run.nodes["gpu000"].reason == (
        "validation: node gpu000 is Ready with 0 allocatable GPU(s) after 0.3 s "
        "(is the device plugin running there?)"
    )


def test_cli_run_fails_then_resumes_from_labels_and_keeps_admin_cordon(cluster, kubeconfig, state_dir, tmp_path, capsys):  # fmt: skip
    emu = cluster.emulator
    hosts = gpu_fleet(emu, 50, kubeconfig, cordoned=("gpu003",))
    inv = inventory(tmp_path, hosts).path
    upgrader = FakeHostUpgrader(fail={"gpu003": "apt failed"})

    def opts(**kw):
        return UpgradeOptions(inventory=str(inv), driver_version=NEW, kubeconfig=str(kubeconfig),
                              max_unavailable="4", max_parallel=2, yes=True, output="json", **kw)  # fmt: skip

    assert run_upgrade(opts(), lambda i, e: upgrader) == 1
    meta = node(emu, "gpu003")["metadata"]
    assert meta["labels"][STATE_LABEL] == "upgrade-failed"
    assert meta["annotations"][ADMIN_ANNOTATION] == "true"
    assert meta["annotations"][REASON_ANNOTATION] == "driver role: apt failed"
    done = {h for h in hosts if labels(emu, h)[STATE_LABEL] == "upgrade-done"}
    assert done and "gpu003" not in done
    # The cluster is the source of truth on resume: mark one pending node done out of band.
    admin_patch(kubeconfig, "gpu049", {"metadata": {"labels": {STATE_LABEL: "upgrade-done"}}})
    upgrader.fail = {}
    upgrader.calls.clear()
    capsys.readouterr()
    assert run_upgrade(opts(resume=True, retry_failed=True), lambda i, e: upgrader) == 0
    assert set(upgrader.calls) == set(hosts) - done - {"gpu049"}
    assert {labels(emu, h)[STATE_LABEL] for h in hosts} == {"upgrade-done"}
    assert node(emu, "gpu003")["spec"]["unschedulable"] is True, "admin cordon kept"
    assert REASON_ANNOTATION not in node(emu, "gpu003")["metadata"].get("annotations", {})
    assert not any(
        node(emu, h).get("spec", {}).get("unschedulable") for h in hosts if h != "gpu003"
    )
