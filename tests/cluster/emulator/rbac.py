"""RBAC as kube-apiserver's authorizer evaluates it, for the ServiceAccounts of emulated pods.

Rules come from Roles and ClusterRoles bound by RoleBindings (namespace-scoped grant; a
RoleBinding may reference a ClusterRole) and ClusterRoleBindings (cluster-wide). A rule
matches on apiGroups, resources (`*`, `pods/log` for subresources), verbs (`*`) and
resourceNames (never for list/watch/create without a name). Subjects: ServiceAccount (name +
namespace), User `system:serviceaccount:NS:NAME`, Groups `system:serviceaccounts`,
`system:serviceaccounts:NS`, `system:authenticated`. Not modelled: aggregated ClusterRoles,
the bootstrap roles (nothing but explicit grants exists), impersonation, Node authorizer.
The test client itself (kubeconfig token) is not subject to RBAC: it acts as cluster-admin.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.cluster.emulator.store import Store


@dataclass(frozen=True)
class Subject:
    namespace: str
    name: str

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"

    @property
    def groups(self) -> set[str]:
        return {"system:serviceaccounts", f"system:serviceaccounts:{self.namespace}",
                "system:authenticated"}  # fmt: skip


def _binds(binding: dict, subject: Subject) -> bool:
    for s in binding.get("subjects") or []:
        kind = s.get("kind")
        if (
            kind == "ServiceAccount"
            and s.get("name") == subject.name
            and (s.get("namespace") or binding["metadata"].get("namespace")) == subject.namespace
        ):
            return True
        if kind == "User" and s.get("name") == subject.user:
            return True
        if kind == "Group" and s.get("name") in subject.groups:
            return True
    return False


def _rule_allows(rule: dict, verb: str, group: str, resource: str, name: str | None) -> bool:
    def has(values, value):
        return "*" in (values or []) or value in (values or [])

    if not has(rule.get("verbs"), verb) or not has(rule.get("apiGroups"), group):
        return False
    if not has(rule.get("resources"), resource):
        return False
    names = rule.get("resourceNames") or []
    return not names or (name is not None and name in names)


def allowed(store: Store, subject: Subject, verb: str, group: str, resource: str,
            namespace: str | None, name: str | None = None) -> bool:  # fmt: skip
    kinds = store.kinds
    rbac = "rbac.authorization.k8s.io/v1"

    def rules(ref: dict, ns: str | None) -> list[dict]:
        if ref.get("kind") == "ClusterRole":
            role = store.get(kinds[f"{rbac}/clusterroles"], None, ref.get("name", ""))
        else:
            role = store.get(kinds[f"{rbac}/roles"], ns, ref.get("name", ""))
        return (role or {}).get("rules") or []

    for binding in store.items(kinds[f"{rbac}/clusterrolebindings"]):
        if _binds(binding, subject) and any(
            _rule_allows(r, verb, group, resource, name)
            for r in rules(binding.get("roleRef") or {}, None)
        ):
            return True
    if namespace is None:
        return False
    for binding in store.items(kinds[f"{rbac}/rolebindings"], namespace):
        if _binds(binding, subject) and any(
            _rule_allows(r, verb, group, resource, name)
            for r in rules(binding.get("roleRef") or {}, namespace)
        ):
            return True
    return False
