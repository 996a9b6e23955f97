"""The Kubernetes phase of install, verify and uninstall, in the GPU Operator's order.

install: host stack ready on a host (its play succeeded) → label its node → apply the
operands → wait for the DaemonSets on the labelled nodes → verify every node.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from gpustack.ansible.inventory import Inventory
from gpustack.ansible.results import RunResult
from gpustack.fleet.mig import derive_strategy
from gpustack.k8s.cluster import apply, dra, gfd, nodes
from gpustack.k8s.cluster.connect import Clock, Cluster, check_reachable, connect
from gpustack.k8s.cluster.verify import NodeReport, Target, verify
from gpustack.k8s.manifests import ClusterConfig, config_from_inventory, node_labels, render

MIG_STRATEGY_VAR = "gpustack_k8s_mig_strategy"


@dataclass
class Session:
    """A reachable cluster and the configuration for it, checked before any host is touched."""

    cluster: Cluster
    config: ClusterConfig
    version: str
    node_names: dict[str, str]  # inventory host -> expected Node name
    hostvars: dict[str, dict[str, Any]]
    mig_strategy_set: bool = True  # the user chose gpustack_k8s_mig_strategy (else derived)


def prepare(
    kubeconfig: str | None,
    inventory,
    extravars: dict[str, Any],
    *,
    required: bool = True,
    workloads: bool = False,
) -> Session | None:
    """Validate gpustack_k8s_* and reach the API server; BadInput on any mistake.

    `workloads` (install, verify): also what GPU pods will need of the cluster beyond
    gpustack's objects (under gpu_allocation=volcano, Volcano's scheduler set for vGPU)."""
    config = config_from_inventory(inventory, extravars)  # group_vars too, as a play sees them
    cluster = connect(kubeconfig, required=required)
    if cluster is None:
        return None
    version = check_reachable(cluster)
    config = config.for_cluster(version)  # HAMi's kube-scheduler: the cluster's version
    if config.dra:  # before any host or object is touched
        dra.require_api(cluster, version)
    if config.volcano and workloads:
        from gpustack.k8s.cluster import volcano as volcano_cluster

        volcano_cluster.require_ready(cluster, config)
    names = {h: nodes.node_name_for(h, inventory.hostvars.get(h) or {}) for h in inventory.hosts}
    return Session(cluster, config, version, names, inventory.hostvars,
                   mig_strategy_set=strategy_set(inventory, extravars))  # fmt: skip


def strategy_set(inventory, extravars: dict[str, Any]) -> bool:
    """Whether gpustack_k8s_mig_strategy is set (-e, inventory, group_vars/host_vars)."""
    if MIG_STRATEGY_VAR in extravars:
        return True
    if isinstance(inventory, Inventory):
        from gpustack.k8s.manifests_vars import inventory_k8s_vars

        return any(MIG_STRATEGY_VAR in v for v in inventory_k8s_vars(inventory).values())
    return any(MIG_STRATEGY_VAR in v for v in (inventory or {}).values())


def derived_config(session: Session, targets) -> ClusterConfig:
    """The configuration to deploy: the MIG strategy derived from the layouts the nvidia_mig
    role applied on these hosts (its `gpustack_mig` facts) unless the user set one."""
    layouts = {t.host: (t.facts.get("gpustack_mig") or {}).get("gpus") for t in targets}
    layouts = {h: g for h, g in layouts.items() if g}
    if session.mig_strategy_set or not layouts or session.config.mps_replicas > 1:
        return session.config
    strategy = derive_strategy({h: g for h, g in layouts.items()}, desired=False)
    return session.config.model_copy(update={"mig_strategy": strategy})


@dataclass
class ClusterReport:
    server: str
    version: str
    check_mode: bool = False
    applied: list[apply.Applied] = field(default_factory=list)
    labels: dict[str, dict[str, str | None]] = field(default_factory=dict)  # node -> patch
    daemonsets: list[apply.RolloutResult] = field(default_factory=list)
    nodes: list[NodeReport] = field(default_factory=list)
    nfd_api: bool = False  # NFD's NodeFeature API served (GFD's mode under gfd_mode=auto)
    gfd_mode: str = ""  # node-feature-api or feature-file, as rendered ("" with GFD off)
    mig_strategy: str = ""  # as deployed by install (derived from the layouts unless set)
    removed: list[str] = field(default_factory=list)  # gpustack's, no longer rendered
    gpu_allocation: str = ""  # gpustack_k8s_gpu_allocation: device-plugin, dra, hami, volcano

    @property
    def passed(self) -> bool:
        return all(n.passed for n in self.nodes)

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "version": self.version,
            "check_mode": self.check_mode,
            "applied": [{**asdict(a), "ref": a.ref} for a in self.applied],
            "labels": self.labels,
            "removed": self.removed,
            "daemonsets": [asdict(d) for d in self.daemonsets],
            "gfd": {"mode": self.gfd_mode, "nfd_api": self.nfd_api},
            "mig_strategy": self.mig_strategy,
            "gpu_allocation": self.gpu_allocation,
            "nodes": {n.host: n.to_dict() for n in self.nodes},
            "passed": self.passed,
        }


def _host_problem(result: RunResult, host: str) -> str:
    """Why a host's stack is not ready ('' when its play succeeded)."""
    hr = result.hosts.get(host)
    if hr is None or hr.status == "not run":
        return "host stack not ready: the host play did not run on it"
    if hr.unreachable:
        return f"host stack not ready: unreachable ({hr.unreachable_message[:200]})"
    if hr.stopped and not hr.failed:
        return "host stack not ready: the run ended before the host play did"
    if hr.failed:
        last = hr.failures[-1] if hr.failures else None
        detail = f" ({last.task}: {last.message[:200]})" if last else ""
        return f"host stack not ready: a task failed{detail}"
    return ""


