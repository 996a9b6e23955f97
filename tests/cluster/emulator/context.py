"""What a container sees when the emulated kubelet starts it: env, files, host paths, the API.

Env values resolve `value` and the `fieldRef`s the operands use (spec.nodeName,
metadata.namespace, metadata.name). Files come from ConfigMap volumes; host directories from
hostPath volumes (backed by the node's simulated `NodeHardware.files`). API calls from inside
the pod are checked the way kube-apiserver would check them: the ServiceAccount token must be
mounted (pod or ServiceAccount `automountServiceAccountToken`), the resource must be served,
and RBAC (rbac.py) must allow the verb for the pod's ServiceAccount.
"""

from __future__ import annotations

import functools
import json
import posixpath
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import yaml

from tests.cluster.emulator.errors import forbidden
from tests.cluster.emulator.hardware import NodeHardware
from tests.cluster.emulator.rbac import Subject, allowed

if TYPE_CHECKING:
    from tests.cluster.emulator.cluster import ClusterEmulator

TOKEN_PATH = "/var/run/secrets/kubernetes.io/serviceaccount/token"


@functools.lru_cache(maxsize=64)
def _parse_cached(text: str) -> str:
    return json.dumps(yaml.safe_load(text) or {})


def _parse(text: str) -> dict[str, Any]:
    """A config file's document (parsed once per distinct text; each caller gets its copy)."""
    return json.loads(_parse_cached(text))


@dataclass
class Device:
    """One device the kubelet allocated to a container (a GPU, a replica of one, a MIG device)."""

    id: str
    gpu: str  # physical GPU UUID
    mig: str | None = None  # MIG device UUID
    profile: str | None = None  # MIG profile
    healthy: bool = True
    cdi: bool = False  # prepared by a DRA driver and injected through CDI (not the runtime)


@dataclass
class RunContext:
    cluster: ClusterEmulator
    pod: dict
    container: dict
    node: str
    hw: NodeHardware
    runtime: str
    devices: list[Device] = field(default_factory=list)

    # -- identity --------------------------------------------------------------------------------

    @property
    def namespace(self) -> str:
        return self.pod["metadata"]["namespace"]

    @property
    def pod_name(self) -> str:
        return self.pod["metadata"]["name"]

    @property
    def service_account(self) -> str:
        return (self.pod.get("spec") or {}).get("serviceAccountName") or "default"

    @property
    def privileged(self) -> bool:
        return bool((self.container.get("securityContext") or {}).get("privileged"))

    # -- environment ---------------------------------------------------------------------------

    def env(self, *names: str, default: str | None = None) -> str | None:
        for name in names:
            for item in self.container.get("env") or []:
                if item.get("name") != name:
                    continue
                if "value" in item:
                    return str(item["value"])
                ref = ((item.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
                return {
                    "spec.nodeName": self.node,
                    "metadata.namespace": self.namespace,
                    "metadata.name": self.pod_name,
                }.get(ref or "", "")
        return default

    def flag(self, *names: str, default: bool) -> bool:
        value = self.env(*names)
        return default if value is None else value.strip().lower() in ("true", "1", "yes")

    # -- volumes ----------------------------------------------------------------------------------

    def _mount_for(self, path: str) -> tuple[dict, dict, str] | None:
        """(volumeMount, volume, rest of the path) of the mount holding `path`."""
        volumes = {v["name"]: v for v in (self.pod.get("spec") or {}).get("volumes") or []}
        best = None
        for mount in self.container.get("volumeMounts") or []:
            root = mount["mountPath"].rstrip("/") or "/"
            inside = path == root or path.startswith(root + "/")
            if inside and (best is None or len(root) > len(best[0]["mountPath"].rstrip("/"))):
                rest = path[len(root) :].lstrip("/")
                best = (mount, volumes.get(mount["name"], {}), rest)
        return best

    def file(self, path: str) -> str | None:
        """Content of a file from a ConfigMap volume (None: no such file)."""
        found = self._mount_for(path)
        if not found or "configMap" not in found[1]:
            return None
        cm = self.cluster.store.get(
            self.cluster.kind("v1", "ConfigMap"), self.namespace, found[1]["configMap"]["name"]
        )
        return ((cm or {}).get("data") or {}).get(found[2])

    def host_path(self, path: str) -> str | None:
        """The host path behind a container path (None: not on a hostPath volume)."""
        found = self._mount_for(path)
        if not found or "hostPath" not in found[1]:
            return None
        return (
            posixpath.join(found[1]["hostPath"]["path"], found[2])
            if found[2]
            else found[1]["hostPath"]["path"]
        )

    def config(self) -> tuple[dict[str, Any] | None, str]:
        """The device plugin config file named by CONFIG_FILE: (document, error)."""
        path = self.env("CONFIG_FILE")
        if not path:
            return {}, ""
        text = self.file(path)
        if text is None:
            return None, f"unable to load config: open {path}: no such file or directory"
        return _parse(text), ""

    # -- the API server, from inside the pod ------------------------------------------------------

    def token_mounted(self) -> bool:
        spec = self.pod.get("spec") or {}
        if spec.get("automountServiceAccountToken") is not None:
            return bool(spec["automountServiceAccountToken"])
        sa = self.cluster.store.get(
            self.cluster.kind("v1", "ServiceAccount"), self.namespace, self.service_account
        )
        if sa and sa.get("automountServiceAccountToken") is not None:
            return bool(sa["automountServiceAccountToken"])
        return True

    def api(self, verb: str, group: str, version: str, resource: str, namespace: str | None,
            name: str | None = None) -> tuple[int, str]:  # fmt: skip
        """(HTTP status, message) kube-apiserver would answer this pod's request with."""
        if not self.token_mounted():
            return 0, f"open {TOKEN_PATH}: no such file or directory"
        subject = Subject(self.namespace, self.service_account)
        if not allowed(self.cluster.store, subject, verb, group, resource, namespace, name):
            error = forbidden(subject.user, verb, group, resource, namespace, name)
            return 403, error.message
        if self.cluster.store.kind_at(group, version, resource) is None:
            return 404, "the server could not find the requested resource"
        return 200, ""
