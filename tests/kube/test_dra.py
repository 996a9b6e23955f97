"""gpustack_k8s_gpu_allocation=dra against a real control plane.

Real here: kube-apiserver 1.36 serving and validating `resource.k8s.io/v1` (DeviceClass,
ResourceClaim, ResourceClaimTemplate, ResourceSlice; CEL selectors compiled by the API server),
RBAC, kube-controller-manager's DaemonSet, resourceclaim and garbage collector controllers, and
kube-scheduler's DynamicResources plugin, which allocates claims against ResourceSlices by
evaluating gpustack's DeviceClass CEL selectors itself.

STAND-INS:
  - Nodes are kwok's (tests/kube/conftest.py): kwok plays the kubelet, so a pod bound to a node
    goes Running and Ready whatever it asks for. kwok runs no DRA kubelet plugin and no
    NodePrepareResources: no CDI device reaches any container, and the kubelet's refusal of a
    pod whose claim is not allocated and reserved for it is not had here.
  - The ResourceSlices are written by the test (`publish`), shaped like those NVIDIA's GPU
    kubelet plugin publishes (NVIDIA/k8s-dra-driver-gpu cmd/gpu-kubelet-plugin/deviceinfo.go
    @03af824603ff1b1c3c3193cb25cc584690f4785c `GetDevice`: devices `gpu-<minor>` and
    `gpu-<minor>-mig-<profile id>-<start>-<size>`, attributes type, uuid, parentUUID, profile,
    productName, driverVersion..., capacity memory), through the
    k8s.io/dynamic-resource-allocation helper's naming (`<node>-gpu.nvidia.com-`, pool = node,
    owned by the Node). They are written with the identity the plugin runs as (gpustack's
    ServiceAccount for it), so gpustack's ClusterRole must grant what publishing takes. No GPU is involved: the devices are what the test writes.
  - Verification pods: nothing runs `nvidia-smi -L`. When the scheduler has allocated the claim
    and kwok has the pod Running, the test records what the scheduler allocated, has kwok serve
    the listing a container given that device would print (its GPU's line, and the MIG device's)
    as the pod's log, and writes the pod's status as a kubelet would when the container exits 0
    (`VerifyPodExits`). gpustack then judges that listing against the host and the slices.

A cluster without resource.k8s.io/v1 is a second control plane, in test_dra_without_api.py
(`--runtime-config=resource.k8s.io/v1=false`; why it also runs without the Node authorizer and
with kube-scheduler emulating 1.33 is there). Elsewhere: the kubelet's refusal of a pod whose
claim was never allocated, and a claim prepared through CDI, run on a real kubelet in the lab
(tests/lab/test_real_cluster.py, with Kubernetes' DRA test driver standing in for NVIDIA's
kubelet plugin). Not covered: NVIDIA's DRA kubelet plugin image itself (not reachable here), so
its exit without a driver is only a crash-looping pod that a stand-in kubelet reports (below).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from kubernetes.client.exceptions import ApiException

from gpustack.fleet.status import kubernetes_drift
from gpustack.k8s.cluster import apply, flow
from gpustack.k8s.cluster import status as cluster_status
from gpustack.k8s.cluster.connect import connect
from gpustack.k8s.cluster.upgrade import KubernetesBackend
from gpustack.k8s.manifests import DRA_DRIVER, DRA_SERVICE_ACCOUNT, ClusterConfig, render
from gpustack.upgrade.backend import StepOptions
from gpustack.upgrade.executors import ThreadExecutor
from gpustack.upgrade.orchestrator import Orchestrator, RolloutPolicy
from gpustack.upgrade.planner import Limits
from gpustack.upgrade.session import open_run
from gpustack.upgrade.state import MemoryStateStore, Target
from tests.builders import gpu_facts, inventory, run_result, smi_output, uuids_for
from tests.conftest import wait_until
from tests.kube.stand_ins import Outcome, end_verification_pod, kwok_node
from tests.kube.test_operands_per_node import crash_looping_plugin
from tests.kube.test_verify_flow import StandInKubelet
from tests.upgrade_doubles import NEW, FakeHostUpgrader

pytestmark = pytest.mark.kube

RES = "/apis/resource.k8s.io/v1"
JSON = "application/json"
MERGE = "application/merge-patch+json"
PLUGIN_DS = "nvidia-dra-driver-gpu-kubelet-plugin"
PLUGIN_APP = "nvidia-dra-driver-gpu"  # its pods' app.kubernetes.io/name
# short waits: kwok and the controllers act within a second or two
FAST = {"gpustack_k8s_daemonset_timeout": 30, "gpustack_k8s_capacity_timeout": 10,
        "gpustack_k8s_verify_timeout": 20}  # fmt: skip


# -- stand-ins -----------------------------------------------------------------------------


def gpu_device(minor: int, uuid: str) -> dict:
    """A whole GPU as GpuInfo.GetDevice publishes it (a subset of its attributes)."""
    return {"name": f"gpu-{minor}",
            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": uuid},
                           "productName": {"string": "NVIDIA A100-SXM4-80GB"},
                           "brand": {"string": "Nvidia"}, "architecture": {"string": "Ampere"},
                           "cudaComputeCapability": {"version": "8.0.0"},
                           "driverVersion": {"version": "580.95.5"}},
            "capacity": {"memory": {"value": "80Gi"}}}  # fmt: skip


def mig_device(minor: int, parent: str, index: int) -> dict:
    """A 3g.40gb MIG device of an A100 80GB (GPU instance profile 2, placements 0+4 and 4+4)
    as MigDeviceInfo.GetDevice publishes it (a subset)."""
    start = 4 * index
    return {"name": f"gpu-{minor}-mig-2-{start}-4",
            "attributes": {"type": {"string": "mig"},
                           "uuid": {"string": f"MIG-{parent[4:12]}-0000-0000-0000-{index:012d}"},
                           "parentUUID": {"string": parent}, "profile": {"string": "3g.40gb"},
                           "productName": {"string": "NVIDIA A100-SXM4-80GB"}},
            "capacity": {"memory": {"value": "40Gi"}, "multiprocessors": {"value": "42"}}}  # fmt: skip


def publish(plugin, node: dict, devices: list[dict]) -> dict:
    """What the DRA kubelet plugin's slice controller writes for a node: one slice, pool named
    after the node, owned by the Node (`plugin`: a client with the plugin's identity)."""
    name = node["metadata"]["name"]
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"generateName": f"{name}-{DRA_DRIVER}-",
                         "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name,
                                              "uid": node["metadata"]["uid"], "controller": True}]},
            "spec": {"driver": DRA_DRIVER, "nodeName": name,
                     "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                     "devices": devices}}  # fmt: skip
    return plugin.raw("POST", f"{RES}/resourceslices", body=body, ctype=JSON)


class _Poller:
    """A background loop (`step` every 0.2 s) for the duration of a `with` block."""

    def __enter__(self):
        self._stop = threading.Event()
        self.errors: list[BaseException] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(10)
        if self.errors and exc[0] is None:
            raise self.errors[0]

    def _run(self):
        while not self._stop.is_set():
            try:
                self.step()
            except Exception as error:  # reported when the block ends
                self.errors.append(error)
                return
            self._stop.wait(0.2)


class PluginPublishes(_Poller):
    """STAND-IN for NVIDIA's GPU kubelet plugin: when gpustack's DRA kubelet plugin pod runs on
    a node (kwok made it Ready), the node's devices are published with the plugin's identity;
    when no plugin pod is left there, its slice is deleted (the kubelet's job on a real node when
    a plugin unregisters; here the stand-in's)."""

    def __init__(self, cluster, plugin, namespace: str, devices: dict[str, list[dict]]):
        self.cluster, self.plugin, self.namespace, self.devices = (
            cluster,
            plugin,
            namespace,
            devices,
        )
        self.published: dict[str, str] = {}  # node -> slice name

    def step(self):
        pods = self.cluster.raw(
            "GET",
            f"/api/v1/namespaces/{self.namespace}/pods",
            [("labelSelector", "app.kubernetes.io/name=nvidia-dra-driver-gpu")],
        )
        running = {p["spec"].get("nodeName") for p in pods["items"]
                   if p["status"].get("phase") == "Running"
                   and not p["metadata"].get("deletionTimestamp")}  # fmt: skip
        for node, devices in self.devices.items():
            if node in running and node not in self.published:
                body = self.cluster.raw("GET", f"/api/v1/nodes/{node}")
                self.published[node] = publish(self.plugin, body, devices)["metadata"]["name"]
            elif node not in running and node in self.published:
                self.plugin.raw("DELETE", f"{RES}/resourceslices/{self.published.pop(node)}")


class VerifyPodExits(_Poller):
    """STAND-IN for the verification container: once a gpustack verification pod is Running
    (the scheduler allocated its claim, kwok started it), record its claim, and end the pod as
    `nvidia-smi -L` would in a container given the allocated device: its GPU's line (and the
    MIG device's under it), served as the pod's log by kwok, exit 0 (`end_verification_pod`).
    What a device the test publishes lists is the test's: no GPU is involved."""

    def __init__(self, cluster, namespace: str, directory: Path, without_claim=None):
        self.cluster, self.namespace, self.directory = cluster, namespace, directory
        self.without_claim = without_claim or {}  # node -> the listing of a pod without a claim
        self.claims: dict[str, dict] = {}  # pod name -> its ResourceClaim while it ran
        self.nodes: dict[str, str] = {}  # pod name -> node
        self.specs: dict[str, dict] = {}  # pod name -> its spec

    def step(self):
        pods = self.cluster.raw("GET", f"/api/v1/namespaces/{self.namespace}/pods",
                                [("labelSelector", "gpustack.io/verify=true")])["items"]  # fmt: skip
        for pod in pods:
            name = pod["metadata"]["name"]
            if pod["status"].get("phase") != "Running" or name in self.claims:
                continue
            statuses = pod["status"].get("resourceClaimStatuses") or []
            claim = self.cluster.raw(
                "GET", f"{RES}/namespaces/{self.namespace}/resourceclaims/"
                f"{statuses[0]['resourceClaimName']}") if statuses else {}  # fmt: skip
            self.claims[name] = claim
            self.nodes[name] = pod["spec"].get("nodeName", "")
            self.specs[name] = pod["spec"]
            node = self.nodes[name]
            listing = (
                smi_listing(self.cluster, claim) if claim else self.without_claim.get(node, "")
            )
            end_verification_pod(self.cluster, self.directory, pod, Outcome(listing))


def smi_listing(cluster, claim: dict) -> str:
    """`nvidia-smi -L` in a container given the claim's allocated device (as the published
    device's attributes say): the GPU's line, and for a MIG device its line under the GPU's."""
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    slices = items(cluster, f"{RES}/resourceslices")
    device = next(d for s in slices if s["spec"]["pool"]["name"] == result["pool"]
                  for d in s["spec"]["devices"] if d["name"] == result["device"])  # fmt: skip
    attrs = {k: next(iter(v.values())) for k, v in device["attributes"].items()}
    product = attrs.get("productName", "NVIDIA GPU")
    if attrs["type"] == "mig":
        return (f"GPU 0: {product} (UUID: {attrs['parentUUID']})\n"
                f"  MIG {attrs['profile']} Device 0: (UUID: {attrs['uuid']})\n")  # fmt: skip
    return f"GPU 0: {product} (UUID: {attrs['uuid']})\n"


@pytest.fixture
def plugin(kubeconfig, unique):
    """A client with the identity the DRA kubelet plugin runs as in namespace gs-dra-UNIQUE:
    its ServiceAccount, as RBAC sees a ServiceAccount token (the admin impersonates it)."""
    c = connect(str(kubeconfig))
    user = f"system:serviceaccount:gs-dra-{unique}:{DRA_SERVICE_ACCOUNT}"
    c.api.set_default_header("Impersonate-User", user)
    c.api.set_default_header("Impersonate-Group", "system:serviceaccounts")
    yield c
    c.close()


def session_for(kubeconfig, unique, hosts, extravars=None):
    extravars = {"gpustack_k8s_gpu_allocation": "dra"} if extravars is None else extravars
    extravars = {"gpustack_k8s_namespace": f"gs-dra-{unique}", **FAST, **extravars}
    return flow.prepare(str(kubeconfig), inventory(kubeconfig.parent, hosts), extravars)


def gpu_nodes(cluster, hosts: dict[str, int], device_plugin_too=False):
    """kwok nodes named like the hosts; -> (host facts, host -> the devices the plugin would
    publish: its GPUs, whole)."""
    devices = {}
    for host, count in hosts.items():
        kwok_node(cluster, host, gpus=count if device_plugin_too else 0)
        devices[host] = [gpu_device(i, u) for i, u in enumerate(uuids_for(host, count))]
    return {h: gpu_facts(h, n) for h, n in hosts.items()}, devices


def dra_install(cluster, plugin, kubeconfig, unique, hosts, devices=None):
    """gpustack's DRA install with the stand-ins running; -> (report, VerifyPodExits)."""
    facts, published = gpu_nodes(cluster, hosts)
    session = session_for(kubeconfig, unique, list(hosts))
    ns = session.config.namespace
    with PluginPublishes(cluster, plugin, ns, devices or published), \
            VerifyPodExits(cluster, ns, kubeconfig.parent) as pods:  # fmt: skip
        report = flow.install(session, run_result(facts))
    return report, pods


def checks(node) -> dict[str, str]:
    return {c.name: c.status for c in node.checks}


def items(cluster, path: str) -> list[dict]:
    return cluster.raw("GET", path)["items"]


def managed(objects: list[dict]) -> list[dict]:
    return [o for o in objects
            if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "gpustack"]  # fmt: skip


def test_dra_install_publishes_devices_and_the_scheduler_allocates_each_nodes_claim(
    cluster, plugin, kubeconfig, unique, kube
):
    hosts = {f"gpu1-{unique}": 2, f"gpu2-{unique}": 1}
    mark = kube.audit_mark()

    report, pods = dra_install(cluster, plugin, kubeconfig, unique, hosts)

    ns = f"gs-dra-{unique}"
    slices = {s["spec"]["nodeName"]: s for s in items(cluster, f"{RES}/resourceslices")}
    for node in report.nodes:
        assert [c.name for c in node.checks] == ["node", "gpus", "operands", "devices", "pod",
                                                 "gfd"]  # fmt: skip
        assert node.check("gfd").status == "skipped"  # no NFD on this control plane
        assert checks(node)["devices"] == "passed", node.to_dict()
        # the pod ran (kwok) and listed the device the scheduler allocated (stand-in output)
        pod = node.check("pod")
        assert pod.status == "passed", pod.message
        assert "one of the devices gpu.nvidia.com publishes" in pod.message, pod.message
        published = [
            d["attributes"]["uuid"]["string"] for d in slices[node.node]["spec"]["devices"]
        ]
        assert published == uuids_for(node.host, hosts[node.host])
    applied = {(a.kind, a.name) for a in report.applied}
    assert ("DeviceClass", "gpu.nvidia.com") in applied
    assert ("DaemonSet", PLUGIN_DS) in applied
    assert ("DaemonSet", "nvidia-device-plugin") not in applied
    daemonsets = [
        d["metadata"]["name"] for d in items(cluster, f"/apis/apps/v1/namespaces/{ns}/daemonsets")
    ]
    assert PLUGIN_DS in daemonsets and "nvidia-device-plugin" not in daemonsets
    labels = cluster.raw("GET", f"/api/v1/nodes/gpu1-{unique}")["metadata"]["labels"]
    assert labels["nvidia.com/gpu.deploy.dra-driver"] == "true"
    assert "nvidia.com/gpu.deploy.device-plugin" not in labels
    # Each verification pod's claim came from gpustack's template (the resourceclaim
    # controller) and was allocated by kube-scheduler (so the pod went through the scheduler:
    # a pod bound by nodeName never gets an allocation, see below), evaluating gpustack's DeviceClass CEL
    # against the node's slice: one device of that node, reserved for that pod.
    assert sorted(pods.nodes.values()) == sorted(hosts)
    for pod, claim in pods.claims.items():
        node = pods.nodes[pod]
        assert (
            claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
            == "gpu.nvidia.com"
        )
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert (result["driver"], result["pool"]) == (DRA_DRIVER, node)
        assert result["device"] in {d["name"] for d in slices[node]["spec"]["devices"]}
        assert [r["name"] for r in claim["status"]["reservedFor"]] == [pod]
        assert "runtimeClassName" not in pods.specs[pod]
    # cleaned up: pods, their generated claims (the garbage collector), the template
    wait_until(lambda: not items(cluster, f"/api/v1/namespaces/{ns}/pods?labelSelector=gpustack.io%2Fverify%3Dtrue")
               and not items(cluster, f"{RES}/namespaces/{ns}/resourceclaims"),
               what="verification pods and their claims gone", timeout=20)  # fmt: skip
    assert items(cluster, f"{RES}/namespaces/{ns}/resourceclaimtemplates") == []
    posted = [e for e in kube.audit_events(mark) if e["verb"] == "create"
              and e["objectRef"].get("resource") == "resourceclaimtemplates"]  # fmt: skip
    assert len(posted) == 1 and posted[0]["responseStatus"]["code"] == 201


def test_a_node_whose_gpus_are_all_claimed_is_skipped_not_disturbed(
    cluster, plugin, kubeconfig, unique
):
    host = f"gpu1-{unique}"
    ns = f"work-{unique}"
    facts, devices = gpu_nodes(cluster, {host: 1})
    session = session_for(kubeconfig, unique, [host])
    with PluginPublishes(cluster, plugin, session.config.namespace, devices), \
            VerifyPodExits(cluster, session.config.namespace, kubeconfig.parent):  # fmt: skip
        report = flow.install(session, run_result(facts))
        assert checks(report.nodes[0])["devices"] == "passed", report.to_dict()
        namespace(cluster, ns)
        claim_template(cluster, ns, "one-gpu")
        # keeps running: holds the node's only GPU
        train = workload("train", "one-gpu", on=host)
        cluster.raw("POST", f"/api/v1/namespaces/{ns}/pods", body=train, ctype=JSON)
        wait_until(lambda: phase(cluster, ns, "train") == "Running", what="train Running",
                   timeout=20)  # fmt: skip
        (claim,) = items(cluster, f"{RES}/namespaces/{ns}/resourceclaims")
        assert claim["status"]["allocation"]["devices"]["results"][0]["pool"] == host

        report = flow.verify_cluster(session_for(kubeconfig, unique, [host]), run_result(facts))

    pod = report.nodes[0].check("pod")
    assert pod.status == "skipped", pod.message
    assert f"{ns}/{claim['metadata']['name']}" in pod.message
    assert phase(cluster, ns, "train") == "Running"
    assert items(cluster, f"/api/v1/namespaces/{session.config.namespace}/pods?labelSelector="
                          "gpustack.io%2Fverify%3Dtrue") == []  # fmt: skip


def test_an_all_mig_node_is_verified_with_a_mig_device(cluster, plugin, kubeconfig, unique):
    """A GPU in MIG mode is published as its MIG devices; the pod asks mig.nvidia.com then, and
    the scheduler's CEL evaluation of gpustack's mig.nvidia.com class picks one of them."""
    host = f"gpu1-{unique}"
    parent = uuids_for(host, 1)[0]
    migs = [mig_device(0, parent, 0), mig_device(0, parent, 1)]

    report, pods = dra_install(cluster, plugin, kubeconfig, unique, {host: 1}, {host: migs})

    node = report.nodes[0]
    assert node.check("devices").status == "passed" and "2 mig" in node.check("devices").message
    pod = node.check("pod")
    assert pod.status == "passed" and "(mig.nvidia.com)" in pod.message, pod.message
    (claim,) = pods.claims.values()
    assert claim["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == "mig.nvidia.com"
    (result,) = claim["status"]["allocation"]["devices"]["results"]
    assert result["device"] in {m["name"] for m in migs} and result["pool"] == host


def test_a_gpu_in_mig_mode_without_mig_devices_fails_the_devices_check(
    cluster, plugin, kubeconfig, unique
):
    host = f"gpu1-{unique}"
    uuids = uuids_for(host, 2)
    # GPU 1: MIG on, nothing configured: the plugin publishes neither it nor a MIG device
    report, pods = dra_install(cluster, plugin, kubeconfig, unique, {host: 2},
                               {host: [gpu_device(0, uuids[0])]})  # fmt: skip

    devices = report.nodes[0].check("devices")
    assert devices.status == "failed", devices.message
    assert "expected all 2 GPU(s)" in devices.message and "list 1 gpu" in devices.message
    assert pods.claims == {}


def test_switching_back_to_the_device_plugin_removes_the_dra_kubelet_plugin(
    cluster, plugin, kubeconfig, unique
):
    host = f"gpu1-{unique}"
    facts, devices = gpu_nodes(cluster, {host: 1}, device_plugin_too=True)
    ns = f"gs-dra-{unique}"
    # the device plugin's pod asks one nvidia.com/gpu and would be given one of the host's
    whole = {host: smi_output(uuids_for(host, 1))}
    with PluginPublishes(cluster, plugin, ns, devices), \
            VerifyPodExits(cluster, ns, kubeconfig.parent, whole):  # fmt: skip
        first = flow.install(session_for(kubeconfig, unique, [host]), run_result(facts))
        assert checks(first.nodes[0])["devices"] == "passed", first.to_dict()

        report = flow.install(session_for(kubeconfig, unique, [host], {}), run_result(facts))

    assert sorted(report.removed) == [f"DaemonSet {ns}/{PLUGIN_DS}",
                                      f"ServiceAccount {ns}/{DRA_SERVICE_ACCOUNT}"]  # fmt: skip
    daemonsets = [
        d["metadata"]["name"] for d in items(cluster, f"/apis/apps/v1/namespaces/{ns}/daemonsets")
    ]
    assert PLUGIN_DS not in daemonsets and "nvidia-device-plugin" in daemonsets
    labels = cluster.raw("GET", f"/api/v1/nodes/{host}")["metadata"]["labels"]
    assert "nvidia.com/gpu.deploy.dra-driver" not in labels
    assert labels["nvidia.com/gpu.deploy.device-plugin"] == "true"
    # the plugin's pods go with their DaemonSet (the garbage collector), and with them the
    # node's slice (on a real node the kubelet drops it when the plugin unregisters)
    wait_until(lambda: not items(cluster, f"/api/v1/namespaces/{ns}/pods?labelSelector="
                                          "app.kubernetes.io%2Fname%3Dnvidia-dra-driver-gpu"),
               what="the DRA kubelet plugin's pods gone", timeout=20)  # fmt: skip
    # `capacity` read the allocatable the test wrote for the device plugin (a stand-in)
    node = report.nodes[0]
    assert node.check("capacity").status == "passed"
    assert [c.name for c in node.checks if c.status != "passed"] == ["gfd"], node.to_dict()
    assert node.check("gfd").status == "skipped"  # no NFD on this control plane


def test_uninstall_after_switching_back_removes_what_the_dra_setting_left(
    cluster, plugin, kubeconfig, unique
):
    """The DRA driver's DeviceClasses and RBAC outlive a switch back to the device plugin (they
    hold no GPU); uninstall under the device-plugin setting deletes them too."""
    host = f"gpu1-{unique}"
    facts, devices = gpu_nodes(cluster, {host: 1}, device_plugin_too=True)
    ns = f"gs-dra-{unique}"
    # the device plugin's pod asks one nvidia.com/gpu and would be given one of the host's
    whole = {host: smi_output(uuids_for(host, 1))}
    with PluginPublishes(cluster, plugin, ns, devices), \
            VerifyPodExits(cluster, ns, kubeconfig.parent, whole):  # fmt: skip
        flow.install(session_for(kubeconfig, unique, [host]), run_result(facts))
        flow.install(session_for(kubeconfig, unique, [host], {}), run_result(facts))
    assert managed(items(cluster, f"{RES}/deviceclasses"))  # left by the switch

    result = flow.uninstall(session_for(kubeconfig, unique, [host], {}))

    assert "DeviceClass gpu.nvidia.com" in result["deleted"]
    assert f"DaemonSet {ns}/nvidia-device-plugin" in result["deleted"]
    assert managed(items(cluster, f"{RES}/deviceclasses")) == []
    assert managed(items(cluster, "/apis/rbac.authorization.k8s.io/v1/clusterroles")) == []


def test_uninstall_removes_the_dra_objects_and_the_plugin_pods_go(
    cluster, plugin, kubeconfig, unique
):
    host = f"gpu1-{unique}"
    ns = f"gs-dra-{unique}"
    report, _ = dra_install(cluster, plugin, kubeconfig, unique, {host: 1})
    assert checks(report.nodes[0])["devices"] == "passed"

    result = flow.uninstall(session_for(kubeconfig, unique, [host]))

    assert "DeviceClass gpu.nvidia.com" in result["deleted"]
    assert "ClusterRole gpustack-nvidia-dra-driver-gpu-kubeletplugin" in result["deleted"]
    assert managed(items(cluster, f"{RES}/deviceclasses")) == []
    assert managed(items(cluster, "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings")) == []
    labels = cluster.raw("GET", f"/api/v1/nodes/{host}")["metadata"]["labels"]
    assert "nvidia.com/gpu.deploy.dra-driver" not in labels
    wait_until(lambda: not items(cluster, f"/api/v1/namespaces/{ns}/pods"),
               what="the DRA kubelet plugin's pods gone", timeout=20)  # fmt: skip
    # without its RBAC the plugin could publish no slice any more
    with pytest.raises(ApiException) as caught:
        publish(plugin, cluster.raw("GET", f"/api/v1/nodes/{host}"), [])
    assert caught.value.status == 403


def test_check_mode_applies_nothing_but_validates_the_dra_objects(cluster, kubeconfig, unique):
    host = f"gpu1-{unique}"
    facts, _ = gpu_nodes(cluster, {host: 1})
    for old in managed(items(cluster, f"{RES}/deviceclasses")):  # an earlier test's, if any
        cluster.raw("DELETE", f"{RES}/deviceclasses/{old['metadata']['name']}")

    report = flow.install(session_for(kubeconfig, unique, [host]), run_result(facts), check=True)

    actions = {(a.kind, a.name): a.action for a in report.applied}
    assert actions[("DeviceClass", "gpu.nvidia.com")] == "would create"
    assert managed(items(cluster, f"{RES}/deviceclasses")) == []
    names = [n["metadata"]["name"] for n in items(cluster, "/api/v1/namespaces")]
    assert f"gs-dra-{unique}" not in names


def test_status_reads_the_dra_plugin_and_resource_slices_not_the_device_plugin(
    cluster, plugin, kubeconfig, unique
):
    host = f"gpu1-{unique}"
    ns = f"gs-dra-{unique}"
    report, _ = dra_install(cluster, plugin, kubeconfig, unique, {host: 2})
    assert checks(report.nodes[0])["devices"] == "passed"

    view = cluster_status.read_nodes(session_for(kubeconfig, unique, [host]))[host]

    assert view["allocator"] == "dra" and view["allocatable_gpus"] == 2
    assert view["device_plugin_ready"] is True
    assert view["device_plugin_pods"][0].startswith(f"{PLUGIN_DS}-")
    assert kubernetes_drift(2, view) == []
    # The plugin stops (driver unloaded): its slice goes (STAND-IN: deleted here, as the
    # kubelet would) and its container crash-loops (STAND-IN: the status a kubelet reports).
    (slice_,) = [
        s for s in items(cluster, f"{RES}/resourceslices") if s["spec"]["nodeName"] == host
    ]
    plugin.raw("DELETE", f"{RES}/resourceslices/{slice_['metadata']['name']}")
    crash_loop(cluster, ns, view["device_plugin_pods"][0])
    view = cluster_status.read_nodes(session_for(kubeconfig, unique, [host]))[host]
    assert kubernetes_drift(2, view) == [
        "no GPU in the node's ResourceSlices (DRA driver gpu.nvidia.com)",
        "DRA kubelet plugin pod not ready on the Kubernetes node",
    ]


def test_a_node_whose_dra_plugin_crash_loops_fails_the_operands_check_by_name(
    cluster, kubeconfig, unique
):
    """NVIDIA's DRA kubelet plugin exits at start on a node without a loaded driver and keeps
    restarting. STAND-IN: that node's kubelet is `StandInKubelet` (kwok would write its own
    Ready status over the pod's), reporting the plugin's container in CrashLoopBackOff and
    gpustack's other pods running; the container's exit itself is not had here (no driver, no
    image is run). gpustack must fail the node's operands check naming the plugin's DaemonSet,
    and nothing publishes a slice for the node."""
    host = f"gpu1-{unique}"
    facts = {host: gpu_facts(host, 1)}
    session = session_for(kubeconfig, unique, [host], {"gpustack_k8s_gpu_allocation": "dra",
                                                       "gpustack_k8s_daemonset_timeout": 15})  # fmt: skip

    with StandInKubelet(cluster, host, 0, lambda pod: crash_looping_plugin(pod, PLUGIN_APP)):
        report = flow.install(session, run_result(facts))

    assert not report.passed
    operands = report.nodes[0].check("operands")
    assert operands.status == "failed", operands.message
    assert PLUGIN_DS in operands.message and "CrashLoopBackOff" in operands.message
    assert [s for s in items(cluster, f"{RES}/resourceslices")
            if s["spec"]["nodeName"] == host] == []  # fmt: skip


# -- resource.k8s.io/v1 as kube-apiserver, the resourceclaim controller and kube-scheduler
# -- serve it, where gpustack relies on it -------------------------------------------------


def namespace(cluster, name: str) -> None:
    cluster.raw("POST", "/api/v1/namespaces", body={"metadata": {"name": name}}, ctype=JSON)


def phase(cluster, ns: str, name: str) -> str:
    return cluster.raw("GET", f"/api/v1/namespaces/{ns}/pods/{name}")["status"].get("phase", "")


def crash_loop(cluster, ns: str, pod: str) -> None:
    """What a kubelet reports for a container that keeps exiting: Running, not Ready."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cluster.raw("PATCH", f"/api/v1/namespaces/{ns}/pods/{pod}/status", ctype=MERGE, body={
        "status": {"conditions": [{"type": "Ready", "status": "False", "lastTransitionTime": now,
                                   "reason": "ContainersNotReady"}],
                   "containerStatuses": [{"name": "gpus", "ready": False, "restartCount": 3,
                                          "image": "x", "imageID": "",
                                          "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}})  # fmt: skip


def claim_template(cluster, ns, name, request=None):
    request = request or {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"spec": {"devices": {"requests": [request]}}}}  # fmt: skip
    return cluster.raw("POST", f"{RES}/namespaces/{ns}/resourceclaimtemplates", body=body,
                       ctype=JSON)  # fmt: skip


def workload(name, template, node_name=None, on=None):
    """A pod with one claim from `template`; bound to `node_name`, or scheduled `on` that node
    (other tests' nodes on the shared control plane publish devices too)."""
    spec = {
        "restartPolicy": "Never",
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        "containers": [{"name": "c", "image": "example/train:1",
                        "resources": {"claims": [{"name": "gpu"}]}}],
    }  # fmt: skip
    if node_name:
        spec["nodeName"] = node_name
    if on:
        spec["nodeSelector"] = {"kubernetes.io/hostname": on}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


@pytest.fixture
def device_classes(cluster):
    """gpustack's DeviceClasses, as rendered and applied by gpustack."""
    objects = [o for o in render(ClusterConfig(gpu_allocation="dra")) if o["kind"] == "DeviceClass"]
    apply.apply_objects(cluster, objects)


def refused(call) -> tuple[int, str]:
    """The API server's status code and message for a request it refuses."""
    with pytest.raises(ApiException) as caught:
        call()
    return caught.value.status, json.loads(caught.value.body)["message"]


@pytest.mark.parametrize(
    ("request_", "expected"),
    [
        ({"name": "gpu", "exactly": {}}, "exactly.deviceClassName: Required value"),
        ({"name": "gpu"}, "exactly one of `exactly` or `firstAvailable` is required"),
        (
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"},
             "firstAvailable": [{"name": "a", "deviceClassName": "gpu.nvidia.com"}]},
            "but multiple fields are set",
        ),
        ({"name": "GPU", "exactly": {"deviceClassName": "gpu.nvidia.com"}}, "a lowercase RFC 1123 label must consist of"),
        (
            # (count 0 is not refused: it is the unset value, defaulted to 1; see below)
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": -1}},
            "must be greater than zero",
        ),
        # the v1beta1 shape (deviceClassName directly on the request) is not v1
        ({"name": "gpu", "deviceClassName": "gpu.nvidia.com"}, "is required"),
    ],
)  # fmt: skip
def test_invalid_claim_templates_are_refused_with_422(cluster, unique, request_, expected):
    ns = f"bad-{unique}"
    namespace(cluster, ns)
    code, message = refused(lambda: claim_template(cluster, ns, "bad", request_))
    assert code == 422 and expected in message, message


def test_claim_template_defaults_and_immutable_spec(cluster, unique):
    ns = f"tpl-{unique}"
    namespace(cluster, ns)
    created = claim_template(cluster, ns, "one-gpu")
    exact = created["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert (exact["allocationMode"], exact["count"]) == ("ExactCount", 1)
    # count 0 is the unset value of v1's int64 `count`: defaulted, not refused
    zero = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 0}}
    created = claim_template(cluster, ns, "zero", zero)
    assert created["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] == 1
    patch = {"spec": {"spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "mig.nvidia.com"}}]}}}}  # fmt: skip
    code, message = refused(lambda: cluster.raw("PATCH", f"{RES}/namespaces/{ns}/resourceclaimtemplates/one-gpu",
                                        body=patch, ctype=MERGE))  # fmt: skip
    assert code == 422 and "field is immutable" in message, message


def test_resource_slices_need_one_node_scope_and_keep_their_node(cluster, unique):
    node = kwok_node(cluster, f"n1-{unique}")
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"s1-{unique}"},
            "spec": {"driver": DRA_DRIVER, "pool": {"name": node["metadata"]["name"],
                                                     "generation": 1, "resourceSliceCount": 1}}}  # fmt: skip
    code, message = refused(
        lambda: cluster.raw("POST", f"{RES}/resourceslices", body=body, ctype=JSON)
    )
    assert code == 422 and "exactly one of `nodeName`" in message, message
    body["spec"]["nodeName"] = node["metadata"]["name"]
    cluster.raw("POST", f"{RES}/resourceslices", body=body, ctype=JSON)
    code, message = refused(lambda: cluster.raw("PATCH", f"{RES}/resourceslices/s1-{unique}",
                                        body={"spec": {"nodeName": "n2"}}, ctype=MERGE))  # fmt: skip
    assert "spec.nodeName: Invalid value: " in message and "field is immutable" in message


def test_a_container_claim_must_name_one_of_the_pods_claims(cluster, unique):
    ns = f"pod-{unique}"
    namespace(cluster, ns)
    pod = workload("p", "one-gpu")
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "other"}]
    code, message = refused(
        lambda: cluster.raw("POST", f"/api/v1/namespaces/{ns}/pods", body=pod, ctype=JSON)
    )
    assert code == 422 and 'Not found: "other"' in message, message


