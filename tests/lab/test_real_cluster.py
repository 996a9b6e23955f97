"""gpustack against a real Kubernetes on the lab: `gpustack lab up --kubernetes` starts etcd,
kube-apiserver, kube-controller-manager and kube-scheduler (gpustack/lab/components.py's pinned
versions, built from Go modules) and a real kubelet on every node, talking to the node's own
containerd: Debian 12's 1.6 and Debian 13's 1.7. (forky's containerd 2.x cannot host a kubelet
on a cgroup v1 "hybrid" machine such as the CI's: its systemd needs cgroup2, which there carries
no cpu or memory controller; docs/lab.md.)

No node has a GPU: install, status, verify, upgrade and uninstall run for real and say so ("no
NVIDIA device"); pods run on every node, with and without RuntimeClass nvidia (NVIDIA's runtime,
built from source, on the node's containerd); what needs GPUs to be allocated is in tests/kube/
on kwok's stand-in nodes.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from gpustack.lab import kubelets, operand_images
from gpustack.upgrade.state import FileStateStore
from tests.conftest import run_cli, wait_until
from tests.fixtures import lab_fixtures

pytestmark = pytest.mark.lab

LAB = f"{os.environ.get('GPUSTACK_TEST_LAB_PREFIX', '')}rk{os.getpid()}"
OSES = ("debian12", "debian13")
NODES = [f"{LAB}-node{i + 1}" for i in range(len(OSES))]
CONTAINERS = [f"gpustack-{LAB}-node{i + 1}" for i in range(len(OSES))]
NAMESPACE = "gpustack-system"


def list_nodes(kubeconfig: Path) -> list[dict]:
    """The Node objects, as `kubectl get nodes -o json` shows them."""
    from kubernetes import client, config

    api = config.new_client_from_config(str(kubeconfig))
    return api.sanitize_for_serialization(client.CoreV1Api(api).list_node())["items"]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    folder = tmp_path_factory.mktemp("realk8s")
    inventory = folder / "lab.ini"
    try:
        proc = run_cli("lab", "up", "--name", LAB, "--nodes", str(len(OSES)),
                       "--os", ",".join(OSES), "--inventory", str(inventory), "--kubernetes",
                       timeout=3600)  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        kubeconfig = Path(proc.stdout.split("Kubeconfig:")[1].split()[0])
        varsfile = lab_fixtures.prepare(CONTAINERS, folder / "vars.json")
        # NVIDIA's device plugin image built from its Go module, and gpustack's verify image,
        # in every node's containerd under the names gpustack renders with the lab's registry
        vars_ = json.loads(varsfile.read_text()) | operand_images.lab_cluster_vars()
        varsfile.write_text(json.dumps(vars_))
        images = operand_images.build_all()
        for container in CONTAINERS:
            operand_images.load_into_node(container, images.values())
            # the tests' own workload image (busybox)
            kubelets.import_image(
                container, lab_fixtures.build_busybox_image(), lab_fixtures.IMAGE_REF
            )
        yield inventory, kubeconfig, varsfile
    finally:
        run_cli("lab", "down", "--name", LAB)


def test_every_node_runs_a_real_kubelet_on_its_own_containerd(lab):
    _, kubeconfig, _ = lab
    nodes = {n["metadata"]["name"]: n for n in list_nodes(kubeconfig)}
    assert set(nodes) == set(NODES)
    runtimes = {}
    for name, node in nodes.items():
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"] == "v1.36.3"
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready[0]["status"] == "True", ready
        runtimes[name] = info["containerRuntimeVersion"]
    majors = {v.split("://")[1].split(".")[0] + "." + v.split(".")[1] for v in runtimes.values()}
    assert majors == {"1.6", "1.7"}, runtimes


def install(inventory: Path, kubeconfig: Path, varsfile: Path, *extra: str) -> tuple[int, dict]:
    proc = run_cli("install", str(inventory), "--kubeconfig", str(kubeconfig), "-e",
                   f"@{varsfile}", "--output", "json", *extra, timeout=3600)  # fmt: skip
    return proc.returncode, json.loads(proc.stdout)


def test_install_applies_for_real_and_says_there_is_no_gpu(lab):
    inventory, kubeconfig, varsfile = lab
    code, report = install(inventory, kubeconfig, varsfile)
    k8s = report["kubernetes"]
    assert code == 3, report  # verification failed: no node has a GPU, and that is said
    assert report["exit_code"] == 3
    assert report["summary"]["failed"] == 0 and report["summary"]["ok"] == len(NODES)
    assert k8s["version"] == "v1.36.3"
    assert {a["action"] for a in k8s["applied"]} == {"created"}, k8s["applied"]
    assert ("RuntimeClass", "nvidia") in {(a["kind"], a["name"]) for a in k8s["applied"]}
    assert k8s["labels"] == {}  # no NVIDIA device: no GPU label, no operand on the node
    for node in NODES:
        checks = {c["name"]: c for c in k8s["nodes"][node]["checks"]}
        assert checks["node"]["status"] == "passed"
        assert checks["gpus"]["status"] == "failed"
        assert "no NVIDIA device" in checks["gpus"]["message"], checks

    # A second install changes nothing, on the hosts or in the API server (server-side apply
    # of the same objects keeps every resourceVersion).
    code, again = install(inventory, kubeconfig, varsfile)
    assert code == 3
    assert again["summary"]["changed"] == 0, again["summary"]
    assert {a["action"] for a in again["kubernetes"]["applied"]} == {"unchanged"}


def run_pod(kubeconfig: Path, node: str, runtime_class: str | None) -> tuple[dict, str]:
    """A pod pinned to `node` that lists its cgroup hierarchies and exits; (status, log)."""
    from kubernetes import client, config

    api = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
    name = f"probe-{node}-{runtime_class or 'default'}"
    spec = {
        "nodeName": node,
        "restartPolicy": "Never",
        "containers": [{"name": "probe", "image": lab_fixtures.IMAGE_REF,
                        "imagePullPolicy": "Never",
                        "command": ["/bin/sh", "-c", "echo probe-ok; ls /sys/fs/cgroup"]}],
    }  # fmt: skip
    if runtime_class:
        spec["runtimeClassName"] = runtime_class
    api.create_namespaced_pod("default", {"apiVersion": "v1", "kind": "Pod",
                                          "metadata": {"name": name}, "spec": spec})  # fmt: skip

    def finished():
        pod = api.read_namespaced_pod(name, "default")
        return pod if pod.status.phase in ("Succeeded", "Failed") else None

    pod = wait_until(finished, f"pod {name} to finish", timeout=180)
    status = api.api_client.sanitize_for_serialization(pod.status)
    log = api.read_namespaced_pod_log(name, "default") if pod.status.phase == "Succeeded" else ""
    api.delete_namespaced_pod(name, "default", grace_period_seconds=0)
    return status, log


def test_pods_run_through_the_nvidia_runtime_class(lab):
    """After install, a pod with runtimeClassName nvidia runs on each node's real kubelet and
    containerd through the handler gpustack wired: NVIDIA's nvidia-container-runtime, built from
    its Go module, which passes a spec that asks for no GPU on to runc unchanged
    (internal/modifier/cdi.go: "No devices requested; no modification required.")."""
    _, kubeconfig, _ = lab
    for node, container in zip(NODES, CONTAINERS, strict=True):
        status, log = run_pod(kubeconfig, node, None)
        assert status["phase"] == "Succeeded", status
        # The pod's cgroup hierarchies are mounted in the container (runc's cgroup v1 mount;
        # docs/lab.md: the lab repairs podman's stacked name=systemd mount for it).
        assert log.split()[0] == "probe-ok" and "memory" in log.split(), log
        before = node_command(container, f"cat {lab_fixtures.RUNTIME_LOG}")
        status, log = run_pod(kubeconfig, node, "nvidia")
        assert status["phase"] == "Succeeded", status
        assert log.split()[0] == "probe-ok", log
        ran = status["containerStatuses"][0]["containerID"].split("://")[1]
        calls = node_command(container, f"cat {lab_fixtures.RUNTIME_LOG}")[len(before) :]
        assert ran in calls, calls[-2000:]
        assert "No devices requested; no modification required." in calls, calls[-2000:]


def test_device_plugin_pods_meet_the_real_runtime_without_a_driver(lab):
    """A node labelled for the device plugin by hand (install labels no node without a GPU):
    the real DaemonSet controller and scheduler place NVIDIA's device plugin (built from source)
    there, and the kubelet starts it with RuntimeClass nvidia. NVIDIA's runtime asks NVML for
    the devices to inject and refuses the container: the driver is installed, not loaded.
    `status` shows the plugin not ready on that node, and no plugin on the other."""
    inventory, kubeconfig, varsfile = lab
    from kubernetes import client, config

    api = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
    label = "nvidia.com/gpu.deploy.device-plugin"
    node, other = NODES
    api.patch_node(node, {"metadata": {"labels": {label: "true"}}})
    try:
        deadline, pod, message = time.monotonic() + 240, None, ""
        while time.monotonic() < deadline and "NVML" not in message:
            pods = api.list_namespaced_pod("gpustack-system").items
            plugin = [p for p in pods if p.metadata.name.startswith("nvidia-device-plugin")]
            pod = plugin[0] if plugin else None
            for status in (pod and pod.status.container_statuses) or []:
                state = status.state.waiting or status.last_state.terminated
                message = (state and state.message) or ""
            time.sleep(2)
        assert pod is not None and len(plugin) == 1, plugin
        assert pod.spec.node_name == node and pod.spec.runtime_class_name == "nvidia"
        assert pod.metadata.owner_references[0].kind == "DaemonSet"
        assert "failed to initialize NVML: Driver Not Loaded" in message, message

        proc = run_cli("status", str(inventory), "--kubeconfig", str(kubeconfig), "-e",
                       f"@{varsfile}", "-o", "json", timeout=600)  # fmt: skip
        k8s = {h: v["kubernetes"] for h, v in json.loads(proc.stdout)["nodes"].items()}
        assert k8s[node]["device_plugin_pods"] == [pod.metadata.name], k8s
        assert k8s[node]["device_plugin_ready"] is False and k8s[node]["allocatable_gpus"] == 0
        assert k8s[other]["device_plugin_pods"] == [], k8s
    finally:
        api.patch_node(node, {"metadata": {"labels": {label: None}}})


def test_verify_says_there_is_no_gpu(lab):
    inventory, kubeconfig, varsfile = lab
    proc = run_cli("verify", str(inventory), "--kubeconfig", str(kubeconfig), "-e",
                   f"@{varsfile}", "-o", "json", timeout=1200)  # fmt: skip
    report = json.loads(proc.stdout)
    assert proc.returncode == report["exit_code"] == 3, proc.stderr
    assert report["kubernetes"]["version"] == "v1.36.3" and report["kubernetes"]["applied"] == []
    for node in NODES:
        checks = {c["name"]: c for c in report["kubernetes"]["nodes"][node]["checks"]}
        assert checks["node"]["status"] == "passed"
        assert checks["gpus"]["status"] == "failed"
        assert "not loaded: no NVIDIA device" in checks["gpus"]["message"], checks


MODES = {
    "time-slicing": ("gpustack_k8s_time_slicing_replicas=4",),
    "mps": ("gpustack_k8s_mps_replicas=2",),
    "dra": ("gpustack_k8s_gpu_allocation=dra",),
    "default": (),  # back to the default for the tests after these
}


@pytest.mark.parametrize("mode", list(MODES))
def test_each_gpu_mode_installs_for_real_and_says_there_is_no_gpu(lab, mode):
    """install in each way of giving GPUs to pods, one after the other on the same cluster: the
    real API server admits the mode's objects (the device plugin's sharing config, the MPS
    control daemon, DRA's DeviceClass in resource.k8s.io/v1 and NVIDIA's DRA driver), removes
    the other allocator's, and every node is reported without a GPU. DRA runs on the Debian 13
    node only, whose containerd (1.7) it turns CDI on in: containerd 1.6 has no CDI and is
    refused (tests/lab/test_runtime_cdi.py)."""
    inventory, kubeconfig, varsfile = lab
    extra = [arg for var in MODES[mode] for arg in ("-e", var)]
    nodes = NODES[1:] if mode == "dra" else NODES
    code, report = install(inventory, kubeconfig, varsfile, *extra, "--limit", ",".join(nodes))
    k8s = report["kubernetes"]
    assert code == report["exit_code"] == 3, report
    assert report["summary"]["failed"] == 0
    cdi = node_command(CONTAINERS[1], "containerd config dump | grep -E '^ *enable_cdi'")
    assert cdi.split() == ["enable_cdi", "=", "true" if mode == "dra" else "false"], cdi
    for node in nodes:
        checks = {c["name"]: c for c in k8s["nodes"][node]["checks"]}
        assert checks["gpus"]["status"] == "failed"
        assert "no NVIDIA device" in checks["gpus"]["message"], checks
    from kubernetes import client, config

    api_client = config.new_client_from_config(str(kubeconfig))
    apps, core = client.AppsV1Api(api_client), client.CoreV1Api(api_client)
    daemonsets = {d.metadata.name for d in apps.list_namespaced_daemon_set(NAMESPACE).items}
    if mode == "dra":
        classes = client.CustomObjectsApi(api_client).list_cluster_custom_object(
            "resource.k8s.io", "v1", "deviceclasses"
        )
        assert "gpu.nvidia.com" in {c["metadata"]["name"] for c in classes["items"]}
        assert "nvidia-device-plugin" not in daemonsets, daemonsets
        assert any(name.startswith("nvidia-dra-driver") for name in daemonsets), daemonsets
        return
    assert "nvidia-device-plugin" in daemonsets, daemonsets
    configs = "".join(
        "".join((c.data or {}).values()) for c in core.list_namespaced_config_map(NAMESPACE).items
    )
    if mode == "time-slicing":
        assert "timeSlicing" in configs and "replicas: 4" in configs, configs
    if mode == "mps":
        assert "mps:" in configs and "replicas: 2" in configs, configs
        assert any("mps" in name for name in daemonsets), daemonsets


def test_the_mig_label_flow_refuses_a_node_without_a_gpu(lab):
    """A node labelled nvidia.com/mig.config as a user would: `gpustack mig` reads the label,
    the nvidia_mig role finds no NVIDIA device on the host, and the node is marked failed with
    that reason, never cordoned (nothing was changed on it)."""
    inventory, kubeconfig, varsfile = lab
    from kubernetes import client, config

    core = client.CoreV1Api(config.new_client_from_config(str(kubeconfig)))
    node = NODES[1]
    core.patch_node(node, {"metadata": {"labels": {"nvidia.com/mig.config": "all-1g.10gb"}}})
    try:
        proc = run_cli("mig", str(inventory), "--kubeconfig", str(kubeconfig), "--limit", node,
                       "--validation-timeout", "10", "-e", f"@{varsfile}", "-o", "json",
                       timeout=1200)  # fmt: skip
        doc = json.loads(proc.stdout)
        assert proc.returncode == doc["exit_code"] == 1, proc.stderr[-3000:]
        result = doc["nodes"][node]
        assert result["config"] == "all-1g.10gb" and result["state"] == "failed", result
        assert "no NVIDIA device" in result["reason"], result
        obj = core.read_node(node)
        assert obj.metadata.labels["nvidia.com/mig.config.state"] == "failed"
        assert not obj.spec.unschedulable
    finally:
        core.patch_node(node, {"metadata": {"labels": {"nvidia.com/mig.config": None,
                                                       "nvidia.com/mig.config.state": None}}})  # fmt: skip


OPERANDS = ("device-plugin", "gpu-feature-discovery", "dcgm-exporter")
STATIC_POD = "/etc/kubernetes/manifests/static-probe.json"


def test_a_rolling_upgrade_drains_a_real_node_and_stops_at_validation(lab, tmp_path):
    """`gpustack upgrade --drain` of the Debian 12 node (535.309 -> 535.261, Debian's archive),
    on the real control plane and kubelets, as `kubectl drain` and NVIDIA's driver manager do it:

    - a pod with an `emptyDir` volume refuses the drain, naming the pod, before the host is
      touched; with --resume --retry-failed --delete-emptydir-data it is evicted;
    - two replicas under a PodDisruptionBudget that allows one eviction at a time leave one
      after the other, each replacement started on the other node by the real scheduler;
    - a static pod (the kubelet's, from /etc/kubernetes/manifests) is skipped: its mirror pod
      stays Running on the node;
    - the node's GPU clients (labelled by hand: install labels no node without a GPU) are paused
      around the driver role: their pods gone first, their labels restored after;
    - the driver changes on the host; validation then waits for allocatable GPUs that a node
      without a GPU never reports, and the node stays cordoned, labelled upgrade-failed, as
      NVIDIA's upgrade controller leaves a node whose validation fails."""
    inventory, kubeconfig, varsfile = lab
    from kubernetes import client, config

    api_client = config.new_client_from_config(str(kubeconfig))
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    policy = client.PolicyV1Api(api_client)
    node, other = NODES
    ns = "upgrade-probe"
    clients = {f"nvidia.com/gpu.deploy.{o}": "true" for o in OPERANDS}
    core.create_namespace({"metadata": {"name": ns}})
    policy.create_namespaced_pod_disruption_budget(ns, {
        "metadata": {"name": "probe"},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "probe"}}},
    })  # fmt: skip

    def deployment(name: str, replicas: int, volumes: list | None = None) -> dict:
        labels = {"app": name}
        return {"metadata": {"name": name}, "spec": {
            "replicas": replicas, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels},
                "spec": {"terminationGracePeriodSeconds": 1, "volumes": volumes or [],
                         "containers": [{"name": name, "image": lab_fixtures.IMAGE_REF,
                                         "imagePullPolicy": "Never",
                                         "command": ["/bin/sh", "-c", "exec sleep 3600"]}]}}}}  # fmt: skip

    def running() -> dict[str, str]:
        pods = core.list_namespaced_pod(ns).items
        return {p.metadata.name: p.spec.node_name for p in pods
                if p.status.phase == "Running" and not p.metadata.deletion_timestamp}  # fmt: skip

    def three(pods: dict[str, str]) -> dict[str, str] | None:
        return pods if len(pods) == 3 else None

    static = {"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": "static-probe", "namespace": "default"},
              "spec": {"containers": [{"name": "probe", "image": lab_fixtures.IMAGE_REF,
                                       "imagePullPolicy": "Never",
                                       "command": ["/bin/sh", "-c", "exec sleep 3600"]}]}}  # fmt: skip
    mirror = f"static-probe-{node}"

    def upgrade(*flags: str) -> dict:
        proc = run_cli("upgrade", str(inventory), "--kubeconfig", str(kubeconfig), "--limit",
                       node, "--driver-version", "535.261.03-1", "--drain", "--drain-timeout",
                       "180", "--validation-timeout", "10", "--yes", "-e", f"@{varsfile}", "-o",
                       "json", *flags, env={"GPUSTACK_STATE_DIR": str(tmp_path)}, timeout=1800)  # fmt: skip
        assert proc.stdout, proc.stderr[-3000:]
        doc = json.loads(proc.stdout)
        assert proc.returncode == doc["exit_code"] == 1, proc.stderr[-3000:]
        return doc

    def driver() -> str:
        return node_command(CONTAINERS[0], "dpkg-query -W -f='${Version}' nvidia-smi")

    try:
        # every workload starts on `node`: the other one is cordoned meanwhile
        core.patch_node(other, {"spec": {"unschedulable": True}})
        apps.create_namespaced_deployment(ns, deployment("probe", 2))
        apps.create_namespaced_deployment(
            ns, deployment("scratch", 1, [{"name": "scratch", "emptyDir": {}}])
        )
        node_command(CONTAINERS[0], f"cat > {STATIC_POD} <<'EOF'\n{json.dumps(static)}\nEOF")
        core.patch_node(node, {"metadata": {"labels": clients}})
        before = wait_until(lambda: three(running()), "the probe and scratch pods Running",
                            timeout=180)  # fmt: skip
        assert set(before.values()) == {node}, before
        wait_until(lambda: core.read_namespaced_pod(mirror, "default").status.phase == "Running",
                   "the static pod's mirror pod Running", timeout=180)  # fmt: skip
        core.patch_node(other, {"spec": {"unschedulable": None}})
        first_driver = driver()

        # 1. refused: the emptyDir pod would lose its data; nothing evicted, the host untouched
        doc = upgrade()
        reason = doc["nodes"][node]["reason"]
        assert "with local storage (emptyDir) would lose its data: upgrade-probe/scratch-" in (
            reason
        ), reason
        assert "--delete-emptydir-data" in reason, reason
        assert running() == before and driver() == first_driver

        # 2. with the flag: drained, clients paused, driver changed, validation fails
        doc = upgrade("--resume", "--retry-failed", "--delete-emptydir-data")
        result = doc["nodes"][node]
        assert result["state"] == "upgrade-failed", result
        assert result["reason"].startswith(
            f"validation: node {node} is Ready with 0 allocatable GPU(s) after 10 s"
        ), result
        assert driver() == "535.261.03-1"  # the driver Debian's archive has at that version
        after = wait_until(lambda: three({k: v for k, v in running().items() if k not in before}),
                           "the replacements Running", timeout=180)  # fmt: skip
        assert set(after.values()) == {other}, after
        # the budget allowed one eviction at a time: both probe pods left, in turn
        assert not set(before) & set(running()), running()
        mirror_pod = core.read_namespaced_pod(mirror, "default")
        assert mirror_pod.status.phase == "Running" and mirror_pod.spec.node_name == node
        # the clients were paused for the driver role and are back
        notes = [t.note for t in FileStateStore(Path(doc["state_file"])).load().history]
        driver_note = next(n for n in notes if "driver role ran" in n)
        assert "paused GPU clients (dcgm-exporter, device-plugin, gpu-feature-discovery)" in (
            driver_note
        ), notes
        assert "resumed GPU clients (3)" in driver_note, notes
        obj = core.read_node(node)
        assert {k: obj.metadata.labels.get(k) for k in clients} == clients
        assert "gpustack.io/driver-upgrade-paused-clients" not in (obj.metadata.annotations or {})
        assert obj.spec.unschedulable is True
        assert obj.metadata.labels["nvidia.com/gpu-driver-upgrade-state"] == "upgrade-failed"
        assert not core.read_node(other).spec.unschedulable
    finally:
        node_command(CONTAINERS[0], f"rm -f {STATIC_POD}")
        core.delete_namespace(ns)
        core.patch_node(other, {"spec": {"unschedulable": None}})
        core.patch_node(node, {"spec": {"unschedulable": None}, "metadata": {
            "labels": {"nvidia.com/gpu-driver-upgrade-state": None, **dict.fromkeys(clients)}}})  # fmt: skip


