"""The label-driven MIG flow (`nvidia.com/mig.config` → gpustack's sequence) against a real control
plane: the node labels, cordon and annotations are written to a real kube-apiserver; the GPU
clients go away and come back through kube-controller-manager's DaemonSet controller acting on
those labels; GPU pods leave through the Eviction API, under a real PodDisruptionBudget where one
is set, and their ReplicaSet's replacement meets the real kube-scheduler.

What is not real here, each a STAND-IN (tests/kube/mig_stand_ins.py):
- the node is kwok's (it plays the kubelet: pods Running and Ready, deletions finished);
- the host: the nvidia_mig role's own applier over the MIG test fixture `nvidia-smi`, not a GPU;
  the "reboot" is the fixture's (the kwok node does not restart);
- the device plugin and the kubelet's device manager: the node's allocatable MIG resources are
  written by the test's `DevicePlugin` from what the fixture shows when a plugin pod starts.
Nothing here proves anything about NVIDIA's mig-manager, device plugin, drivers or GPUs.

- install's verification container: `MigVerificationPods` prints the `nvidia-smi -L` of a
  container given the one unit its pod asked for (the host's GPU and, under MIG, a MIG device of
  the profile asked for, or of the layout's only profile under the single strategy); kwok serves
  it as the pod's log through the API server, and the kubelet's resource admission is the
  stand-in's (`AdmittingVerificationPods`).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpustack.fleet.mig import CONFIG_LABEL, STATE_LABEL
from gpustack.k8s.cluster import apply, flow
from gpustack.k8s.cluster.connect import Clock, Cluster, connect
from gpustack.k8s.cluster.mig import (
    CORDON_ANNOTATION,
    PAUSED,
    PAUSED_ANNOTATION,
    REASON_ANNOTATION,
    MigKubernetesBackend,
    connect_backend,
)
from gpustack.k8s.cluster.status import DEVICE_PLUGIN_SELECTOR
from gpustack.k8s.cluster.upgrade import KubernetesBackend
from gpustack.k8s.manifests import ClusterConfig, node_labels, render
from gpustack.mig.reconfigure import reconfigure_node
from gpustack.upgrade.backend import StepOptions
from tests.builders import gpu_facts, inventory, run_result, uuids_for
from tests.conftest import wait_until
from tests.kube.mig_stand_ins import (
    DevicePlugin,
    DraKubeletPlugin,
    FixtureMigApplier,
    MigVerificationPods,
    fixture_gpus,
)
from tests.kube.stand_ins import kwok_node, node_ready
from tests.unit.mig_local import FixtureNode

pytestmark = pytest.mark.kube

JSON, MERGE = "application/json", "application/merge-patch+json"
PLUGIN = "nvidia.com/gpu.deploy.device-plugin"
DCGM = "nvidia.com/gpu.deploy.dcgm-exporter"
OPTS = StepOptions(poll=0.1, pod_deletion_timeout=20, validation_timeout=20)
H100 = "NVIDIA H100 80GB HBM3"
WAIT = 20  # seconds for what kwok and the controllers do (milliseconds to ~1 s when idle)


def ready_kwok_node(cluster: Cluster, name: str) -> None:
    """A kwok node with no GPU resource (the `DevicePlugin` stand-in writes them), once Ready."""
    kwok_node(cluster, name)
    wait_until(lambda: node_ready(cluster.get(f"/api/v1/nodes/{name}", "read node")),
               f"kwok to make {name} Ready", WAIT, 0.05)  # fmt: skip


def install_operands(cluster: Cluster, node: str, extravars: dict) -> ClusterConfig:
    """gpustack's objects applied and the node labelled as `install` does (the same functions),
    without install's verification (the label flow's tests are about what follows it); then the DaemonSets ready by gpustack's rule (`daemonset_state`), polled faster than
    install's 1 s."""
    config = ClusterConfig.from_vars(extravars)
    existing = cluster.get(f"/api/v1/nodes/{node}", "read node")["metadata"]["labels"]
    labels = node_labels(gpu_facts(node, 1)["gpustack_preflight"], existing, config)
    cluster.raw("PATCH", f"/api/v1/nodes/{node}", body={"metadata": {"labels": labels}},
                ctype=MERGE)  # fmt: skip
    objects = render(config)
    apply.apply_objects(cluster, objects)
    names = [o["metadata"]["name"] for o in objects if o["kind"] == "DaemonSet"]

    def ready():
        daemonsets = [apply.get_daemonset(cluster, config.namespace, n) for n in names]
        return all(ds and apply.daemonset_state(ds, 1)[0] for ds in daemonsets)

    wait_until(ready, f"DaemonSets {names} ready", WAIT, 0.05)
    return config