def test_gpustacks_device_class_cel_compiles_and_a_broken_one_is_refused(cluster, device_classes):
    """The API server compiles every selector, so gpustack's are accepted (the fixture applied
    them) and a broken one is refused with 422."""
    classes = {c["metadata"]["name"]: c for c in items(cluster, f"{RES}/deviceclasses")}
    assert {"gpu.nvidia.com", "mig.nvidia.com"} <= set(classes)
    body = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": "broken.example.com"},
            "spec": {"selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].type == 1 &&"}}]}}  # fmt: skip
    code, message = refused(
        lambda: cluster.raw("POST", f"{RES}/deviceclasses", body=body, ctype=JSON)
    )
    assert code == 422 and "compilation failed" in message, message


def test_a_pod_bound_by_node_name_never_gets_its_claim(cluster, device_classes, unique):
    """The scheduler allocates claims; a pod that bypasses it keeps an unallocated claim. (On a
    real node the kubelet then refuses to start it; kwok starts it: see the module docstring,
    and tests/lab/test_real_cluster.py for the kubelet's side.)"""
    host, ns = f"gpu1-{unique}", f"pin-{unique}"
    node = kwok_node(cluster, host)
    publish(cluster, node, [gpu_device(0, uuids_for(host, 1)[0])])
    namespace(cluster, ns)
    claim_template(cluster, ns, "one-gpu")

    cluster.raw("POST", f"/api/v1/namespaces/{ns}/pods", body=workload("pinned", "one-gpu", host),
                ctype=JSON)  # fmt: skip

    (claim,) = wait_until(lambda: items(cluster, f"{RES}/namespaces/{ns}/resourceclaims"),
                          what="the claim from the template", timeout=20)  # fmt: skip
    assert claim["metadata"]["ownerReferences"][0]["name"] == "pinned"
    time.sleep(2)  # the scheduler and the controllers act within a second
    claim = cluster.raw("GET", f"{RES}/namespaces/{ns}/resourceclaims/{claim['metadata']['name']}")
    assert "allocation" not in (claim.get("status") or {})
    assert not (claim.get("status") or {}).get("reservedFor")