def _targets(session: Session, result: RunResult, matches) -> list[Target]:
    targets = []
    for host, name in session.node_names.items():
        match = matches[host]
        facts = result.hosts[host].facts if host in result.hosts else {}
        error = _host_problem(result, host)
        if not error and match.node is None:
            error = f"{match.error}. Hint: {match.hint}"
        targets.append(Target(host, name, match.node, facts, error))
    return targets


def _operands(results: list[apply.RolloutResult], labelled: list[str]) -> dict[str, tuple]:
    """node -> (ready, message) over the DaemonSets that must run there, each judged by its pod
    on that node: a DaemonSet not ready on another node does not fail this one."""
    state = {}
    # a missing DaemonSet and a Deployment (HAMi's scheduler) concern every node
    everywhere = [r for r in results if r.message.startswith("not found") or r.kind != "DaemonSet"]
    for node in labelled:
        mine = [r for r in results if node in r.nodes] + everywhere
        bad = [(r.kind, r.name, r.problems.get(node, r.message)) for r in mine
               if not r.ready and (not r.nodes or node in r.problems)]  # fmt: skip
        if not [r for r in mine if r.kind == "DaemonSet"]:
            state[node] = (False, "no gpustack DaemonSet selects this node (labels missing?)")
        elif bad:
            state[node] = (False, "; ".join(f"{kind} {name} {why}" for kind, name, why in bad))
        else:
            state[node] = (True, ", ".join(sorted(r.name for r in mine)))
    return state


def _objects(session: Session, report: ClusterReport | None = None) -> list[dict[str, Any]]:
    """What to apply for this cluster: ServiceMonitor only with its CRD, GFD's mode by NFD."""
    config = session.config
    nfd_api = gfd.nfd_api_served(session.cluster) if config.gfd_enabled else False
    if report is not None:
        report.nfd_api = nfd_api
        if config.gfd_enabled:
            api = config.gfd_node_feature_api(nfd_api)
            report.gfd_mode = "node-feature-api" if api else "feature-file"
    return render(config, servicemonitor=apply.crd_exists(session.cluster), nfd_api=nfd_api)


def install(
    session: Session, result: RunResult, *, check: bool = False, clock: Clock | None = None
) -> ClusterReport:
    cluster, config = session.cluster, session.config
    report = ClusterReport(cluster.api.configuration.host, session.version, check_mode=check)
    report.gpu_allocation = config.gpu_allocation
    matches = nodes.find_nodes(cluster, session.node_names, session.hostvars)
    targets = _targets(session, result, matches)
    session.config = config = derived_config(session, targets)
    report.mig_strategy = config.mig_strategy
    objects = _objects(session, report)
    apply.runtime_classes_of_others(cluster, objects)  # a refusal comes before any label
    labelled: dict[str, dict[str, str]] = {}
    for target in targets:
        if target.error or target.node is None:
            continue
        meta = target.node.get("metadata") or {}
        existing = dict(meta.get("labels") or {})
        wanted = node_labels(target.facts.get("gpustack_preflight") or {}, existing, config)
        patch = nodes.label_patch(target.node, wanted)
        if wanted:
            report.labels[target.node_name] = wanted
        if patch and not check:
            nodes.patch_node(cluster, target.node_name, patch)
        new_labels = {**existing, **{k: v for k, v in wanted.items() if v is not None}}
        for key in [k for k, v in wanted.items() if v is None]:
            new_labels.pop(key, None)
        labelled[target.node_name] = new_labels
    report.applied = apply.apply_objects(cluster, objects, dry_run=check)
    every = _every_setting(session, objects)
    kinds = _namespaced_kinds(every)
    report.removed = apply.prune(cluster, config.namespace, objects, kinds, dry_run=check)
    # objects other settings place outside gpustack's namespace (Volcano's in kube-system)
    rendered = {_ref(o) for o in objects}
    report.removed += apply.delete_elsewhere(
        cluster, [o for o in every if _ref(o) not in rendered], config.namespace, dry_run=check
    )
    if check:
        return report
    _rollout_and_verify(session, report, objects, targets, labelled, clock)
    return report