@dataclass
class MigNode:
    name: str
    namespace: str  # gpustack's (unique to the test: the control plane is shared)
    kubeconfig: Path
    cluster: Cluster
    fixture: FixtureNode
    applier: FixtureMigApplier
    backend: MigKubernetesBackend
    plugin: DevicePlugin

    def read(self) -> dict:
        return self.cluster.get(f"/api/v1/nodes/{self.name}", "read node")

    def labels(self) -> dict:
        return self.read()["metadata"].get("labels") or {}

    def annotations(self) -> dict:
        return self.read()["metadata"].get("annotations") or {}

    def unschedulable(self) -> bool:
        return bool(self.read()["spec"].get("unschedulable"))

    def label(self, labels: dict) -> None:
        """What the admin does: `kubectl label node ...`."""
        self.cluster.raw("PATCH", f"/api/v1/nodes/{self.name}",
                         body={"metadata": {"labels": labels}}, ctype=MERGE)  # fmt: skip

    def gpu_allocatable(self) -> dict:
        """Non-zero GPU resources (a resource no plugin advertises any more stays at 0)."""
        alloc = self.read()["status"].get("allocatable") or {}
        return {k: v for k, v in alloc.items()
                if k.startswith(("nvidia.com/gpu", "nvidia.com/mig-")) and v != "0"}  # fmt: skip

    def plugin_pods(self) -> list[dict]:
        """gpustack's device plugin pods on the node, not finished (terminating ones count)."""
        pods = self.cluster.list_all(
            f"/api/v1/namespaces/{self.namespace}/pods", "list pods",
            labelSelector=DEVICE_PLUGIN_SELECTOR, fieldSelector=f"spec.nodeName={self.name}",
        )  # fmt: skip
        return [p for p in pods if p["status"].get("phase") not in ("Succeeded", "Failed")]

    def reconfigure(self, **kwargs):
        return reconfigure_node(self.name, self.backend, self.applier, Clock(), OPTS, "mixed",
                                **kwargs)  # fmt: skip

    def wait_resumed(self, allocatable: dict) -> None:
        """A failed run resumed the clients and returned: the DaemonSet controller brings the
        plugin back, then the plugin registers (no wait of gpustack's covers this)."""
        wait_until(lambda: len(self.plugin_pods()) == 1 and self.gpu_allocatable() == allocatable,
                   f"the plugin back, advertising {allocatable}", WAIT, 0.1)  # fmt: skip


def create_namespace(cluster: Cluster, name: str) -> None:
    cluster.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": name}}, ctype=JSON)


@contextlib.contextmanager
def mig_node_on(kubeconfig: Path, unique: str, tmp_path: Path, **settings):
    """A kwok node with one fixture "H100 80GB" (MIG off) and gpustack's k8s side (mixed)."""
    cluster = connect(str(kubeconfig))
    name, namespace = f"gpu-{unique}", f"gs-{unique}"
    ready_kwok_node(cluster, name)
    fixture = FixtureNode(tmp_path / "host", ["H100-SXM5-80GB"])
    plugin = DevicePlugin(str(kubeconfig), name, namespace, lambda: fixture_gpus(fixture)).start()
    try:
        install_operands(cluster, name, {"gpustack_k8s_namespace": namespace,
                                         "gpustack_k8s_mig_strategy": "mixed"})  # fmt: skip
        applier = FixtureMigApplier(str(kubeconfig), {name: fixture}, **settings)
        backend = MigKubernetesBackend(KubernetesBackend(connect(str(kubeconfig)), {name: name}))
        node = MigNode(name, namespace, kubeconfig, cluster, fixture, applier, backend, plugin)
        wait_until(lambda: node.gpu_allocatable() == {"nvidia.com/gpu": "1"},
                   "the plugin to advertise the GPU", WAIT, 0.05)  # fmt: skip
        yield node
    finally:
        plugin.stop()
        for ns in (namespace, f"ml-{unique}"):
            with contextlib.suppress(Exception):
                cluster.raw("DELETE", f"/api/v1/namespaces/{ns}")
        cluster.raw("DELETE", f"/api/v1/nodes/{name}")
        cluster.close()