DRA = ("-e", "gpustack_k8s_gpu_allocation=dra")


def test_dra_on_a_real_kubelet_and_an_upgrade_that_evicts_a_dra_workload(lab, tmp_path):
    """DRA mode end to end on the Debian 13 node's real kubelet and containerd 1.7, with a
    labelled STAND-IN for NVIDIA's DRA kubelet plugin (NVIDIA's module is not served here):
    Kubernetes' own DRA test driver under NVIDIA's driver name with two simulated GPUs, in the
    DaemonSet gpustack renders (operand_images.dra_stand_in_image).

    - the plugin passes its gRPC startup probe, registers with the kubelet and publishes its
      ResourceSlice; install still says "no NVIDIA device" (the host has none);
    - a workload's claim from gpustack's DeviceClass gpu.nvidia.com is allocated by the real
      scheduler, prepared by the kubelet through the plugin, and its CDI spec reaches the
      container through the CDI support install turned on in containerd;
    - a pod bound with spec.nodeName never gets its claim allocated, and the kubelet refuses to
      start it (FailedPrepareDynamicResources);
    - `gpustack upgrade` (GPU pods only, no --drain) evicts that workload as a GPU pod, leaves
      a pod without a claim running, pauses the DRA kubelet plugin (its pod gone) around the
      driver role and resumes it; validation then finds the republished devices and fails at
      its verification pod, which gets a device but has no nvidia-smi (no GPU to give one)."""
    inventory, kubeconfig, varsfile = lab
    from kubernetes import client, config

    api_client = config.new_client_from_config(str(kubeconfig))
    core, apps = client.CoreV1Api(api_client), client.AppsV1Api(api_client)
    custom = client.CustomObjectsApi(api_client)
    node = NODES[1]
    plugin_label = {"nvidia.com/gpu.deploy.dra-driver": "true"}
    ns = "dra-probe"

    def slices() -> list[dict]:
        items = custom.list_cluster_custom_object("resource.k8s.io", "v1", "resourceslices")
        return [s for s in items["items"]
                if s["spec"].get("nodeName") == node and s["spec"]["driver"] == "gpu.nvidia.com"]  # fmt: skip

    def plugin_ready() -> list[str]:
        pods = core.list_namespaced_pod(NAMESPACE, field_selector=f"spec.nodeName={node}").items
        return [p.metadata.name for p in pods if p.metadata.name.startswith("nvidia-dra-driver")
                and not p.metadata.deletion_timestamp and any(
                    c.type == "Ready" and c.status == "True" for c in p.status.conditions or []
                )]  # fmt: skip

    def wait_plugin(what: str) -> None:
        try:
            wait_until(plugin_ready, what, timeout=240)
        except AssertionError as exc:  # say why: the pods' states and the namespace's events
            pods = core.list_namespaced_pod(NAMESPACE, field_selector=f"spec.nodeName={node}")
            events = core.list_namespaced_event(NAMESPACE).items
            raise AssertionError(f"{exc}: {api_client.sanitize_for_serialization(pods.items)} "
                                 f"{[(e.reason, e.message) for e in events[-15:]]}") from None  # fmt: skip

    def deployment(name: str, claim: bool) -> dict:
        labels = {"app": name}
        container = {"name": name, "image": lab_fixtures.IMAGE_REF, "imagePullPolicy": "Never",
                     "command": ["/bin/sh", "-c", "env | grep ^claim_; exec sleep 3600"]}  # fmt: skip
        spec = {"terminationGracePeriodSeconds": 1, "containers": [container],
                "nodeSelector": {"kubernetes.io/hostname": node}}  # fmt: skip
        if claim:
            container["resources"] = {"claims": [{"name": "gpu"}]}
            spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]
        return {"metadata": {"name": name}, "spec": {"replicas": 1, "selector": {
            "matchLabels": labels}, "template": {"metadata": {"labels": labels}, "spec": spec}}}  # fmt: skip

    def running(app: str) -> list[client.V1Pod] | None:
        pods = core.list_namespaced_pod(ns, label_selector=f"app={app}").items
        found = [
            p for p in pods if p.status.phase == "Running" and not p.metadata.deletion_timestamp
        ]
        return found or None

    code, report = install(inventory, kubeconfig, varsfile, *DRA, "--limit", node)
    assert code == report["exit_code"] == 3, report
    checks = {c["name"]: c for c in report["kubernetes"]["nodes"][node]["checks"]}
    assert "no NVIDIA device" in checks["gpus"]["message"], checks
    try:
        core.patch_node(node, {"metadata": {"labels": plugin_label}})  # a user's label
        wait_plugin("the DRA kubelet plugin Ready")
        published = wait_until(slices, "the plugin's ResourceSlice", timeout=120)
        devices = published[0]["spec"]["devices"]
        assert [d["name"] for d in devices] == ["gpu-0", "gpu-1"], devices
        assert devices[0]["attributes"]["productName"]["string"] == (
            "gpustack lab stand-in (no GPU)"
        )

        proc = run_cli("status", str(inventory), "--kubeconfig", str(kubeconfig), "-e",
                       f"@{varsfile}", *DRA, "--limit", node, "-o", "json", timeout=600)  # fmt: skip
        view = json.loads(proc.stdout)["nodes"][node]
        k8s = view["kubernetes"]
        assert k8s["allocator"] == "dra" and k8s["allocatable_gpus"] == 2, k8s  # the stand-in's
        assert k8s["device_plugin_ready"] is True and len(k8s["device_plugin_pods"]) == 1, k8s

        core.create_namespace({"metadata": {"name": ns}})
        custom.create_namespaced_custom_object("resource.k8s.io", "v1", ns,
            "resourceclaimtemplates", {"apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate", "metadata": {"name": "one-gpu"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.nvidia.com"}}]}}}})  # fmt: skip
        apps.create_namespaced_deployment(ns, deployment("dra-workload", claim=True))
        apps.create_namespaced_deployment(ns, deployment("bystander", claim=False))
        workload = wait_until(lambda: running("dra-workload"), "the DRA workload Running",
                              timeout=180)[0]  # fmt: skip
        bystander = wait_until(lambda: running("bystander"), "the bystander Running",
                               timeout=180)[0]  # fmt: skip
        claims = custom.list_namespaced_custom_object("resource.k8s.io", "v1", ns,
                                                      "resourceclaims")["items"]  # fmt: skip
        results = [r for c in claims for r in c["status"]["allocation"]["devices"]["results"]]
        assert [(r["driver"], r["pool"]) for r in results] == [("gpu.nvidia.com", node)], results
        log = core.read_namespaced_pod_log(workload.metadata.name, ns)
        # the test driver's CDI edit: claim_<claim>_<request>=true, through containerd's CDI
        assert log.strip().endswith("_gpu=true") and log.startswith("claim_"), log

        # a pod bound with spec.nodeName bypasses the scheduler, which is what allocates claims:
        # the kubelet never starts it (why gpustack places its DRA verification pods by affinity)
        pinned = {"metadata": {"name": "pinned"}, "spec": {
            "nodeName": node, "resourceClaims": [
                {"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
            "containers": [{"name": "c", "image": lab_fixtures.IMAGE_REF,
                            "imagePullPolicy": "Never", "command": ["/bin/sh", "-c", "exit 0"],
                            "resources": {"claims": [{"name": "gpu"}]}}]}}  # fmt: skip
        core.create_namespaced_pod(ns, pinned)

        def refused() -> list[str]:
            events = core.list_namespaced_event(ns, field_selector="involvedObject.name=pinned")
            return [e.message for e in events.items
                    if e.reason == "FailedPrepareDynamicResources"]  # fmt: skip

        assert wait_until(refused, "the kubelet's refusal of the pinned pod", timeout=90)
        assert core.read_namespaced_pod("pinned", ns).status.phase == "Pending"
        claims = custom.list_namespaced_custom_object("resource.k8s.io", "v1", ns,
                                                      "resourceclaims")["items"]  # fmt: skip
        owned = [c for c in claims if c["metadata"]["ownerReferences"][0]["name"] == "pinned"]
        assert len(owned) == 1 and "allocation" not in owned[0].get("status", {}), owned
        core.delete_namespaced_pod("pinned", ns, grace_period_seconds=0)

        installed = node_command(CONTAINERS[1], "dpkg-query -W -f='${Version}' nvidia-smi")
        proc = run_cli("upgrade", str(inventory), "--kubeconfig", str(kubeconfig), "--limit",
                       node, "--driver-version", installed, "--validation-timeout", "30",
                       "--yes", "-e", f"@{varsfile}", *DRA, "-o", "json",
                       env={"GPUSTACK_STATE_DIR": str(tmp_path)}, timeout=1800)  # fmt: skip
        assert proc.stdout, proc.stderr[-3000:]
        doc = json.loads(proc.stdout)
        assert proc.returncode == doc["exit_code"] == 1, proc.stderr[-3000:]
        result = doc["nodes"][node]
        assert result["state"] == "upgrade-failed", result
        assert result["reason"].startswith(f"validation: verification pod on {node}"), result
        notes = [t.note for t in FileStateStore(Path(doc["state_file"])).load().history]
        assert any("evicted 1 GPU pod(s)" in n for n in notes), notes
        driver_note = next(n for n in notes if "driver role ran" in n)
        assert "paused GPU clients (dra-driver)" in driver_note, notes
        assert "resumed GPU clients (1)" in driver_note, notes
        # the workload left, the pod without a claim stayed; the plugin is back
        assert [p.metadata.name for p in running("bystander")] == [bystander.metadata.name]
        assert not any(p.metadata.name == workload.metadata.name
                       for p in core.list_namespaced_pod(ns).items)  # fmt: skip
        assert core.read_node(node).metadata.labels["nvidia.com/gpu.deploy.dra-driver"] == "true"
        wait_plugin("the DRA kubelet plugin Ready again")
    finally:
        if core.list_namespace(field_selector=f"metadata.name={ns}").items:
            core.delete_namespace(ns)
        core.patch_node(node, {"spec": {"unschedulable": None}, "metadata": {"labels": {
            "nvidia.com/gpu-driver-upgrade-state": None, **dict.fromkeys(plugin_label)}}})  # fmt: skip
        install(inventory, kubeconfig, varsfile, "--limit", node)  # the device plugin again


def node_command(container: str, command: str) -> str:
    proc = subprocess.run(["podman", "exec", container, "sh", "-c", command], capture_output=True,
                          text=True, timeout=120)  # fmt: skip
    return proc.stdout.strip()


def test_uninstall_removes_gpustacks_objects(lab):
    inventory, kubeconfig, _ = lab
    proc = run_cli("uninstall", str(inventory), "--components", "k8s", "--kubeconfig",
                   str(kubeconfig), "--yes", timeout=1200)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from kubernetes import client, config

    api = config.new_client_from_config(str(kubeconfig))
    names = [rc.metadata.name for rc in client.NodeV1Api(api).list_runtime_class().items]
    assert "nvidia" not in names
    namespace = (
        client.CoreV1Api(api).list_namespace(field_selector="metadata.name=gpustack-system").items
    )
    assert not namespace or namespace[0].status.phase == "Terminating"
