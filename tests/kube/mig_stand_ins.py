"""STAND-INS for what sits below Kubernetes in a MIG change on a kwok node (tests/kube/test_mig.py).

`DevicePlugin` stands in for NVIDIA's k8s-device-plugin and the kubelet's device manager on one
kwok node: while a pod of gpustack's device plugin DaemonSet runs Ready on the node, the node's
allocatable GPU resources are what the real plugin would register for the host's GPUs as that
pod found them when it started, under the pod's own `MIG_STRATEGY`; while none runs, they drop to
0 and keep their capacity (the kubelet marks a stopped plugin's devices unhealthy,
pkg/kubelet/cm/devicemanager/manager.go `GetCapacity`). It reads the host's GPUs only when a
plugin pod starts (the real plugin enumerates NVML once): a plugin that was not restarted goes on
advertising the old layout. Nothing about NVIDIA's plugin or a real GPU is proven by it.

`DraKubeletPlugin` stands in for NVIDIA's DRA kubelet plugin (gpustack_k8s_gpu_allocation=dra)
the same way: while a pod of gpustack's DRA kubelet plugin DaemonSet runs Ready on the node, the
node's ResourceSlice lists the host's GPUs as that pod found them when it started, each GPU not in
MIG mode whole (`type=gpu`) and each MIG device with its profile (`type=mig`), the attributes of
NVIDIA/k8s-dra-driver-gpu@22407113 cmd/gpu-kubelet-plugin/deviceinfo.go and mig.go (static MIG);
while none runs, the slice is gone (the kubelet withdraws an unregistered plugin's slices).

`MigVerificationPods` stands in for the container of install's verification pod on such a node:
`nvidia-smi -L` as a container given the one unit its pod asked for prints it (the GPU the host
facts name and, when the host's GPU is in MIG mode, one MIG device: of the profile a
`nvidia.com/mig-<profile>` request names, or of the layout's only profile for `nvidia.com/gpu`
under the single strategy), served as the pod's log by kwok; the kubelet's resource admission is
`AdmittingVerificationPods`'. No nvidia-smi runs.

`FixtureMigApplier` stands in for the nvidia_mig role run through Ansible on a host: the role's
own applier (plugins/module_utils/gpustack_mig_apply.py, unchanged) against the MIG test fixture
`nvidia-smi` in a temporary root (tests/unit/mig_local.py). A GPU pod bound to the node and not
finished when the layout changes is a process on the GPU: the fixture refuses the change (the
role then fails naming it), as a host whose GPU is busy would.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import threading
from collections.abc import Callable

from gpustack.k8s.cluster.connect import connect
from gpustack.k8s.cluster.status import DEVICE_PLUGIN_SELECTOR, DRA_PLUGIN_SELECTOR
from gpustack.k8s.cluster.upgrade import is_gpu_pod
from gpustack.k8s.manifests import DRA_DRIVER
from gpustack.mig.reconfigure import MigOutcome
from tests.kube.operand_stand_ins import AdmittingVerificationPods
from tests.kube.stand_ins import Outcome
from tests.unit.mig_local import FixtureNode

GPU_KEYS = ("nvidia.com/gpu", "nvidia.com/mig-")
# per GPU: (MIG mode enabled, the profiles of its MIG devices)
HostGpus = list[tuple[bool, list[str]]]

_GPU_LINE = re.compile(r"^GPU (\d+): ")
_MIG_LINE = re.compile(r"^\s+MIG (\S+)\s+Device\s+\d+: \(UUID: MIG-")


def fixture_gpus(node: FixtureNode) -> HostGpus:
    """What NVML shows a plugin started on the fixture host: MIG mode and MIG devices per GPU."""
    rc, modes = node.smi("--query-gpu=index,mig.mode.current", "--format=csv,noheader")
    assert rc == 0, modes
    enabled = [line.split(",")[1].strip() == "Enabled" for line in modes.splitlines()]
    rc, listing = node.smi("-L")
    assert rc == 0, listing
    devices: list[list[str]] = []
    for line in listing.splitlines():
        if _GPU_LINE.match(line):
            devices.append([])
        elif match := _MIG_LINE.match(line):
            devices[-1].append(match.group(1))
    return list(zip(enabled, devices, strict=True))


def advertised(gpus: HostGpus, strategy: str) -> dict[str, int]:
    """The resources k8s-device-plugin registers for these GPUs (internal/rm/device_map.go
    @1b826acc): none — one nvidia.com/gpu per GPU; single — each MIG device as nvidia.com/gpu
    (the plugin exits, registering nothing, when the node is not uniformly one MIG type);
    mixed — nvidia.com/mig-<profile> per MIG device, nvidia.com/gpu per GPU not in MIG mode."""
    enabled = [devices for on, devices in gpus if on]
    if strategy == "single" and enabled:
        profiles = {p for devices in enabled for p in devices}
        if not all(enabled) or len(profiles) > 1 or len(enabled) != len(gpus):
            return {}
    out: dict[str, int] = {}
    for on, devices in gpus:
        names = ["nvidia.com/gpu"]
        if on and strategy == "single":
            names = ["nvidia.com/gpu"] * len(devices)
        elif on and strategy == "mixed":
            names = [f"nvidia.com/mig-{p}" for p in devices]
        for name in names:
            out[name] = out.get(name, 0) + 1
    return out


def _serving(pod: dict) -> bool:
    status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in status.get("conditions") or [])  # fmt: skip
    terminating = pod["metadata"].get("deletionTimestamp")
    return status.get("phase") == "Running" and ready and not terminating


def _strategy(pod: dict) -> str:
    for container in pod["spec"]["containers"]:
        for env in container.get("env") or []:
            if env.get("name") == "MIG_STRATEGY":
                return str(env.get("value") or "none")
    return "none"


class DevicePlugin:
    """STAND-IN for the device plugin and the kubelet's device manager on kwok node `node` (see
    the module doc), run from a background thread that polls every `interval` seconds."""

    SELECTOR = DEVICE_PLUGIN_SELECTOR  # its DaemonSet's pods

    def __init__(self, kubeconfig: str, node: str, namespace: str,
                 host_gpus: Callable[[], HostGpus], interval: float = 0.05):  # fmt: skip
        self.cluster = connect(kubeconfig)  # its own client: it runs in its own thread
        self.node, self.namespace, self.host_gpus = node, namespace, host_gpus
        self.interval = interval
        self.registered: dict[str, dict[str, int]] = {}  # plugin pod uid -> what it registered
        self.errors: list[BaseException] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"plugin-{node}", daemon=True)

    def start(self) -> DevicePlugin:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.cluster.close()
        if self.errors:
            raise self.errors[0]

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sync()
            except Exception as exc:  # the test sees it at stop()
                self.errors.append(exc)
                return
            self._stop.wait(self.interval)

    def serving_pods(self) -> list[dict]:
        """The plugin's pods on the node that are serving (the kubelet would talk to them)."""
        pods = self.cluster.list_all(
            f"/api/v1/namespaces/{self.namespace}/pods", "list plugin pods",
            labelSelector=self.SELECTOR, fieldSelector=f"spec.nodeName={self.node}",
        )  # fmt: skip
        return [p for p in pods if _serving(p)]

    def sync(self) -> None:
        serving = self.serving_pods()
        registered: dict[str, int] = {}
        if serving:
            pod = serving[0]
            uid = pod["metadata"]["uid"]
            if uid not in self.registered:  # a plugin starting: it enumerates the GPUs once
                self.registered[uid] = advertised(self.host_gpus(), _strategy(pod))
            registered = self.registered[uid]
        node = self.cluster.get(f"/api/v1/nodes/{self.node}", "read node")
        status = node.get("status") or {}
        allocatable, capacity = status.get("allocatable") or {}, status.get("capacity") or {}
        want_alloc = {k: "0" for k in allocatable if k.startswith(GPU_KEYS)}
        want_alloc.update({k: str(v) for k, v in registered.items()})
        want_cap = {k: str(v) for k, v in registered.items()}
        if any(allocatable.get(k) != v for k, v in want_alloc.items()) or any(
            capacity.get(k) != v for k, v in want_cap.items()
        ):
            body = {"status": {"allocatable": want_alloc, "capacity": want_cap}}
            self.cluster.raw("PATCH", f"/api/v1/nodes/{self.node}/status", body=body,
                             ctype="application/merge-patch+json")  # fmt: skip