def test_claims_are_allocated_from_free_devices_only(cluster, device_classes, unique):
    host, ns = f"gpu1-{unique}", f"free-{unique}"
    node = kwok_node(cluster, host)
    publish(cluster, node, [gpu_device(0, uuids_for(host, 1)[0])])
    namespace(cluster, ns)
    claim_template(cluster, ns, "one-gpu")
    pods = f"/api/v1/namespaces/{ns}/pods"
    for name in ("first", "second"):
        cluster.raw("POST", pods, body=workload(name, "one-gpu", on=host), ctype=JSON)
        if name == "first":
            wait_until(lambda: phase(cluster, ns, "first") == "Running", what="first Running",
                       timeout=20)  # fmt: skip

    def unschedulable():
        conditions = cluster.raw("GET", f"{pods}/second")["status"].get("conditions") or []
        return next((c for c in conditions if c["type"] == "PodScheduled"
                     and c.get("reason") == "Unschedulable"), None)  # fmt: skip

    condition = wait_until(unschedulable, what="second Unschedulable", timeout=20)
    assert "cannot allocate all claims" in condition["message"], condition
    assert "nodeName" not in cluster.raw("GET", f"{pods}/second")["spec"]

    cluster.raw("DELETE", f"{pods}/first")  # kwok finishes the deletion; the claim goes (GC)
    wait_until(lambda: cluster.raw("GET", f"{pods}/second")["spec"].get("nodeName") == host,
               what="second scheduled on the freed GPU", timeout=30)  # fmt: skip


