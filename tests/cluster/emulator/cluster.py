"""ClusterEmulator: the emulated API server plus the controllers that make a cluster move.

After every request the emulator settles: scheduler, DaemonSet controller, kubelets (with
the device manager and the operand images), disruption controller and NFD run until nothing
changes. Before every request the kubelets also restart crash-looping containers and finish
graceful deletions. Tests drive the cluster through the real client over HTTP and through the
controller API below, which plays what is outside Kubernetes (nodes joining with their
SIMULATED hardware, an image missing from the registry, a kubelet that stalls, a workload's
behaviour); it offers no way to set a pod's or a DaemonSet's status.
"""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.cluster.emulator.apiserver import ApiServer
from tests.cluster.emulator.daemonset import DaemonSets
from tests.cluster.emulator.devices import DeviceManager
from tests.cluster.emulator.dra import Dra
from tests.cluster.emulator.errors import ApiError
from tests.cluster.emulator.eviction import Disruption
from tests.cluster.emulator.hardware import NodeHardware
from tests.cluster.emulator.images import NODE_NAME_LABEL, Outcome
from tests.cluster.emulator.kinds import (
    NODEFEATURE_CRD,
    NODEFEATURERULE_CRD,
    SERVICEMONITOR_CRD,
    Kind,
    crd_object,
)
from tests.cluster.emulator.kmock_adapter import JSON, ApiRequest, KmockServer
from tests.cluster.emulator.kubelet import Kubelets
from tests.cluster.emulator.nfd import Nfd
from tests.cluster.emulator.scheduler import Scheduler
from tests.cluster.emulator.store import Store, now


@dataclass
class PodFate:
    """What a workload's container does when it runs (SIMULATED; never used for operand images)."""

    phase: str  # Running, Succeeded, Failed
    log: str = ""
    exit_code: int = 0

    @classmethod
    def succeeded(cls, log: str = "") -> PodFate:
        return cls("Succeeded", log=log)

    @classmethod
    def failed(cls, log: str = "", exit_code: int = 1) -> PodFate:
        return cls("Failed", log=log, exit_code=exit_code)

    @classmethod
    def running(cls, log: str = "") -> PodFate:
        return cls("Running", log=log)

    def outcome(self) -> Outcome:
        if self.phase == "Running":
            return Outcome.run(self.log)
        return Outcome.exit(0 if self.phase == "Succeeded" else self.exit_code, self.log)


VERSION = {
    "major": "1",
    "minor": "35",
    "gitVersion": "v1.35.0+emulator",
    "gitCommit": "0" * 40,
    "gitTreeState": "clean",
    "buildDate": "2026-01-01T00:00:00Z",
    "goVersion": "go1.25.0",
    "compiler": "gc",
    "platform": "linux/amd64",
}


