"""The emulator's stricter rules, each shown failing the way the real component fails.

Kubelet admission of extended resources, RBAC-driven crash loops of operand images, DaemonSet
status from pods, EvictionREST's rules, graceful deletion, admission plugins, the scheduler,
NFD present or absent. Sources are cited in the emulator's modules and in README.md.
"""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
import yaml
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from gpustack.k8s.manifests import ClusterConfig, render
from tests.cluster.emulator import NodeHardware, PodFate
from tests.cluster.emulator.hardware import Gpu
from tests.cluster.emulator.images import DevicePlugin, gfd_labels
from tests.cluster.helpers import uuids_for
from tests.conftest import ROOT

NS = "gpustack-system"


@pytest.fixture
def api(kubeconfig):
    api = config.new_client_from_config(str(kubeconfig))
    yield api
    api.close()


def apply_all(emu, objects):
    for obj in objects:
        emu.create(obj)


def gpu_node(emu, name="gpu1", gpus=2, **labels):
    hardware = NodeHardware.gpu_node(uuids_for(name, gpus))
    deploy = {
        f"nvidia.com/gpu.deploy.{o}": "true"
        for o in ("device-plugin", "gpu-feature-discovery", "dcgm-exporter")
    }
    emu.add_node(name, hardware=hardware, labels={**deploy, **labels})
    return hardware


def pod_of(emu, app):
    return emu.objects("v1", "Pod", NS, selector=f"app.kubernetes.io/name={app}")[0]


def gpu_pod(name, node, count, resource="nvidia.com/gpu", ns="default"):
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": {"nodeName": node, "restartPolicy": "Never",
                     "containers": [{"name": "c", "image": "ml/job:1", "resources": {"limits": {resource: count}}}]}}  # fmt: skip


# ----------------------------------------------------------------------------- kubelet admission


def test_kubelet_rejects_a_request_above_the_free_devices(cluster):
    emu = cluster.emulator
    gpu_node(emu, gpus=2)
    apply_all(emu, render(ClusterConfig(gfd_enabled=False, dcgm_exporter_enabled=False)))
    assert emu.get("v1", "Node", "gpu1")["status"]["allocatable"]["nvidia.com/gpu"] == "2"
    emu.pod_policy = lambda pod: PodFate.running()
    emu.create(gpu_pod("holder", "gpu1", 1))
    emu.create(gpu_pod("greedy", "gpu1", 2))

    greedy = emu.get("v1", "Pod", "greedy", "default")["status"]
    assert greedy["phase"] == "Failed" and greedy["reason"] == "UnexpectedAdmissionError"
    assert greedy["message"] == (
        "Pod was rejected: Allocate failed due to requested number of devices unavailable for "
        "nvidia.com/gpu. Requested: 2, Available: 1, which is unexpected"
    )
    events = [
        e for e in emu.objects("v1", "Event", "default") if e["involvedObject"]["name"] == "greedy"
    ]
    assert [(e["reason"], e["type"]) for e in events] == [("UnexpectedAdmissionError", "Warning")]
    assert emu.get("v1", "Pod", "holder", "default")["status"]["phase"] == "Running"
    emu.create(gpu_pod("fits", "gpu1", 1))  # the one free device is still there
    assert emu.get("v1", "Pod", "fits", "default")["status"]["phase"] == "Running"


def test_mps_sharing_refuses_more_than_one_replica(cluster):
    emu = cluster.emulator
    gpu_node(emu, gpus=1, **{"nvidia.com/mps.capable": "true"})
    apply_all(
        emu, render(ClusterConfig(mps_replicas=4, gfd_enabled=False, dcgm_exporter_enabled=False))
    )
    assert emu.get("v1", "Node", "gpu1")["status"]["allocatable"]["nvidia.com/gpu"] == "4"
    emu.create(gpu_pod("two", "gpu1", 2))
    status = emu.get("v1", "Pod", "two", "default")["status"]
    assert status["reason"] == "UnexpectedAdmissionError"
    assert ("invalid request: maximum request size for shared resources is 1; found 2, "
            "which is unexpected") in status["message"]  # fmt: skip


def test_mps_plugin_advertises_nothing_until_the_control_daemon_runs(cluster):
    emu = cluster.emulator
    gpu_node(emu, gpus=1)  # not labelled nvidia.com/mps.capable: no MPS daemon lands there
    apply_all(
        emu, render(ClusterConfig(mps_replicas=4, gfd_enabled=False, dcgm_exporter_enabled=False))
    )
    assert "nvidia.com/gpu" not in emu.get("v1", "Node", "gpu1")["status"]["allocatable"]
    emu.merge_patch(
        "v1", "Node", "gpu1", {"metadata": {"labels": {"nvidia.com/mps.capable": "true"}}}
    )
    assert emu.get("v1", "Node", "gpu1")["status"]["allocatable"]["nvidia.com/gpu"] == "4"