def _rollout_and_verify(session, report, objects, targets, labelled, clock) -> None:
    config = session.config

    def named(kind: str) -> list[str]:
        return [o["metadata"]["name"] for o in objects if o["kind"] == kind]

    report.daemonsets = apply.wait_daemonsets(
        session.cluster, config.namespace, named("DaemonSet"), labelled,
        config.daemonset_timeout, clock, deployments=named("Deployment"),
    )  # fmt: skip
    operands = _operands(report.daemonsets, list(labelled))
    report.nodes = verify(
        session.cluster, config, targets, operands=operands, nfd_api=report.nfd_api, clock=clock
    )


def verify_cluster(
    session: Session, result: RunResult, *, clock: Clock | None = None
) -> ClusterReport:
    """`gpustack verify`: read-only host facts are in `result`; check the cluster side."""
    cluster = session.cluster
    report = ClusterReport(cluster.api.configuration.host, session.version)
    report.gpu_allocation = session.config.gpu_allocation
    if not session.mig_strategy_set:  # the strategy install derived and deployed
        from gpustack.k8s.cluster.mig import deployed_strategy

        deployed = deployed_strategy(cluster, session.config.namespace)
        if deployed in ("none", "single", "mixed"):
            session.config = session.config.model_copy(update={"mig_strategy": deployed})
    report.mig_strategy = session.config.mig_strategy
    matches = nodes.find_nodes(cluster, session.node_names, session.hostvars)
    targets = _targets(session, result, matches)
    labelled = {
        t.node_name: dict((t.node.get("metadata") or {}).get("labels") or {})
        for t in targets
        if t.node is not None and not t.error
    }
    _rollout_and_verify(session, report, _objects(session, report), targets, labelled, clock)
    return report


def _every_setting(session: Session, objects=None) -> list[dict[str, Any]]:
    """The objects of the current setting (`objects`, else rendered) and of the other GPU
    allocations, every operand on: after a switch of gpustack_k8s_gpu_allocation or an operand
    turned off, the other settings' objects (the DRA driver's DeviceClasses and RBAC, HAMi's
    scheduler and RBAC, or the device plugin's; GFD's, dcgm-exporter's) are still gpustack's to
    delete."""
    config = session.config
    # the settings that only NVIDIA's device plugin takes, at their defaults (render only)
    unshared = {"time_slicing_replicas": 1, "mps_replicas": 1, "compat_with_cpu_manager": False,
                "mig_strategy": "none"}  # fmt: skip
    every_operand = {"gfd_enabled": True, "dcgm_exporter_enabled": True}
    others = [
        config.model_copy(update={"gpu_allocation": other, **unshared, **every_operand})
        for other in ("device-plugin", "dra", "hami", "volcano")
        if other != config.gpu_allocation
    ]
    # only their names and kinds are used: HAMi's kube-scheduler tag need not be the cluster's
    others = [o.for_cluster(session.version or "v0.0.0") for o in others]
    this_config = config.model_copy(update=every_operand)
    servicemonitor = apply.crd_exists(session.cluster)
    return [
        *(_objects(session) if objects is None else objects),
        *render(this_config, servicemonitor=servicemonitor, nfd_api=False),
        *(obj for o in others for obj in render(o, servicemonitor=servicemonitor, nfd_api=False)),
    ]


def _ref(obj: dict[str, Any]) -> tuple[str, str, str | None, str]:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"]


def _namespaced_kinds(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(apiVersion, kind) of the namespaced objects, in the order first met."""
    kinds: list[tuple[str, str]] = []
    for obj in objects:
        key = (obj["apiVersion"], obj["kind"])
        if obj["metadata"].get("namespace") and key not in kinds:
            kinds.append(key)
    return kinds


def uninstall(session: Session) -> dict[str, Any]:
    """Delete gpustack's objects (by label) and the node labels gpustack recorded."""
    cluster = session.cluster
    every = _every_setting(session)
    deleted, kept = apply.delete_managed(cluster, every, session.config.namespace)
    deleted += apply.delete_elsewhere(cluster, every, session.config.namespace)
    unlabelled = []
    for node in cluster.list_all("/api/v1/nodes", "list nodes"):
        patch = nodes.unlabel_patch(node)
        if patch:
            nodes.patch_node(cluster, node["metadata"]["name"], patch)
            unlabelled.append(node["metadata"]["name"])
    return {"deleted": deleted, "kept": kept, "unlabelled_nodes": unlabelled}