class ClusterEmulator(KmockServer):
    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self.store = Store(self._kinds_changed)
        self.lock = self.store.lock
        self.version = dict(VERSION)
        self.api = ApiServer(self.store, self.version)
        self.devices = DeviceManager()
        self.kubelet = Kubelets(self)
        self.scheduler = Scheduler(self)
        self.daemonsets = DaemonSets(self)
        self.disruption = Disruption(self.api)
        self.nfd = Nfd(self)
        self.dra = Dra(self)
        self.hardware_by_node: dict[str, NodeHardware] = {}
        self.unpullable: set[str] = set()
        self.pod_policy: Callable[[dict], PodFate | None] | None = None
        self.proxies: dict[tuple, Callable[[str], Any]] = {}
        self._settled_rv = -1
        self.api.subresources.update(log=self._log, eviction=self._evict, proxy=self._proxy)
        self.api.on_change.append(self._namespace_defaults)
        for ns in ("default", "kube-system"):
            self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})

    # -- serving ---------------------------------------------------------------------------------

    def serve(self, request: ApiRequest) -> tuple[int, Any, str]:
        with self.lock:
            if self.kubelet.pending:  # crash-looping containers, terminating pods
                self.kubelet.sync(restart=True)
            self.settle()
            status, payload, ctype = self.api.handle(request)
            if request.method != "GET":
                self.settle()
            if ctype == JSON:  # serialised under the lock: controllers change objects in place
                payload = json.dumps(payload).encode()
            return status, payload, ctype

    def settle(self, rounds: int = 20, force: bool = False) -> None:
        """Run the controllers until the cluster stops changing.

        Nothing to do when no object changed since the last settle (`force`: something outside
        the store changed, such as a node's simulated hardware).
        """
        with self.lock:
            if self.store.rv == self._settled_rv and not force:
                return
            for _ in range(rounds):
                before = self.store.rv
                self.dra.sync()
                self.scheduler.sync()
                self.daemonsets.sync()
                self.kubelet.sync(restart=False)
                self.disruption.sync()
                self.nfd.sync()
                if self.store.rv == before:
                    break
            self._settled_rv = self.store.rv

    def tick(self) -> None:
        """What happens before each request is served: one kubelet sync with restarts and
        finished graceful deletions, then the controllers settle."""
        with self.lock:
            self.kubelet.sync(restart=True)
            self.settle(force=True)

    def _kinds_changed(self, kind: Kind, added: bool) -> None:
        (self.declare if added else self.undeclare)(kind)

    def _namespace_defaults(self, kind: Kind, obj: dict, event: str) -> None:
        """ServiceAccount and root-CA-publisher controllers: what every namespace gets."""
        if kind.kind != "Namespace" or event != "created":
            return
        ns = obj["metadata"]["name"]
        self.api.create(self.kind("v1", "ServiceAccount"), ns,
                        {"metadata": {"name": "default"}})  # fmt: skip
        self.api.create(self.kind("v1", "ConfigMap"), ns,
                        {"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": "emulated"}})  # fmt: skip

    # -- subresources --------------------------------------------------------------------------

    def _log(self, request: ApiRequest, kind: Kind):
        pod = self.store.must(kind, request.namespace, request.name)
        container = request.params.get("container")
        text = self.kubelet.log(pod, container)
        if text is None:
            first = ((pod.get("spec") or {}).get("containers") or [{}])[0].get("name", "")
            raise ApiError(400, "BadRequest", f'container "{container or first}" in pod '
                           f'"{request.name}" is waiting to start: ContainerCreating')  # fmt: skip
        return 200, text, "text/plain"

    def _evict(self, request: ApiRequest, kind: Kind):
        return self.disruption.evict(request, kind)

    def _proxy(self, request: ApiRequest, kind: Kind):
        service, _, port = (request.name or "").partition(":")
        self.store.must(kind, request.namespace, service)
        handler = self.proxies.get((request.namespace, service, port or ""))
        if handler is None:
            raise ApiError(
                503, "ServiceUnavailable", f'no endpoints available for service "{service}"'
            )
        answer = handler((request.subresource or "").removeprefix("proxy") or "/")
        status, text = answer if isinstance(answer, tuple) else (200, answer)
        return status, text.encode(), "text/plain; version=0.0.4"

    # -- reading (tests and controllers) --------------------------------------------------------------

    def kind(self, api_version: str, kind_name: str) -> Kind:
        return self.store.kind_of(api_version, kind_name)

    def get(self, api_version: str, kind_name: str, name: str, namespace: str | None = None):
        with self.lock:
            obj = self.store.get(self.kind(api_version, kind_name), namespace, name)
            return copy.deepcopy(obj) if obj else None

    def objects(self, api_version: str, kind_name: str, namespace: str | None = None,
                selector: str = "") -> list[dict]:  # fmt: skip
        with self.lock:
            return copy.deepcopy(
                self.store.items(self.kind(api_version, kind_name), namespace, selector)
            )

    def node(self, name: str) -> dict | None:
        return self.store.get(self.kind("v1", "Node"), None, name)

    def hardware(self, node: str) -> NodeHardware:
        return self.hardware_by_node.setdefault(node, NodeHardware())

    def pods_on(self, node: str) -> list[dict]:
        """Pods bound to `node` that still hold resources (not Succeeded/Failed)."""
        return [
            p for p in self.store.items(self.kind("v1", "Pod"))
            if (p.get("spec") or {}).get("nodeName") == node
            and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
        ]  # fmt: skip

    def nodefeature(self, namespace: str, name: str) -> dict | None:
        kind = self.store.kind_at("nfd.k8s-sigs.io", "v1alpha1", "nodefeatures")
        return self.store.get(kind, namespace, name) if kind else None

    # -- writing as a controller or as an operand's process ----------------------------------------

    def event(self, obj: dict, reason: str, message: str, type_: str, component: str) -> None:
        meta = obj["metadata"]
        ns = meta.get("namespace") or "default"
        kind = self.kind("v1", "Event")
        for existing in self.store.items(kind, ns):
            inv = existing.get("involvedObject") or {}
            if (
                inv.get("uid") == meta.get("uid")
                and existing.get("reason") == reason
                and existing.get("message") == message
            ):
                existing["count"] = existing.get("count", 1) + 1
                existing["lastTimestamp"] = now()
                self.store.touch(existing)
                return
        stamp = now()
        self.api.create(kind, ns, {
            "metadata": {"generateName": f"{meta['name']}."},
            "involvedObject": {"kind": obj.get("kind"), "name": meta["name"], "namespace": ns,
                               "uid": meta.get("uid")},
            "reason": reason, "message": message, "type": type_,
            "source": {"component": component}, "firstTimestamp": stamp, "lastTimestamp": stamp,
            "count": 1,
        })  # fmt: skip

    def put_nodefeature(
        self, namespace: str, name: str, node: str, labels: dict, pod: dict
    ) -> None:
        """What GFD's NodeFeature outputer writes (after its RBAC checks passed)."""
        kind = self.store.kind_at("nfd.k8s-sigs.io", "v1alpha1", "nodefeatures")
        owners = [
            ref
            for ref in pod["metadata"].get("ownerReferences") or []
            if ref.get("kind") == "DaemonSet"
        ]
        owners += [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod["metadata"]["name"],
                "uid": pod["metadata"]["uid"],
            }
        ]
        body = {"labels": {NODE_NAME_LABEL: node}, "ownerReferences": owners}
        existing = self.store.get(kind, namespace, name)
        if existing is None:
            self.api.create(
                kind,
                namespace,
                {"metadata": {"name": name, **body}, "spec": {"features": {}, "labels": labels}},
            )
            return
        new = copy.deepcopy(existing)
        new["metadata"].update(body)
        new["spec"] = {"features": {}, "labels": labels}
        self.api.writer.commit(kind, existing, new)

    # -- the controller API for tests ---------------------------------------------------------------

    def create(self, obj: dict) -> dict:
        """Create an object as a client would (status is the controllers' business)."""
        with self.lock:
            kind = self.kind(obj["apiVersion"], obj["kind"])
            created = self.api.create(kind, obj.get("metadata", {}).get("namespace"), obj)
            self.settle()
            return copy.deepcopy(created)

    def delete(
        self, api_version: str, kind_name: str, name: str, namespace: str | None = None
    ) -> None:
        with self.lock:
            self.api.delete(self.kind(api_version, kind_name), namespace, name)
            self.settle()

    def merge_patch(self, api_version: str, kind_name: str, name: str, patch: dict,
                    namespace: str | None = None, manager: str = "kubectl") -> None:  # fmt: skip
        """A JSON merge patch by another client (a user with kubectl)."""
        with self.lock:
            self.api.writer.patch(self.kind(api_version, kind_name), namespace, name,
                                  "application/merge-patch+json", patch, None, {"fieldManager": manager})  # fmt: skip
            self.settle()

    def install_crd(self, kind: Kind = SERVICEMONITOR_CRD) -> None:
        """Create the CustomResourceDefinition object; its resource is then served."""
        self.create(crd_object(kind))

    def install_nfd(self, *, master: bool = True, worker: bool = True) -> None:
        """Node Feature Discovery: its API, and (unless off) what its master and worker do."""
        for kind in (NODEFEATURE_CRD, NODEFEATURERULE_CRD):
            self.install_crd(kind)
        self.nfd.master, self.nfd.worker = master, worker
        self.settle(force=True)

    def add_node(self, name: str, *, labels: dict | None = None, internal_ip: str | None = None,
                 hostname: str | None = None, allocatable: dict | None = None,
                 taints: list | None = None, ready: bool = True,
                 hardware: NodeHardware | None = None) -> dict:  # fmt: skip
        """A node joins (its kubelet registers it); `hardware` is what the host has (SIMULATED)."""
        resources = {"cpu": "8", "memory": "32Gi", "pods": "110", **(allocatable or {})}
        addresses = [{"type": "Hostname", "address": hostname or name}]
        if internal_ip:
            addresses.insert(0, {"type": "InternalIP", "address": internal_ip})
        if hardware is not None:
            self.hardware_by_node[name] = hardware
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name, "labels": {
                "kubernetes.io/hostname": hostname or name, "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64", **(labels or {})}},
            "spec": {"taints": taints} if taints else {},
            "status": {
                "capacity": dict(resources),
                "allocatable": dict(resources),
                "addresses": addresses,
                "conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                "reason": "KubeletReady" if ready else "KubeletNotReady"}],
                "nodeInfo": {"architecture": "amd64", "bootID": name,
                             "containerRuntimeVersion": "containerd://1.7.24",
                             "kernelVersion": "6.1.0-emulated", "kubeProxyVersion": "v1.35.0",
                             "kubeletVersion": "v1.35.0", "machineID": name, "operatingSystem": "linux",
                             "osImage": "Debian GNU/Linux 12 (bookworm)", "systemUUID": name},
            },
        }  # fmt: skip
        return self.create(node)

    def add_nodes(self, count: int, prefix: str = "node", **kwargs: Any) -> list[str]:
        names = [f"{prefix}{i:04d}" for i in range(count)]
        for name in names:
            self.add_node(name, **kwargs)
        return names

    def set_allocatable(self, node: str, resources: dict[str, str]) -> None:
        """An external device plugin the emulator does not model advertises resources (test hook
        for the upgrade tests' FakeHostUpgrader); the emulated device plugin never needs it."""
        with self.lock:
            obj = self.store.must(self.kind("v1", "Node"), None, node)
            status = copy.deepcopy(obj.get("status") or {})
            status.setdefault("capacity", {}).update(resources)
            status.setdefault("allocatable", {}).update(resources)
            self.store.set_status(self.kind("v1", "Node"), obj, status)
            self.settle()

    def pause_kubelet(self, node: str) -> None:
        """The node's kubelet stops acting (pods stay as they are)."""
        with self.lock:
            self.kubelet.pause(node)

    def resume_kubelet(self, node: str) -> None:
        with self.lock:
            self.kubelet.resume(node)
            self.settle(force=True)

    def hardware_changed(self) -> None:
        """Tell the kubelets a node's simulated hardware changed (a GPU fell off the bus)."""
        self.settle(force=True)

    def finish_workload(self, namespace: str, name: str, fate: PodFate) -> None:
        """A running workload's process ends (SIMULATED workload; operands cannot be ended)."""
        with self.lock:
            pod = self.store.must(self.kind("v1", "Pod"), namespace, name)
            self.kubelet.finish(pod, fate.outcome())
            self.settle()

    def later(self, delay: float, fn: Callable, *args: Any) -> threading.Timer:
        """Call fn(*args) from another thread after `delay` seconds (something acting later)."""
        timer = threading.Timer(delay, fn, args)
        timer.daemon = True
        timer.start()
        return timer

    def set_service_proxy(self, namespace: str, service: str, port: int | str,
                          handler: Callable[[str], Any]) -> None:  # fmt: skip
        """handler(path) -> text (200) or (status, text): what the service answers via the proxy."""
        self.proxies[(namespace, service, str(port))] = handler