@pytest.fixture
def mig_node(kubeconfig, unique, tmp_path):
    with mig_node_on(kubeconfig, unique, tmp_path) as node:
        yield node


@pytest.fixture
def reboot_node(kubeconfig, unique, tmp_path):
    """A node whose GPU cannot be reset (nvidia_mig_reset=false): a mode change needs a reboot."""
    with mig_node_on(kubeconfig, unique, tmp_path, reset=False) as node:
        node.label({CONFIG_LABEL: "all-1g.10gb"})
        yield node


def trainer(node: MigNode, unique: str, budget: bool = False) -> dict:
    """A user's GPU workload on the node: a ReplicaSet of one pod asking for a whole GPU (a pod
    without a controller is refused eviction without --force), optionally under a
    PodDisruptionBudget that allows no disruption. Returns the running pod."""
    ns = f"ml-{unique}"
    create_namespace(node.cluster, ns)
    labels = {"app": "train"}
    node.cluster.raw("POST", f"/apis/apps/v1/namespaces/{ns}/replicasets", ctype=JSON, body={
        "metadata": {"name": "train"},
        "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
            "metadata": {"labels": labels},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": node.name},
                     "containers": [{"name": "c", "image": "ml:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}}})  # fmt: skip
    if budget:
        node.cluster.raw("POST", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets",
                         ctype=JSON, body={"metadata": {"name": "train"},
                         "spec": {"minAvailable": 1, "selector": {"matchLabels": labels}}})  # fmt: skip

        def observed():
            pdb = node.cluster.get(f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/train",
                                   "read pdb").get("status") or {}  # fmt: skip
            return pdb.get("currentHealthy") == 1 and pdb.get("disruptionsAllowed") == 0

        wait_until(observed, "the disruption controller to observe the budget", WAIT, 0.1)

    def running():
        pods = node.cluster.list_all(f"/api/v1/namespaces/{ns}/pods", "list pods")
        return next((p for p in pods if p["status"].get("phase") == "Running"), None)

    return wait_until(running, "the trainer Running", WAIT, 0.05)


def pods_of(node: MigNode, unique: str) -> list[dict]:
    return node.cluster.list_all(f"/api/v1/namespaces/ml-{unique}/pods", "list pods")


def test_label_drives_pending_then_success_and_the_node_advertises_the_layout(
    mig_node, kube, unique
):
    pod = trainer(mig_node, unique)
    mig_node.label({CONFIG_LABEL: "all-1g.10gb"})
    mark = kube.audit_mark()

    result = mig_node.reconfigure()

    assert (result.state, result.states) == ("success", ["pending", "success"]), result
    labels = mig_node.labels()
    assert labels[STATE_LABEL] == "success" and labels[PLUGIN] == "true"
    annotations = set(mig_node.annotations())
    assert not {REASON_ANNOTATION, PAUSED_ANNOTATION, CORDON_ANNOTATION} & annotations
    assert not mig_node.unschedulable()
    # the GPU was idle when it changed: the user's pod was evicted (Eviction API) first, the
    # plugin paused
    assert pod["metadata"]["uid"] not in {p["metadata"]["uid"] for p in pods_of(mig_node, unique)}
    evictions = [e for e in kube.audit_events(mark)
                 if (e.get("objectRef") or {}).get("subresource") == "eviction"]  # fmt: skip
    assert [e["objectRef"]["name"] for e in evictions] == [pod["metadata"]["name"]], evictions
    assert evictions[0]["responseStatus"]["code"] == 201
    assert "evicted 1 GPU pod(s)" in result.steps
    assert (
        "paused GPU clients (dcgm-exporter, device-plugin, gpu-feature-discovery)" in result.steps
    )
    # the plugin restarted on the new layout and advertises what the fixture holds
    assert mig_node.gpu_allocatable() == {"nvidia.com/mig-1g.10gb": "7"}
    assert (
        "node advertises the layout in its allocatable (nvidia.com/mig-1g.10gb: 7)" in result.steps
    )
    assert len(mig_node.plugin_pods()) == 1
    assert len(mig_node.plugin.registered) == 2  # the plugin pod before and the one after
    assert [c[2] for c in mig_node.applier.calls] == [True, False]

    # The ReplicaSet's replacement asks for a whole GPU, which the node no longer offers: once
    # uncordoned, the scheduler still finds no room. Its words depend on the cluster: "Insufficient
    # nvidia.com/gpu", or "cannot allocate all claims" where a DeviceClass backs nvidia.com/gpu
    # (gpustack's DRA mode, which tests/kube/test_apply.py leaves on the shared control plane).
    def refused_on_the_uncordoned_node():
        uid = pod["metadata"]["uid"]
        pods = [p for p in pods_of(mig_node, unique) if p["metadata"]["uid"] != uid]
        cond = [c for p in pods for c in p["status"].get("conditions") or []
                if c["type"] == "PodScheduled" and c["status"] == "False"]  # fmt: skip
        return any(c.get("reason") == "Unschedulable" and "were unschedulable" not in c["message"]
                   for c in cond)  # fmt: skip

    try:
        wait_until(refused_on_the_uncordoned_node, "the replacement refused by the scheduler",
                   WAIT, 0.1)  # fmt: skip
    except AssertionError as exc:
        seen = [(p["metadata"]["name"], p["spec"].get("nodeName"), p["status"])
                for p in pods_of(mig_node, unique)]  # fmt: skip
        raise AssertionError(f"{exc}; pods: {seen}") from None
    assert all(not p["spec"].get("nodeName") for p in pods_of(mig_node, unique))

    changing = len(mig_node.fixture.mutating_calls())
    again = mig_node.reconfigure()
    assert (again.state, again.states, again.steps) == ("success", ["success"], [])
    assert len(mig_node.fixture.mutating_calls()) == changing  # re-run: nothing changed on the host


def test_switch_layout_and_back_to_disabled(mig_node):
    for layout, advertised in (
        ("all-1g.10gb", {"nvidia.com/mig-1g.10gb": "7"}),
        ("all-balanced", {"nvidia.com/mig-1g.10gb": "2", "nvidia.com/mig-2g.20gb": "1",
                          "nvidia.com/mig-3g.40gb": "1"}),
        ("all-disabled", {"nvidia.com/gpu": "1"}),
    ):  # fmt: skip
        mig_node.label({CONFIG_LABEL: layout})
        result = mig_node.reconfigure()
        assert result.states == ["pending", "success"], (layout, result)
        assert mig_node.gpu_allocatable() == advertised, layout


def test_a_fixture_error_sets_failed_with_its_reason_and_resumes_the_clients(mig_node):
    mig_node.label({CONFIG_LABEL: "all-1g.10gb"})
    proc = mig_node.fixture.use_gpu(0)  # a process outside Kubernetes holds the GPU
    try:
        result = mig_node.reconfigure()
    finally:
        proc.kill()
        proc.wait()

    assert result.states == ["pending", "failed"], result
    meta = mig_node.read()["metadata"]
    assert meta["labels"][STATE_LABEL] == "failed"
    reason = meta["annotations"][REASON_ANNOTATION]
    assert str(proc.pid) in reason and reason == result.reason
    assert meta["labels"][PLUGIN] == "true" and PAUSED_ANNOTATION not in meta["annotations"]
    mig_node.wait_resumed({"nvidia.com/gpu": "1"})  # the device plugin is back, on the old layout
    assert mig_node.unschedulable()  # the GPUs' layout is unknown: stays cordoned
    assert mig_node.fixture.mutating_calls() == []

    # the process is gone: the next run changes the layout and gives the node back
    again = mig_node.reconfigure()
    assert again.states == ["pending", "success"], again
    assert not mig_node.unschedulable()
    assert CORDON_ANNOTATION not in mig_node.annotations()
    assert mig_node.gpu_allocatable() == {"nvidia.com/mig-1g.10gb": "7"}


def test_a_profile_the_gpu_does_not_offer_fails_with_the_role_s_reason(mig_node):
    mig_node.label({CONFIG_LABEL: "all-7g.141gb"})  # an H200 layout on an H100

    result = mig_node.reconfigure()

    # MIG off, the driver lists no profiles: only enabling MIG shows the profile is missing;
    # the role switches the mode back, and the node says why.
    assert result.states == ["pending", "failed"], result
    assert result.reason.startswith(
        "GPU 0 (NVIDIA H100 80GB HBM3): profile 7g.141gb is not offered"
    )
    assert result.reason.endswith("MIG mode set back to Disabled")
    meta = mig_node.read()["metadata"]
    assert meta["annotations"][REASON_ANNOTATION] == result.reason
    assert meta["labels"][PLUGIN] == "true"
    mig_node.wait_resumed({"nvidia.com/gpu": "1"})


def test_a_budget_that_allows_no_disruption_fails_the_change_before_the_host_is_touched(
    mig_node, unique
):
    """The eviction goes through the real Eviction API; the real disruption controller's budget
    refuses it (429) until gpustack's pod deletion timeout (5 s: it bounds the clients' pause
    too, so no other test's DaemonSet may select the node: tests/kube/conftest.py deletes the
    namespaces a test leaves)."""
    pod = trainer(mig_node, unique, budget=True)
    mig_node.label({CONFIG_LABEL: "all-1g.10gb"})

    result = reconfigure_node(mig_node.name, mig_node.backend, mig_node.applier, Clock(),
                              StepOptions(poll=0.1, pod_deletion_timeout=5), "mixed")  # fmt: skip

    assert result.states == ["pending", "failed"], result
    name = f"ml-{unique}/{pod['metadata']['name']}"
    assert result.reason.startswith(f"GPU pod eviction timed out after 5 s: 1 left; {name}: "
                                    "blocked by a PodDisruptionBudget: "), result.reason  # fmt: skip
    assert "needs 1 healthy pods" in result.reason, result.reason
    assert mig_node.annotations()[REASON_ANNOTATION] == result.reason
    assert [c[2] for c in mig_node.applier.calls] == [True]  # the layout was never applied
    assert mig_node.fixture.mutating_calls() == []
    running = [p["metadata"]["uid"] for p in pods_of(mig_node, unique)
               if p["status"].get("phase") == "Running"]  # fmt: skip
    assert running == [pod["metadata"]["uid"]]  # the user's pod still runs on its GPU
    assert mig_node.unschedulable()
    mig_node.wait_resumed({"nvidia.com/gpu": "1"})


def test_admin_cordon_and_forced_off_clients_are_kept(mig_node, kube):
    mig_node.label({CONFIG_LABEL: "all-1g.10gb", DCGM: "false"})
    mig_node.cluster.raw("PATCH", f"/api/v1/nodes/{mig_node.name}",
                         body={"spec": {"unschedulable": True}}, ctype=MERGE)  # fmt: skip
    mark = kube.audit_mark()

    result = mig_node.reconfigure()

    assert result.states == ["pending", "success"], result
    uri = f"/api/v1/nodes/{mig_node.name}?"
    patches = [e["requestObject"]["metadata"]["labels"] for e in kube.audit_events(mark)
               if e["verb"] == "patch" and e["requestURI"].startswith(uri)
               and "labels" in (e["requestObject"].get("metadata") or {})]  # fmt: skip
    paused = [p for p in patches if p.get(PLUGIN) == PAUSED]
    assert len(paused) == 1 and DCGM not in paused[0], patches
    labels = mig_node.labels()
    assert labels[DCGM] == "false"  # forced off: left alone
    assert labels[PLUGIN] == "true"
    assert mig_node.unschedulable()  # the admin's cordon stays
    assert f"{mig_node.name} stays cordoned (an admin had cordoned it)" in result.steps


def test_no_label_is_nothing_to_do(mig_node):
    result = mig_node.reconfigure()
    assert (result.state, result.states, mig_node.applier.calls) == ("", [], [])
    assert STATE_LABEL not in mig_node.labels()


def test_rebooting_left_over_with_the_mode_still_unchanged_is_failed(mig_node):
    mig_node.label({CONFIG_LABEL: "all-1g.10gb", STATE_LABEL: "rebooting"})
    result = mig_node.reconfigure()
    assert result.states == ["failed"]
    assert result.reason == "MIG mode change did not take effect after rebooting"
    assert mig_node.fixture.mutating_calls() == []


def test_reboot_for_the_mode_change_goes_pending_rebooting_success(reboot_node):
    node = reboot_node
    result = node.reconfigure(reboot=node.applier.reboot)

    assert result.states == ["pending", "rebooting", "success"], result
    assert [c[2] for c in node.applier.calls] == [True, False, "reboot"]
    assert not [c for c in node.fixture.mutating_calls() if "-r" in c]  # no reset: the reboot
    assert node.gpu_allocatable() == {"nvidia.com/mig-1g.10gb": "7"}
    assert node.labels()[PLUGIN] == "true"
    assert not node.unschedulable()


def test_without_a_reboot_the_node_waits_pending_then_a_later_run_finishes(reboot_node):
    node = reboot_node
    first = node.reconfigure()
    assert first.states == ["pending", "pending"] and "reboot required" in first.reason
    labels = node.labels()
    assert labels[STATE_LABEL] == "pending" and labels[PLUGIN] == PAUSED
    assert node.unschedulable()  # idle GPUs until the reboot
    assert node.plugin_pods() == []
    assert node.gpu_allocatable() == {}  # no plugin: the kubelet offers no GPU

    waiting = node.reconfigure()
    assert waiting.state == "pending" and "waiting for a reboot" in waiting.reason
    assert node.plugin_pods() == []

    node.applier.reboot(node.name, "all-1g.10gb")  # the admin reboots; the boot unit applies it
    done = node.reconfigure()
    assert done.states == ["success"], done
    labels = node.labels()
    assert labels[PLUGIN] == "true" and labels[STATE_LABEL] == "success"
    assert not node.unschedulable()
    assert node.gpu_allocatable() == {"nvidia.com/mig-1g.10gb": "7"}


def test_a_boot_that_did_not_switch_the_mode_is_failed(reboot_node):
    node = reboot_node
    result = node.reconfigure(reboot=lambda h, c: node.applier.reboot(h, c, takes=False))
    assert result.states == ["pending", "rebooting", "failed"], result
    assert result.reason == "MIG mode change did not take effect after rebooting"
    assert node.annotations()[REASON_ANNOTATION] == result.reason
    assert node.labels()[PLUGIN] == "true"


def test_the_flow_uses_the_strategy_the_device_plugin_runs_with(mig_node, tmp_path):
    inv = inventory(tmp_path, [mig_node.name])
    ns = {"gpustack_k8s_namespace": mig_node.namespace}
    # configured: none; deployed: mixed
    _, strategy = connect_backend(str(mig_node.kubeconfig), inv, ns)
    assert strategy == "mixed"
    mig_node.cluster.raw(
        "DELETE", f"/apis/apps/v1/namespaces/{mig_node.namespace}/daemonsets/nvidia-device-plugin"
    )
    _, strategy = connect_backend(str(mig_node.kubeconfig), inv,
                                  {**ns, "gpustack_k8s_mig_strategy": "single"})  # fmt: skip
    assert strategy == "single"


def test_under_dra_the_layout_is_checked_in_the_resource_slices(kubeconfig, unique, tmp_path):
    """gpustack_k8s_gpu_allocation=dra: the DRA kubelet plugin is paused with the other clients,
    and the new layout is read from the node's ResourceSlices (DRA advertises no allocatable
    GPU resource), counted by profile whatever gpustack_k8s_mig_strategy says."""
    cluster = connect(str(kubeconfig))
    name, namespace = f"gpu-{unique}", f"gs-{unique}"
    ready_kwok_node(cluster, name)
    fixture = FixtureNode(tmp_path / "host", ["H100-SXM5-80GB"])
    plugin = DraKubeletPlugin(str(kubeconfig), name, namespace, lambda: fixture_gpus(fixture),
                              uuids_for(name, 1)).start()  # fmt: skip
    settings = {"gpustack_k8s_namespace": namespace, "gpustack_k8s_gpu_allocation": "dra",
                "gpustack_k8s_mig_strategy": "single"}  # fmt: skip
    try:
        install_operands(cluster, name, settings)
        backend, strategy = connect_backend(str(kubeconfig), inventory(tmp_path, [name]), settings)
        assert (backend.nodes.dra, strategy) == (True, "mixed")
        wait_until(lambda: len(plugin.devices()) == 1, "the plugin to publish the GPU", WAIT, 0.05)
        cluster.raw("PATCH", f"/api/v1/nodes/{name}", ctype=MERGE,
                    body={"metadata": {"labels": {CONFIG_LABEL: "all-1g.10gb"}}})  # fmt: skip
        applier = FixtureMigApplier(str(kubeconfig), {name: fixture})

        result = reconfigure_node(name, backend, applier, Clock(), OPTS, strategy)

        assert (result.state, result.states) == ("success", ["pending", "success"]), result
        assert any(s.startswith("paused GPU clients (") and "dra-driver" in s
                   for s in result.steps), result.steps  # fmt: skip
        assert (
            "node advertises the layout in its ResourceSlices of gpu.nvidia.com "
            "(nvidia.com/mig-1g.10gb: 7)" in result.steps
        ), result.steps
        profiles = [d["attributes"]["profile"]["string"] for d in plugin.devices()]
        assert profiles == ["1g.10gb"] * 7
        assert len(plugin.published) == 2  # the plugin pod before and the one after
        labels = cluster.get(f"/api/v1/nodes/{name}", "read node")["metadata"]["labels"]
        assert labels["nvidia.com/gpu.deploy.dra-driver"] == "true"
    finally:
        plugin.stop()
        with contextlib.suppress(Exception):
            cluster.raw("DELETE", f"/api/v1/namespaces/{namespace}")
        cluster.raw("DELETE", f"/api/v1/nodes/{name}")
        cluster.close()


def test_verification_fails_when_the_advertised_mig_devices_differ_from_the_layout(
    kubeconfig, unique, tmp_path
):
    """`install` end to end; the node shows 3 MIG devices where the layout has 7 (instances
    lost, a stale plugin): the capacity check fails and no verification pod is started."""
    fixture = FixtureNode(tmp_path / "host", ["H100-SXM5-80GB"])
    fact = fixture.apply("all-1g.10gb")
    assert fact["state"] == "success"
    cluster = connect(str(kubeconfig))
    name, namespace = f"gpu-{unique}", f"gs-{unique}"
    ready_kwok_node(cluster, name)
    plugin = DevicePlugin(str(kubeconfig), name, namespace, lambda: [(True, ["1g.10gb"] * 3)])
    plugin.start()
    try:
        extravars = {"gpustack_k8s_namespace": namespace, "gpustack_k8s_mig_strategy": "mixed",
                     "gpustack_k8s_capacity_timeout": 10}  # fmt: skip
        session = flow.prepare(str(kubeconfig), inventory(tmp_path, [name]), extravars)
        facts = {name: {**gpu_facts(name, 1), "gpustack_mig": fact}}
        report = flow.install(session, run_result(facts), clock=Clock())
    finally:
        plugin.stop()
        cluster.raw("DELETE", f"/api/v1/namespaces/{namespace}")
        cluster.raw("DELETE", f"/api/v1/nodes/{name}")
        cluster.close()

    assert not report.passed
    checks = {c.name: (c.status, c.message) for c in report.nodes[0].checks}
    assert checks["operands"][0] == "passed", checks
    status, message = checks["capacity"]
    assert status == "failed"
    assert message.startswith("advertised nvidia.com/mig-1g.10gb: 3 (layout: 7) after 10 s")
    assert "pod" not in checks


class FastClock(Clock):
    """Real time; install's waits look again every 50 ms instead of every second (the device
    plugin stand-in and kwok answer within milliseconds). Timeouts are real."""

    def sleep(self, seconds: float) -> None:
        super().sleep(min(seconds, 0.05))


def installed_with_layout(kubeconfig, unique, tmp_path, layout, extravars=None):
    """`install` on a kwok node after the nvidia_mig role applied `layout` on the fixture host
    (its real fact); the device plugin stand-in advertises what the fixture shows under the
    strategy install deployed. Returns the report and the strategy of the deployed plugin."""
    fixture = FixtureNode(tmp_path / "host", ["H100-SXM5-80GB"])
    fact = fixture.apply(layout)
    assert fact["state"] == "success"
    cluster = connect(str(kubeconfig))
    name, namespace = f"gpu-{unique}", f"gs-{unique}"
    ready_kwok_node(cluster, name)
    plugin = DevicePlugin(str(kubeconfig), name, namespace, lambda: fixture_gpus(fixture)).start()
    facts = {name: {**gpu_facts(name, 1), "gpustack_mig": fact}}
    pods = MigVerificationPods(cluster, tmp_path, name, uuids_for(name, 1)[0], H100,
                               lambda: fixture_gpus(fixture))  # fmt: skip
    try:
        session = flow.prepare(str(kubeconfig), inventory(tmp_path, [name]),
                               {"gpustack_k8s_namespace": namespace, **(extravars or {})})  # fmt: skip
        with pods:
            report = flow.install(session, run_result(facts), clock=FastClock())
        ds = cluster.get(f"/apis/apps/v1/namespaces/{namespace}/daemonsets/nvidia-device-plugin",
                         "read daemonset")  # fmt: skip
        env = ds["spec"]["template"]["spec"]["containers"][0]["env"]
        deployed = next(e["value"] for e in env if e["name"] == "MIG_STRATEGY")
    finally:
        plugin.stop()
        cluster.raw("DELETE", f"/api/v1/namespaces/{namespace}")
        cluster.raw("DELETE", f"/api/v1/nodes/{name}")
        cluster.close()
    return report, deployed, pods.requests


def capacity(report):
    return next((c.status, c.message) for c in report.nodes[0].checks if c.name == "capacity")


@pytest.mark.parametrize(
    ("layout", "strategy", "message"),
    [
        ("all-1g.10gb", "single", "nvidia.com/gpu: 7"),
        ("all-balanced", "mixed",
         "nvidia.com/mig-1g.10gb: 2, nvidia.com/mig-2g.20gb: 1, nvidia.com/mig-3g.40gb: 1"),
        ("all-disabled", "none", "nvidia.com/gpu: 1"),
    ],
)  # fmt: skip
def test_install_derives_the_strategy_from_the_layout(
    kubeconfig, unique, tmp_path, layout, strategy, message
):
    report, deployed, requests = installed_with_layout(kubeconfig, unique, tmp_path, layout)
    assert report.passed, report.to_dict()
    assert report.mig_strategy == strategy and deployed == strategy
    assert capacity(report) == ("passed", message)
    assert len(requests) == 1, requests
    pod = next(c for c in report.nodes[0].checks if c.name == "pod")
    assert ("(MIG device MIG-" in pod.message) == (strategy != "none"), pod.message


def test_a_strategy_the_user_set_wins(kubeconfig, unique, tmp_path):
    report, deployed, requests = installed_with_layout(
        kubeconfig, unique, tmp_path, "all-1g.10gb", {"gpustack_k8s_mig_strategy": "mixed"}
    )
    assert report.passed, report.to_dict()
    assert deployed == "mixed"
    assert capacity(report) == ("passed", "nvidia.com/mig-1g.10gb: 7")
    assert requests == [{"nvidia.com/mig-1g.10gb": "1"}]
    pod = next(c for c in report.nodes[0].checks if c.name == "pod")
    assert "(MIG device MIG-" in pod.message, pod.message
