"""Per-node verification: GPUs on the host, capacity in the node, a GPU pod, metrics.

Checks per node, in order (a failed check skips the later ones for that node):
  node      the inventory host maps to a Node object
  gpus      host facts show NVIDIA GPUs with a loaded driver
  capacity  allocatable `nvidia.com/gpu` equals GPUs × gpus_per_device (capacity_timeout)
  pod       a pod pinned to the node (runtimeClass nvidia, all its GPUs) runs `nvidia-smi -L`
            and Succeeds within verify_timeout; its GPU UUIDs equal the host's
  vectoradd optional (gpustack_k8s_vector_add_image): the CUDA vectorAdd sample Succeeds
  dcgm      optional (gpustack_k8s_dcgm_scrape): dcgm-exporter reports DCGM_FI_DEV_GPU_TEMP
            for each of the node's GPUs (through the API server's service proxy)
Verification pods are deleted whatever happens (also on Ctrl-C).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpustack import doctor
from gpustack.cluster.connect import Clock, Cluster, call, status_message
from gpustack.errors import GpustackError
from gpustack.manifests import METRICS_PORT, ClusterConfig, render_verify_pod

RUN_LABEL = "gpustack.io/verify-run"
POLL_SECONDS = 1.0
PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass
class Check:
    name: str
    status: str
    message: str = ""
    seconds: float = 0.0


@dataclass
class NodeReport:
    host: str
    node: str
    gpus: int = 0
    uuids: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.status != FAILED for c in self.checks)

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    def add(self, name: str, status: str, message: str = "", seconds: float = 0.0) -> None:
        self.checks.append(Check(name, status, message, round(seconds, 2)))

    def failed(self) -> bool:
        return any(c.status == FAILED for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["passed"] = self.passed
        return data


@dataclass
class HostGpus:
    count: int
    uuids: list[str] | None  # None: no driver facts on this run
    driver_state: str
    loaded: bool


def host_gpus(facts: dict[str, Any]) -> HostGpus:
    """Pure: what the host facts say about GPUs (gpustack_preflight + gpustack_driver)."""
    pf = facts.get("gpustack_preflight") or {}
    count = int((pf.get("gpus") or {}).get("count") or 0)
    driver = facts.get("gpustack_driver") or {}
    smi = facts.get("gpustack_smi") or {}  # from playbooks/verify.yml
    uuids = None
    if driver.get("gpus") is not None and str(driver.get("nvidia_smi", {}).get("rc", "0")) == "0":
        uuids = [g["uuid"] for g in driver["gpus"] if str(g.get("uuid", "")).startswith("GPU-")]
    elif str(smi.get("rc")) == "0":
        uuids = csv_uuids(str(smi.get("stdout") or ""))
    state = doctor.driver_state(pf) if pf else "unknown (no preflight facts)"
    if driver.get("state"):
        state = str(driver["state"])
    return HostGpus(
        count, uuids, state, bool(pf and (pf.get("driver") or {}).get("loaded_version"))
    )


def csv_uuids(text: str) -> list[str]:
    """Pure: UUIDs from `nvidia-smi --query-gpu=name,uuid,... --format=csv,noheader`."""
    found = []
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 2 and parts[1].startswith("GPU-"):
            found.append(parts[1])
    return found


_SMI_GPU = re.compile(r"^GPU \d+: .*\(UUID: (GPU-[0-9a-fA-F-]+)\)\s*$")


def smi_uuids(text: str) -> list[str]:
    """Pure: GPU UUIDs from `nvidia-smi -L` output (MIG lines are ignored)."""
    return [m.group(1) for line in text.splitlines() if (m := _SMI_GPU.match(line.strip()))]


def compare_uuids(expected: list[str] | None, seen: list[str], exact: bool) -> tuple[bool, str]:
    """Pure: do the pod's GPUs match the host's?"""
    if not seen:
        return False, "nvidia-smi -L listed no GPU"
    if expected is None:
        return True, f"{len(seen)} GPU(s) seen (host UUIDs unknown: no driver facts)"
    missing = sorted(set(expected) - set(seen))
    extra = sorted(set(seen) - set(expected))
    if extra or (exact and missing):
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing)}")
        if extra:
            parts.append(f"not on the host {', '.join(extra)}")
        return False, "GPU UUID mismatch: " + "; ".join(parts)
    return True, f"{len(seen)} GPU(s), UUIDs match the host"


_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)"
)
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def metric_samples(text: str, name: str) -> list[dict[str, str]]:
    """Pure: label sets of every sample of metric `name` in Prometheus text format."""
    found = []
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and m["name"] == name:
            found.append(dict(_LABEL.findall(m["labels"] or "")))
    return found


# ----------------------------------------------------------------------------- the flow


@dataclass
class Target:
    """One inventory host to verify: its node (if found) and its facts."""

    host: str
    node_name: str
    node: dict[str, Any] | None
    facts: dict[str, Any]
    error: str = ""  # why this host cannot be verified (no node, host stack failed)


def verify(
    cluster: Cluster,
    config: ClusterConfig,
    targets: list[Target],
    *,
    operands: dict[str, tuple[bool, str]] | None = None,
    clock: Clock | None = None,
) -> list[NodeReport]:
    """Run every check on every target; return one report per host (never raises per node).

    `operands`: node name -> (ready, message) of the DaemonSets that select the node; a node
    whose operands are not ready fails there and skips the later checks.
    """
    clock = clock or Clock()
    reports: dict[str, NodeReport] = {}
    candidates: dict[str, tuple[NodeReport, HostGpus]] = {}
    for target in targets:
        report = NodeReport(target.host, target.node_name)
        reports[target.host] = report
        if target.error:
            report.add("host" if target.error.startswith("host") else "node", FAILED, target.error)
            continue
        report.add("node", PASSED, target.node_name)
        gpus = host_gpus(target.facts)
        report.gpus = gpus.count
        report.uuids = gpus.uuids or []
        if gpus.count == 0:  # never hidden: a GPU node without a GPU fails verification
            state = gpus.driver_state
            suffix = "" if "no NVIDIA device" in state else ": no NVIDIA device"
            report.add("gpus", FAILED, f"driver {state}{suffix}")
            continue
        if not gpus.loaded and not gpus.driver_state.startswith("loaded"):
            report.add("gpus", FAILED, f"{gpus.count} GPU(s), driver {gpus.driver_state}")
            continue
        report.add("gpus", PASSED, f"{gpus.count} GPU(s), driver {gpus.driver_state}")
        if operands is not None:
            ok, message = operands.get(target.node_name, (False, "no DaemonSet selects this node"))
            report.add("operands", PASSED if ok else FAILED, message)
            if not ok:
                continue
        candidates[target.host] = (report, gpus)
    ready = _wait_capacity(cluster, config, targets, candidates, clock)
    pods = {
        host: render_verify_pod(
            config,
            node_name=reports[host].node,
            gpus=gpus,
            name=_pod_name("smi", reports[host].node),
        )
        for host, gpus in ready.items()
    }
    for host, outcome in run_pods(cluster, pods, config.verify_timeout, clock).items():
        report = reports[host]
        if outcome.phase != "Succeeded":
            report.add("pod", FAILED, outcome.message, outcome.seconds)
            continue
        ok, message = compare_uuids(
            candidates[host][1].uuids, smi_uuids(outcome.log), exact=config.capacity_predictable
        )
        report.add("pod", PASSED if ok else FAILED, message, outcome.seconds)
    passing = {h: ready[h] for h in ready if not reports[h].failed()}
    if config.vector_add_image and passing:
        pods = {
            host: render_verify_pod(
                config,
                node_name=reports[host].node,
                gpus=1,
                name=_pod_name("vectoradd", reports[host].node),
                kind="vectoradd",
            )
            for host in passing
        }
        for host, outcome in run_pods(cluster, pods, config.verify_timeout, clock).items():
            ok = outcome.phase == "Succeeded"
            reports[host].add(
                "vectoradd", PASSED if ok else FAILED, outcome.message, outcome.seconds
            )
    if config.dcgm_scrape and passing:
        _check_dcgm(cluster, config, [reports[h] for h in passing], clock)
    return [reports[t.host] for t in targets]


def _pod_name(kind: str, node: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", node.lower()).strip("-")[:40].strip("-")
    return f"gpustack-verify-{kind}-{base}-{uuid.uuid4().hex[:5]}"


def _allocatable(node: dict[str, Any], resource: str) -> int:
    value = ((node.get("status") or {}).get("allocatable") or {}).get(resource, "0")
    try:
        return int(str(value))
    except ValueError:
        return 0


def _wait_capacity(cluster, config, targets, candidates, clock) -> dict[str, int]:
    """Poll nodes until each candidate shows its expected GPUs; returns host -> GPUs to request."""
    if not candidates:
        return {}
    resource = config.resource_name
    per = config.gpus_per_device
    expected = {h: g.count * per for h, (_, g) in candidates.items()}
    names = {t.host: t.node_name for t in targets if t.host in candidates}
    start = clock.now()
    while True:
        nodes = {n["metadata"]["name"]: n for n in cluster.list_all("/api/v1/nodes", "list nodes")}
        seen = {h: _allocatable(nodes.get(names[h]) or {}, resource) for h in candidates}
        if config.capacity_predictable:
            done = {h for h in candidates if seen[h] == expected[h]}
        else:
            done = {h for h in candidates if seen[h] > 0}
        elapsed = clock.now() - start
        if len(done) == len(candidates) or elapsed >= config.capacity_timeout:
            break
        clock.sleep(POLL_SECONDS)
    ready = {}
    for host, (report, gpus) in candidates.items():
        want = expected[host] if config.capacity_predictable else "at least 1"
        if host in done:
            report.add("capacity", PASSED, f"{resource}: {seen[host]}", elapsed)
            ready[host] = seen[host]
        else:
            sharing = f" × {per} ({config.sharing})" if per > 1 else ""
            report.add(
                "capacity",
                FAILED,
                f"allocatable {resource} is {seen[host]} after {config.capacity_timeout} s, "
                f"expected {want} ({gpus.count} GPU(s){sharing}); is the device plugin "
                f"running there? `kubectl -n {config.namespace} logs ds/nvidia-device-plugin`",
                elapsed,
            )
    return ready


@dataclass
class PodOutcome:
    phase: str
    log: str = ""
    message: str = ""
    seconds: float = 0.0


def run_pods(
    cluster: Cluster, pods: dict[str, dict[str, Any]], timeout: float, clock: Clock
) -> dict[str, PodOutcome]:
    """Create the pods, wait until each is done or `timeout`, read logs; always delete them."""
    if not pods:
        return {}
    run = uuid.uuid4().hex[:10]
    created: list[tuple[str, str]] = []
    outcomes: dict[str, PodOutcome] = {}
    try:
        for pod in pods.values():
            pod["metadata"].setdefault("labels", {})[RUN_LABEL] = run
            ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
            call(
                lambda p=pod, n=ns: cluster.raw(
                    "POST", f"/api/v1/namespaces/{n}/pods", body=p, ctype="application/json"
                ),
                f"create verification pod {name}",
            )
            created.append((ns, name))
        namespace = next(iter(pods.values()))["metadata"]["namespace"]
        by_name = {p["metadata"]["name"]: host for host, p in pods.items()}
        start = clock.now()
        current: dict[str, dict] = {}
        while True:
            listing = cluster.list_all(
                f"/api/v1/namespaces/{namespace}/pods",
                "list verification pods",
                labelSelector=f"{RUN_LABEL}={run}",
            )
            current = {p["metadata"]["name"]: p for p in listing}
            pending = [
                n
                for n in by_name
                if (current.get(n, {}).get("status") or {}).get("phase")
                not in ("Succeeded", "Failed")
            ]
            elapsed = clock.now() - start
            if not pending or elapsed >= timeout:
                break
            clock.sleep(POLL_SECONDS)
        for name, host in by_name.items():
            outcomes[host] = _outcome(cluster, namespace, name, current.get(name), timeout, elapsed)
    finally:
        for ns, name in created:
            _delete_pod(cluster, ns, name)
    return outcomes


def _outcome(cluster, namespace, name, pod, timeout, elapsed) -> PodOutcome:
    if pod is None:
        return PodOutcome(
            "Gone", message=f"pod {name} disappeared (deleted or evicted)", seconds=elapsed
        )
    status = pod.get("status") or {}
    phase = status.get("phase", "Pending")
    log = ""
    if phase in ("Succeeded", "Failed", "Running"):
        try:
            log = cluster.raw("GET", f"/api/v1/namespaces/{namespace}/pods/{name}/log")
        except ApiException:
            log = ""
        log = log if isinstance(log, str) else str(log)
    if phase == "Succeeded":
        return PodOutcome(phase, log, "Succeeded", elapsed)
    if phase == "Failed":
        term = _terminated(status)
        why = status.get("reason") or term.get("reason") or "Failed"
        detail = status.get("message") or term.get("message") or ""
        code = f" (exit code {term['exitCode']})" if "exitCode" in term else ""
        tail = " | ".join(log.strip().splitlines()[-3:])
        text = f"pod {name} failed: {why}{code}" + (f": {detail}" if detail else "")
        return PodOutcome(phase, log, text + (f"; log: {tail}" if tail else ""), elapsed)
    why = _stuck_reason(cluster, namespace, name, status)
    return PodOutcome(phase, log, f"pod {name} still {phase} after {timeout:.0f} s: {why}", elapsed)


def _terminated(status: dict) -> dict:
    for container in status.get("containerStatuses") or []:
        term = (container.get("state") or {}).get("terminated")
        if term:
            return term
    return {}


def _stuck_reason(cluster: Cluster, namespace: str, name: str, status: dict) -> str:
    """The scheduler's or kubelet's own words: PodScheduled condition, waiting state, events."""
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"{cond.get('reason', 'Unschedulable')}: {cond.get('message', '')}".strip()
    for container in status.get("containerStatuses") or []:
        waiting = (container.get("state") or {}).get("waiting")
        if waiting:
            return f"{waiting.get('reason', 'Waiting')}: {waiting.get('message', '')}".strip(": ")
    try:
        events = cluster.raw(
            "GET",
            f"/api/v1/namespaces/{namespace}/events",
            [("fieldSelector", f"involvedObject.name={name}")],
        ).get("items", [])
    except ApiException:
        events = []
    if events:
        last = events[-1]
        return f"{last.get('reason', '')}: {last.get('message', '')}".strip(": ")
    return "no scheduling message (is a scheduler and kubelet running?)"


def _delete_pod(cluster: Cluster, namespace: str, name: str) -> None:
    try:
        cluster.raw(
            "DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}", [("gracePeriodSeconds", 0)]
        )
    except ApiException as exc:
        if exc.status != 404:
            raise GpustackError(
                f"cannot delete verification pod {namespace}/{name}: {status_message(exc)}",
                f"delete it by hand: kubectl -n {namespace} delete pod {name}",
            ) from None


def _check_dcgm(cluster: Cluster, config: ClusterConfig, reports: list[NodeReport], clock) -> None:
    """DCGM_FI_DEV_GPU_TEMP per GPU, through the service proxy.

    The proxy reaches one dcgm-exporter pod per request, so it is asked repeatedly (up to
    3 × nodes times) until every node's GPUs were seen.
    """
    path = (
        f"/api/v1/namespaces/{config.namespace}/services/dcgm-exporter:{METRICS_PORT}/proxy/metrics"
    )
    seen_uuids: set[str] = set()
    per_host: dict[str, int] = {}
    error = ""
    start = clock.now()
    for _ in range(max(3, 3 * len(reports))):
        try:
            text = cluster.raw("GET", path)
        except ApiException as exc:
            error = status_message(exc)
            break
        for labels in metric_samples(str(text), "DCGM_FI_DEV_GPU_TEMP"):
            if labels.get("UUID"):
                seen_uuids.add(labels["UUID"])
            host = labels.get("Hostname", "")
            per_host[host] = per_host.get(host, 0) + 1
        if all(_dcgm_ok(r, seen_uuids, per_host)[0] for r in reports):
            break
    elapsed = clock.now() - start
    for report in reports:
        if error:
            report.add("dcgm", FAILED, f"cannot scrape dcgm-exporter: {error}", elapsed)
            continue
        ok, message = _dcgm_ok(report, seen_uuids, per_host)
        report.add("dcgm", PASSED if ok else FAILED, message, elapsed)


def _dcgm_ok(report: NodeReport, seen: set[str], per_host: dict[str, int]) -> tuple[bool, str]:
    if report.uuids:
        missing = [u for u in report.uuids if u not in seen]
        if missing:
            return False, f"no DCGM_FI_DEV_GPU_TEMP sample for {', '.join(missing)}"
        return True, f"DCGM_FI_DEV_GPU_TEMP for {len(report.uuids)} GPU(s)"
    count = per_host.get(report.node, 0)
    if count < report.gpus:
        return (
            False,
            f"{count} DCGM_FI_DEV_GPU_TEMP sample(s) from {report.node}, expected {report.gpus}",
        )
    return True, f"DCGM_FI_DEV_GPU_TEMP for {count} GPU(s)"