def test_devices_of_finished_pods_are_free_again_and_a_gone_plugin_leaves_zero(cluster):
    emu = cluster.emulator
    gpu_node(emu, gpus=1)
    apply_all(emu, render(ClusterConfig(gfd_enabled=False, dcgm_exporter_enabled=False)))
    emu.pod_policy = lambda pod: PodFate.succeeded("done\n")
    emu.create(gpu_pod("first", "gpu1", 1))
    emu.create(gpu_pod("second", "gpu1", 1))
    assert emu.get("v1", "Pod", "second", "default")["status"]["phase"] == "Succeeded"
    emu.delete("apps/v1", "DaemonSet", "nvidia-device-plugin", NS)
    emu.tick()  # the plugin pod finishes terminating
    status = emu.get("v1", "Node", "gpu1")["status"]
    assert (status["capacity"]["nvidia.com/gpu"], status["allocatable"]["nvidia.com/gpu"]) == (
        "1",
        "0",
    )


# ----------------------------------------------------------------------------- RBAC crash loops


def _gfd_as_rendered_before_issue_12():
    """gpustack's GFD DaemonSet before the fix: default ServiceAccount, API mode by default."""
    objects = render(ClusterConfig(dcgm_exporter_enabled=False))
    old = []
    for obj in objects:
        if obj["kind"] in ("ServiceAccount", "Role", "RoleBinding"):
            continue
        if obj["metadata"]["name"] == "gpu-feature-discovery":
            obj = copy.deepcopy(obj)
            spec = obj["spec"]["template"]["spec"]
            spec.pop("serviceAccountName")
            spec.pop("automountServiceAccountToken")
            env = spec["containers"][0]["env"]
            spec["containers"][0]["env"] = [
                e for e in env if e["name"] not in ("USE_NODE_FEATURE_API", "POD_NAME")
            ]
        old.append(obj)
    return old


@pytest.mark.parametrize("nfd", [True, False], ids=["nfd", "no-nfd"])
def test_gfd_with_the_default_service_account_crash_loops(cluster, nfd):
    emu = cluster.emulator
    if nfd:
        emu.install_nfd()
    gpu_node(emu)
    apply_all(emu, _gfd_as_rendered_before_issue_12())
    for _ in range(3):  # three kubelet syncs (each served request is one)
        emu.tick()

    pod = pod_of(emu, "gpu-feature-discovery")
    container = pod["status"]["containerStatuses"][0]
    assert container["state"]["waiting"]["reason"] == "CrashLoopBackOff"
    assert container["restartCount"] >= 3 and not container["ready"]
    assert container["lastState"]["terminated"]["exitCode"] == 1
    log = emu.kubelet.log(emu.store.get(emu.kind("v1", "Pod"), NS, pod["metadata"]["name"]), None)
    assert ('nodefeatures.nfd.k8s-sigs.io "nvidia-features-for-gpu1" is forbidden: User '
            '"system:serviceaccount:gpustack-system:default" cannot get resource "nodefeatures" '
            'in API group "nfd.k8s-sigs.io" in the namespace "gpustack-system"') in log  # fmt: skip
    ds = emu.get("apps/v1", "DaemonSet", "gpu-feature-discovery", NS)["status"]
    assert (ds["numberReady"], ds["desiredNumberScheduled"], ds["numberUnavailable"]) == (0, 1, 1)
    # Granting upstream's Role to the default ServiceAccount lets the next restart succeed.
    if nfd:
        role = next(o for o in render(ClusterConfig()) if o["kind"] == "Role")
        emu.create(role)
        emu.create({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                    "metadata": {"name": "gfd-default", "namespace": NS},
                    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "gpu-feature-discovery"},
                    "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": NS}]})  # fmt: skip
        emu.tick()
        ds = emu.get("apps/v1", "DaemonSet", "gpu-feature-discovery", NS)["status"]
        assert ds["numberReady"] == 1