# -- a rolling driver upgrade of a DRA node ---------------------------------------------------


def test_an_upgrade_evicts_dra_workloads_pauses_the_kubelet_plugin_last_and_validates_slices(
    cluster, plugin, kubeconfig, unique, kube
):
    """A driver upgrade of a node whose GPUs come from DRA: the workload holding a GPU through a
    ResourceClaim (allocated by the real scheduler) is a GPU pod and is evicted (the GPU
    Operator's gpuPodSpecFilter counts NVIDIA claims); the GPU clients are paused, the DRA
    kubelet plugin last (NVIDIA's driver manager `evictKubeletPlugin`: it unprepares the
    others' claims); validation waits for the node's ResourceSlices, not for an allocatable
    nvidia.com/gpu that DRA never advertises, and its verification pod gets a claim on the
    cordoned node. STAND-INS: the plugin's slices (PluginPublishes: withdrawn while its pod is
    gone, published again when it is back), the verification container (VerifyPodExits), the
    host's driver role (FakeHostUpgrader)."""
    host, work = f"gpu-up-{unique}", f"work-{unique}"
    facts, published = gpu_nodes(cluster, {host: 2})
    session = session_for(kubeconfig, unique, [host])
    ns = session.config.namespace
    namespace(cluster, work)
    wait_until(lambda: items(cluster, f"/api/v1/namespaces/{work}/serviceaccounts"),
               what="ServiceAccount default", timeout=30, interval=0.1)  # fmt: skip
    claim_template(cluster, work, "one-gpu")
    pod = workload("train", "one-gpu", on=host)
    replicaset = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "train"},
                  "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "train"}},
                           "template": {"metadata": {"labels": {"app": "train"}},
                                        "spec": {**pod["spec"], "restartPolicy": "Always"}}}}  # fmt: skip
    inv = inventory(kubeconfig.parent, [host], gpustack_k8s_namespace=ns,
                    gpustack_k8s_gpu_allocation="dra")  # fmt: skip

    def running_workload() -> list[dict]:
        return [p for p in items(cluster, f"/api/v1/namespaces/{work}/pods")
                if p["status"].get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")]  # fmt: skip

    seen: dict[str, object] = {}

    def driver_role(name):  # what is on the node while the driver would be reloaded
        on_node = [p for p in items(cluster, "/api/v1/pods")
                   if p["spec"].get("nodeName") == name
                   and p["status"].get("phase") not in ("Succeeded", "Failed")]  # fmt: skip
        seen["pods"] = sorted(p["metadata"]["name"].rsplit("-", 1)[0] for p in on_node)

    with PluginPublishes(cluster, plugin, ns, published), \
            VerifyPodExits(cluster, ns, kubeconfig.parent) as verify:  # fmt: skip
        report = flow.install(session, run_result(facts))
        assert report.passed, [n.to_dict() for n in report.nodes]
        cluster.raw("POST", f"/apis/apps/v1/namespaces/{work}/replicasets", body=replicaset,
                    ctype=JSON)  # fmt: skip
        (train,) = wait_until(running_workload, what="the workload Running with its claim",
                              timeout=30, interval=0.1)  # fmt: skip
        claim = train["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
        allocated = cluster.raw("GET", f"{RES}/namespaces/{work}/resourceclaims/{claim}")
        assert allocated["status"]["allocation"]["devices"]["results"][0]["pool"] == host
        before = set(verify.claims)

        backend = KubernetesBackend.from_kubeconfig(str(kubeconfig), inv, {})
        assert backend.dra and backend.config is not None
        run = open_run(None, inventory=inv.path, target=Target(version=NEW), hosts=[host],
                       mode="kubernetes", resume=False, state_file=None)  # fmt: skip
        backend.record_state(host, "upgrade-required")
        mark = kube.audit_mark()
        policy = RolloutPolicy(limits=Limits(1, 1),
                               steps=StepOptions(poll=0.05, validation_timeout=30))  # fmt: skip
        result = Orchestrator(run, [host], MemoryStateStore(run), backend,
                              FakeHostUpgrader(before=driver_role,
                                               gpus={host: uuids_for(host, 2)}), policy,
                              ThreadExecutor(1, poll=0.01)).execute()  # fmt: skip
        backend.cluster.close()

    assert result.status == "done", run.nodes[host].reason
    notes = {t.to_state: t.note for t in run.history}
    assert notes["drain-required"] == "evicted 1 GPU pod(s)"
    # nothing of gpustack's and no workload was left on the node
    assert seen == {"pods": []}, seen
    assert notes["validation-required"].startswith(
        "paused GPU clients (dcgm-exporter, dra-driver, gpu-feature-discovery); driver role ran"
    ), notes
    # the pod's nvidia-smi -L judged as verify judges it: one of the host's GPUs, published
    validated = notes["uncordon-required"]
    assert validated.startswith(
        f"driver {NEW} held; node Ready, 2 GPU(s) in ResourceSlices of {DRA_DRIVER}; "
        "verification pod succeeded: GPU GPU-"
    ) and validated.endswith(
        f"UUID matches one of the host's 2; one of the devices {DRA_DRIVER} publishes for the node"
    ), notes
    assert len(set(verify.claims) - before) == 1, "one verification pod, with a claim"
    # the kubelet plugin's label was paused on its own, after the other clients'
    uri = f"/api/v1/nodes/{host}?"
    paused = [sorted(k.rsplit(".", 1)[-1] for k, v in labels.items()
                     if v == "paused-for-driver-upgrade")
              for labels in ((e["requestObject"].get("metadata") or {}).get("labels") or {}
                             for e in kube.audit_events(mark)
                             if e["verb"] == "patch" and e["requestURI"].startswith(uri))]  # fmt: skip
    assert [p for p in paused if p] == [["dcgm-exporter", "gpu-feature-discovery"],
                                        ["dra-driver"]], paused  # fmt: skip
    labels = cluster.raw("GET", f"/api/v1/nodes/{host}")["metadata"]["labels"]
    assert labels["nvidia.com/gpu.deploy.dra-driver"] == "true"
    assert labels["nvidia.com/gpu-driver-upgrade-state"] == "upgrade-done"