def dra_devices(gpus: HostGpus, uuids: list[str]) -> list[dict]:
    """The devices NVIDIA's DRA kubelet plugin publishes for these GPUs (static MIG)."""
    devices = []
    for minor, ((on, profiles), uuid) in enumerate(zip(gpus, uuids, strict=True)):
        if not on:
            attributes = {"type": {"string": "gpu"}, "uuid": {"string": uuid}}
            devices.append({"name": f"gpu-{minor}", "attributes": attributes})
        for index, profile in enumerate(profiles if on else []):
            attributes = {"type": {"string": "mig"}, "parentUUID": {"string": uuid},
                          "profile": {"string": profile},
                          "uuid": {"string": f"MIG-{uuid[4:12]}-0000-0000-0000-{index:012d}"}}  # fmt: skip
            devices.append({"name": f"gpu-{minor}-mig-{index}", "attributes": attributes})
    return devices


class DraKubeletPlugin(DevicePlugin):
    """STAND-IN for NVIDIA's DRA kubelet plugin on kwok node `node` (see the module doc)."""

    RES = "/apis/resource.k8s.io/v1/resourceslices"
    SELECTOR = DRA_PLUGIN_SELECTOR

    def __init__(self, kubeconfig: str, node: str, namespace: str,
                 host_gpus: Callable[[], HostGpus], uuids: list[str]):  # fmt: skip
        super().__init__(kubeconfig, node, namespace, host_gpus)
        self.uuids = uuids
        self.published: dict[str, list[dict]] = {}  # plugin pod uid -> its devices
        self.written = ""  # the uid of the plugin pod whose devices the slice lists

    def devices(self) -> list[dict]:
        """The devices in the node's slices now."""
        slices = self.cluster.list_all(self.RES, "list slices",
                                       fieldSelector=f"spec.nodeName={self.node}")  # fmt: skip
        return [d for s in slices for d in s["spec"].get("devices") or []]

    def sync(self) -> None:
        serving = self.serving_pods()
        slices = self.cluster.list_all(self.RES, "list slices",
                                       fieldSelector=f"spec.nodeName={self.node}")  # fmt: skip
        if not serving:
            for item in slices:
                self.cluster.raw("DELETE", f"{self.RES}/{item['metadata']['name']}")
            return
        uid = serving[0]["metadata"]["uid"]
        if uid not in self.published:  # a plugin starting: it enumerates the GPUs once
            self.published[uid] = dra_devices(self.host_gpus(), self.uuids)
        if self.written == uid and slices:
            return
        for item in slices:
            self.cluster.raw("DELETE", f"{self.RES}/{item['metadata']['name']}")
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                "metadata": {"generateName": f"{self.node}-{DRA_DRIVER}-"},
                "spec": {"driver": DRA_DRIVER, "nodeName": self.node,
                         "pool": {"name": self.node, "generation": len(self.published),
                                  "resourceSliceCount": 1},
                         "devices": self.published[uid]}}  # fmt: skip
        self.cluster.raw("POST", self.RES, body=body, ctype="application/json")
        self.written = uid