def test_gpustacks_rbac_grants_every_call_an_operand_cannot_do_without(cluster):
    """Cross-check: the rendered Role covers each fatal API call the emulated images make."""
    from tests.cluster.emulator.images import API_CALLS, profile_for
    from tests.cluster.emulator.rbac import Subject, allowed

    emu = cluster.emulator
    emu.install_nfd()
    apply_all(emu, render(ClusterConfig(), nfd_api=True))
    checked = 0
    for daemonset in emu.objects("apps/v1", "DaemonSet", NS):
        spec = daemonset["spec"]["template"]["spec"]
        subject = Subject(NS, spec.get("serviceAccountName") or "default")
        for container in spec["containers"]:
            for verb, group, resource, fatal in API_CALLS[profile_for(container).name]:
                if fatal:
                    assert allowed(emu.store, subject, verb, group, resource, NS, "x"), (
                        verb,
                        resource,
                    )
                    checked += 1
    assert checked == 3  # GFD's get/create/update of nodefeatures


def test_a_missing_service_account_leaves_the_daemonset_without_pods(cluster):
    emu = cluster.emulator
    gpu_node(emu)
    objects = [
        o
        for o in render(ClusterConfig(dcgm_exporter_enabled=False))
        if o["kind"] != "ServiceAccount"
    ]
    apply_all(emu, objects)
    ds = emu.get("apps/v1", "DaemonSet", "gpu-feature-discovery", NS)
    assert (
        ds["status"]["currentNumberScheduled"] == 0 and ds["status"]["desiredNumberScheduled"] == 1
    )
    events = [e["message"] for e in emu.objects("v1", "Event", NS) if e["reason"] == "FailedCreate"]
    assert any(
        "error looking up service account gpustack-system/gpu-feature-discovery" in m
        for m in events
    )


def test_admission_refuses_a_pod_with_an_unknown_runtime_class(cluster, api):
    core = client.CoreV1Api(api)
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod("default", {"metadata": {"name": "p"}, "spec": {
            "runtimeClassName": "nvidia", "containers": [{"name": "c", "image": "i"}]}})  # fmt: skip
    assert info.value.status == 403 and 'RuntimeClass \\"nvidia\\" not found' in info.value.body


def test_pod_status_cannot_be_set_on_create(cluster, api):
    cluster.emulator.add_node("n1")
    core = client.CoreV1Api(api)
    core.create_namespaced_pod("default", {"metadata": {"name": "p"}, "spec": {"nodeName": "n1",
                               "containers": [{"name": "c", "image": "i"}]},
                               "status": {"phase": "Succeeded"}})  # fmt: skip
    assert core.read_namespaced_pod("p", "default").status.phase == "Running"


# ----------------------------------------------------------------------------- DaemonSets


def test_daemonset_status_follows_its_pods_and_nodes(cluster):
    emu = cluster.emulator
    gpu_node(emu, "gpu1")
    emu.add_node("gpu2", labels={"nvidia.com/gpu.deploy.device-plugin": "true"})  # no GPU
    apply_all(emu, render(ClusterConfig(gfd_enabled=False, dcgm_exporter_enabled=False)))
    status = emu.get("apps/v1", "DaemonSet", "nvidia-device-plugin", NS)["status"]
    assert (
        status["desiredNumberScheduled"],
        status["currentNumberScheduled"],
        status["numberReady"],
    ) == (2, 2, 1)
    assert status["numberUnavailable"] == 1  # the plugin crash-loops where NVML finds no GPU
    emu.merge_patch(
        "v1",
        "Node",
        "gpu2",
        {"metadata": {"labels": {"nvidia.com/gpu.deploy.device-plugin": None}}},
    )
    emu.tick()
    status = emu.get("apps/v1", "DaemonSet", "nvidia-device-plugin", NS)["status"]
    assert (status["desiredNumberScheduled"], status["numberReady"]) == (1, 1)
    assert "numberUnavailable" not in status


# ----------------------------------------------------------------------------- eviction


def _running(emu, name, labels, node="n1"):
    emu.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default", "labels": labels},
                "spec": {"nodeName": node, "containers": [{"name": "c", "image": "i"}]}})  # fmt: skip


