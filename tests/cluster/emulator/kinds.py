"""The resource kinds the emulator serves, and the CRDs tests can install."""

from __future__ import annotations

from dataclasses import dataclass

from tests.cluster.emulator.errors import ApiError


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    subresources: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> str:
        return f"{self.group}/{self.version}/{self.plural}"

    @property
    def has_status(self) -> bool:
        return "status" in self.subresources

    def not_found(self, name: str) -> ApiError:
        return ApiError(
            404,
            "NotFound",
            f'{self.plural}{"." + self.group if self.group else ""} "{name}" not found',
            {"name": name, "group": self.group, "kind": self.plural},
        )


RBAC = "rbac.authorization.k8s.io"
BUILTIN_KINDS = [
    Kind("", "v1", "namespaces", "Namespace", False, ("status",)),
    Kind("", "v1", "nodes", "Node", False, ("status",)),
    Kind("", "v1", "pods", "Pod", True, ("status", "log", "eviction")),
    Kind("", "v1", "services", "Service", True, ("status", "proxy")),
    Kind("", "v1", "configmaps", "ConfigMap", True),
    Kind("", "v1", "secrets", "Secret", True),
    Kind("", "v1", "serviceaccounts", "ServiceAccount", True),
    Kind("", "v1", "events", "Event", True),
    Kind("apps", "v1", "daemonsets", "DaemonSet", True, ("status",)),
    Kind("apps", "v1", "deployments", "Deployment", True, ("status",)),
    Kind(RBAC, "v1", "roles", "Role", True),
    Kind(RBAC, "v1", "rolebindings", "RoleBinding", True),
    Kind(RBAC, "v1", "clusterroles", "ClusterRole", False),
    Kind(RBAC, "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    Kind("node.k8s.io", "v1", "runtimeclasses", "RuntimeClass", False),
    Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, ("status",)),
    Kind(
        "apiextensions.k8s.io",
        "v1",
        "customresourcedefinitions",
        "CustomResourceDefinition",
        False,
        ("status",),
    ),
]
# Dynamic Resource Allocation, GA in Kubernetes 1.34 (always served). Rules in dra.py.
DRA_KINDS = [
    Kind("resource.k8s.io", "v1", "deviceclasses", "DeviceClass", False),
    Kind("resource.k8s.io", "v1", "resourceclaims", "ResourceClaim", True, ("status",)),
    Kind("resource.k8s.io", "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True),
    Kind("resource.k8s.io", "v1", "resourceslices", "ResourceSlice", False),
]
BUILTIN_KINDS += DRA_KINDS
VERBS = ["create", "delete", "deletecollection", "get", "list", "patch", "update"]

# Custom resources a test can install (`ClusterEmulator.install_crd`).
SERVICEMONITOR_CRD = Kind("monitoring.coreos.com", "v1", "servicemonitors", "ServiceMonitor", True)
# Node Feature Discovery's API (kubernetes-sigs/node-feature-discovery
# deployment/base/nfd-crds/nfd-api-crds.yaml@76e6cc8cc0d54b8bce037098b72611ffdf66ef5a).
NODEFEATURE_CRD = Kind("nfd.k8s-sigs.io", "v1alpha1", "nodefeatures", "NodeFeature", True)
NODEFEATURERULE_CRD = Kind(
    "nfd.k8s-sigs.io", "v1alpha1", "nodefeaturerules", "NodeFeatureRule", False
)


def crd_object(kind: Kind) -> dict:
    """The CustomResourceDefinition object that serves `kind`."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{kind.plural}.{kind.group}"},
        "spec": {
            "group": kind.group,
            "names": {"plural": kind.plural, "kind": kind.kind},
            "scope": "Namespaced" if kind.namespaced else "Cluster",
            "versions": [{"name": kind.version, "served": True, "storage": True}],
        },
    }


def kind_of_crd(crd: dict) -> Kind:
    spec = crd.get("spec", {})
    version = next((v["name"] for v in spec.get("versions", []) if v.get("served", True)), "v1")
    return Kind(
        spec["group"],
        version,
        spec["names"]["plural"],
        spec["names"]["kind"],
        spec.get("scope", "Namespaced") == "Namespaced",
    )