class MigVerificationPods(AdmittingVerificationPods):
    """STAND-IN for the verification container on a MIG host (see the module doc): one GPU,
    `uuid` (the host facts'), `product` its name; `host_gpus` what NVML shows on the host."""

    def __init__(self, cluster, directory, node: str, uuid: str, product: str,
                 host_gpus: Callable[[], HostGpus]):  # fmt: skip
        super().__init__(cluster, directory, {node: Outcome("")})
        self.uuid, self.product, self.host_gpus = uuid, product, host_gpus

    def _end(self, pod: dict, outcome: Outcome) -> None:
        limits = pod["spec"]["containers"][0]["resources"].get("limits") or {}
        super()._end(pod, Outcome(self.smi(limits)))

    def smi(self, limits: dict) -> str:
        text = f"GPU 0: {self.product} (UUID: {self.uuid})\n"
        (enabled, devices), *_ = self.host_gpus()
        profile = None
        for resource in limits:
            if resource.startswith("nvidia.com/mig-"):
                profile = resource.removeprefix("nvidia.com/mig-")
            elif resource == "nvidia.com/gpu" and enabled and len(set(devices)) == 1:
                profile = devices[0]  # the single strategy: MIG devices as nvidia.com/gpu
        if profile:
            digest = hashlib.sha1(f"{self.uuid}/{profile}".encode()).hexdigest()
            mig = f"MIG-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"
            text += f"  MIG {profile}     Device  0: (UUID: {mig})\n"
        return text


class FixtureMigApplier:
    """gpustack.mig.reconfigure.MigApplier over the MIG fixture (see the module doc); host = node name."""

    def __init__(self, kubeconfig: str, nodes: dict[str, FixtureNode], **settings):
        self.kubeconfig = kubeconfig
        self.settings = settings  # the role's settings besides the layout (reset=False, ...)
        self.nodes = nodes  # host (= node name here) -> its fixture
        self.calls: list[tuple[str, str, bool | str]] = []

    def _gpu_pods_on(self, host: str) -> list[dict]:
        cluster = connect(self.kubeconfig)
        try:
            pods = cluster.list_all("/api/v1/pods", "list pods",
                                    fieldSelector=f"spec.nodeName={host}")  # fmt: skip
        finally:
            cluster.close()
        finished = ("Succeeded", "Failed")
        return [p for p in pods
                if is_gpu_pod(p) and (p.get("status") or {}).get("phase") not in finished]  # fmt: skip

    def __call__(self, host: str, layout: str, check: bool) -> MigOutcome:
        self.calls.append((host, layout, check))
        node = self.nodes[host]
        users: list[subprocess.Popen] = []
        if not check and self._gpu_pods_on(host):  # a busy GPU: the fixture sees a process
            users.append(node.use_gpu(0))
        try:
            fact = node.apply(layout, check_mode=check, **self.settings)
        finally:
            for proc in users:
                proc.kill()
                proc.wait()
        return MigOutcome.from_fact(fact)

    def reboot(self, host: str, layout: str, takes: bool = True) -> MigOutcome:
        """What the role does with nvidia_mig_reboot=if_needed: record `rebooting` in the
        host's state file, reboot (the fixture loses /run: instances gone, the pending mode
        effective), and report what gpustack-mig.service recorded at boot (the role's applier,
        source boot, same settings). takes=False: the host came back with the mode change still
        pending (the fixture was not restarted). The kwok node itself does not restart."""
        self.calls.append((host, layout, "reboot"))
        node = self.nodes[host]
        recorded = json.loads(node.state_file.read_text())
        node.state_file.write_text(json.dumps({**recorded, "state": "rebooting"}))
        if takes:
            node.reboot()
        return MigOutcome.from_fact(node.apply(layout, source="boot", **self.settings))