def _pdb(emu, name, selector, **spec):
    emu.create({"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"selector": {"matchLabels": selector}, **spec}})  # fmt: skip


def _evict(core, name):
    return core.create_namespaced_pod_eviction(
        name, "default", {"metadata": {"name": name, "namespace": "default"}}
    )


def test_eviction_follows_evictionrest(cluster, api):
    emu = cluster.emulator
    emu.add_node("n1")
    core = client.CoreV1Api(api)
    emu.pod_policy = lambda pod: PodFate.running()
    _running(emu, "a", {"app": "a"})
    _pdb(emu, "one", {"app": "a"}, minAvailable=1)
    _pdb(emu, "two", {"app": "a"}, maxUnavailable=0)
    with pytest.raises(ApiException) as info:
        _evict(core, "a")
    assert info.value.status == 500 and "more than one PodDisruptionBudget" in info.value.body
    # A Pending pod is deleted without looking at budgets (gracefully: it is bound to n1).
    emu.pause_kubelet("n1")
    _running(emu, "pending", {"app": "a"})
    _evict(core, "pending")
    assert emu.get("v1", "Pod", "pending", "default")["metadata"]["deletionTimestamp"]
    emu.resume_kubelet("n1")
    core.list_namespaced_pod("default")
    assert emu.get("v1", "Pod", "pending", "default") is None
    # A budget with room: the pod is deleted gracefully (terminating, then gone).
    emu.delete("policy/v1", "PodDisruptionBudget", "two", "default")
    _running(emu, "b", {"app": "a"})
    _evict(core, "b")
    evicted = emu.get("v1", "Pod", "b", "default")
    assert (
        evicted["metadata"]["deletionTimestamp"]
        and evicted["metadata"]["deletionGracePeriodSeconds"] == 30
    )
    assert any(c["type"] == "DisruptionTarget" for c in evicted["status"]["conditions"])
    assert emu.get("policy/v1", "PodDisruptionBudget", "one", "default")["status"][
        "disruptedPods"
    ].keys() == {"b"}
    core.list_namespaced_pod("default")  # the kubelet's next sync finishes the deletion
    assert emu.get("v1", "Pod", "b", "default") is None
    with pytest.raises(ApiException) as info:
        _evict(core, "a")  # the last healthy pod of a minAvailable=1 budget
    assert (
        info.value.status == 429 and "needs 1 healthy pods and has 1 currently" in info.value.body
    )


def test_eviction_of_terminal_and_unready_pods(cluster, api):
    emu = cluster.emulator
    emu.add_node("n1")
    core = client.CoreV1Api(api)
    emu.pod_policy = lambda pod: (
        PodFate.failed("boom\n") if pod["metadata"]["name"] == "done" else PodFate.running()
    )
    emu.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "done", "namespace": "default", "labels": {"app": "x"}},
                "spec": {"nodeName": "n1", "restartPolicy": "Never", "containers": [{"name": "c", "image": "i"}]}})  # fmt: skip
    _pdb(emu, "x", {"app": "x"}, minAvailable=5)
    _evict(core, "done")  # terminal: deleted without a budget check, at once
    assert emu.get("v1", "Pod", "done", "default") is None
    with pytest.raises(ApiException) as info:
        core.create_namespaced_pod_eviction(
            "a", "default", {"metadata": {"name": "b", "namespace": "default"}}
        )
    assert info.value.status == 400


# ----------------------------------------------------------------------------- scheduler, NFD


def test_scheduler_explains_why_a_gpu_pod_does_not_fit(cluster):
    emu = cluster.emulator
    gpu_node(emu, gpus=1)
    apply_all(emu, render(ClusterConfig(gfd_enabled=False, dcgm_exporter_enabled=False)))
    emu.add_node("cpu1")
    emu.merge_patch("v1", "Node", "cpu1", {"spec": {"unschedulable": True}})
    pod = gpu_pod("wants-two", "", 2)
    del pod["spec"]["nodeName"]
    emu.create(pod)
    condition = emu.get("v1", "Pod", "wants-two", "default")["status"]["conditions"][0]
    assert condition["reason"] == "Unschedulable"
    assert condition["message"] == (
        "0/2 nodes are available: 1 Insufficient nvidia.com/gpu, 1 node(s) were unschedulable."
    )


def test_nfd_absent_present_and_worker_files(cluster):
    emu = cluster.emulator
    hardware = gpu_node(emu)
    objects = render(ClusterConfig(dcgm_exporter_enabled=False))  # feature-file mode
    apply_all(emu, objects)
    assert "nvidia.com/gpu.count" not in emu.get("v1", "Node", "gpu1")["metadata"]["labels"]
    assert (
        "nvidia.com/gpu.count=2"
        in hardware.files["/etc/kubernetes/node-feature-discovery/features.d/gfd"]
    )
    emu.install_nfd()  # its worker reads features.d
    labels = emu.get("v1", "Node", "gpu1")["metadata"]["labels"]
    assert labels["nvidia.com/gpu.count"] == "2"
    assert (
        "nvidia.com/gpu.count"
        in emu.get("v1", "Node", "gpu1")["metadata"]["annotations"][
            "nfd.node.kubernetes.io/feature-labels"
        ]
    )


REAL_H100 = ROOT / "tests/fixtures/real-gpu/2026-11-26-h100-80gb-hbm3/k8s-device-plugin"


def h100_context(uuid: str) -> SimpleNamespace:
    """What gfd_labels and DevicePlugin.registrations read: the lent H100 (MIG off, driver 580)."""
    gpu = Gpu(uuid, name="NVIDIA H100 80GB HBM3", memory_mib=81559)
    return SimpleNamespace(hw=NodeHardware(gpus=[gpu], driver="580.159.04"),
                           env=lambda *names, default=None: default,
                           pod={"metadata": {"uid": "plugin"}})  # fmt: skip


@pytest.mark.parametrize("strategy", ["none", "single", "mixed"])
def test_emulated_gfd_labels_are_what_real_gfd_wrote_on_an_h100(strategy):
    """GFD v0.20.0 (built from NVIDIA's source) on a real H100 80GB HBM3, MIG disabled, driver
    580.159.04: every label the emulator's GFD writes exists there with the same value, and the
    labels that depend on the strategy appear exactly when the real ones do."""
    text = (REAL_H100 / f"gfd-labels-mig-{strategy}.txt").read_text()
    real = dict(line.split("=", 1) for line in text.splitlines() if line)
    ctx = h100_context("GPU-157d6fa2-f775-77a4-5fa5-8133f751d7b8")
    emulated = gfd_labels(ctx, {"flags": {"migStrategy": strategy}})
    assert {name: real.get(name) for name in emulated} == emulated
    assert ("nvidia.com/mig.strategy" in emulated) == ("nvidia.com/mig.strategy" in real)


def test_the_device_plugin_fails_first_on_the_socket_directory_as_the_real_one_does():
    """Real v0.20.0 watches the kubelet socket directory before it reads its configuration or
    NVML (its log on a real H100 shows the order), so a pod without that hostPath and with a
    broken configuration dies of the missing directory, not of the configuration."""
    real = (REAL_H100 / "device-plugin-kubelet-absent.log").read_text()
    assert real.index("Starting FS watcher") < real.index("Loading configuration")
    assert real.index("Loading configuration") < real.index("Detected platform: nvml")
    ctx = SimpleNamespace(
        host_path=lambda path: None, config=lambda: (None, "unable to load config")
    )
    outcome = DevicePlugin().start(ctx)
    assert (outcome.running, outcome.exit_code) == (False, 1)
    assert "failed to create FS watcher for /var/lib/kubelet/device-plugins/" in outcome.log


ALLOCATE = ["default", "default-pass-device-specs", "ts4", "ts4-rename", "mig-single", "mig-mixed"]


@pytest.mark.parametrize("variant", ALLOCATE)
def test_emulated_device_plugin_registers_and_allocates_as_the_real_one(variant):
    """The real device plugin v0.20.0 on a real H100 (MIG disabled), fed the config files gpustack
    renders, answered ListAndWatch and Allocate (no kubelet; k8s-device-plugin/allocate/): the
    emulator registers the same resources with the same device IDs and health, and the devices
    allocated expose the same GPUs as the real Allocate's NVIDIA_VISIBLE_DEVICES."""
    real = json.loads((REAL_H100 / "allocate" / f"{variant}.json").read_text())
    config_name = "default" if variant.startswith("default") else variant
    config = yaml.safe_load((REAL_H100 / "configs" / f"{config_name}.yaml").read_text())
    ctx = h100_context(real[0]["devices"][0]["ID"].split("::")[0])
    replicated = (config.get("sharing") or {}).get("timeSlicing") or {}
    emulated = {r.resource: r for r in DevicePlugin.registrations(ctx, config, replicated, False)}
    by_socket = {
        "nvidia.com/"
        + s["socket"].rsplit("/", 1)[1].removeprefix("nvidia-").removesuffix(".sock"): s
        for s in real
    }  # the plugin serves nvidia.com/X on nvidia-X.sock
    assert sorted(emulated) == sorted(by_socket)
    for resource, served in by_socket.items():
        registration = emulated[resource]
        assert sorted(registration.devices) == sorted(d["ID"] for d in served["devices"])
        for device in served["devices"]:
            assert registration.devices[device["ID"]].healthy == (device["health"] == "Healthy")
        exposed = {registration.devices[i].gpu for i in served["allocate_ids"]}
        envs = served["allocate"]["container_responses"][0]["envs"]
        assert exposed == set(envs["NVIDIA_VISIBLE_DEVICES"].split(","))
