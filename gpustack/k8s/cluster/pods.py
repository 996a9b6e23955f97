"""Short-lived pods gpustack runs on a node (verification, vectorAdd): create, wait, read, delete.

Pods carry `gpustack.io/verify-run=<run id>` and are deleted whatever happens (Ctrl-C too).
A pod that does not finish is described in the scheduler's or kubelet's own words.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from typing import Any

from kubernetes.client.exceptions import ApiException

from gpustack.errors import GpustackError
from gpustack.k8s.cluster.connect import Clock, Cluster, api_hint, call, status_message

RUN_LABEL = "gpustack.io/verify-run"
POLL_SECONDS = 1.0


def pod_name(kind: str, node: str) -> str:
    base = re.sub(r"[^a-z0-9-]+", "-", node.lower()).strip("-")[:40].strip("-")
    return f"gpustack-verify-{kind}-{base}-{uuid.uuid4().hex[:5]}"


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
            delete_pod(cluster, ns, name)
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
    why = stuck_reason(cluster, namespace, name, status)
    return PodOutcome(phase, log, f"pod {name} still {phase} after {timeout:.0f} s: {why}", elapsed)


def _terminated(status: dict) -> dict:
    for container in status.get("containerStatuses") or []:
        term = (container.get("state") or {}).get("terminated")
        if term:
            return term
    return {}


def stuck_reason(cluster: Cluster, namespace: str, name: str, status: dict) -> str:
    """The scheduler's or kubelet's own words: PodScheduled condition, waiting state, events.

    A bare `ContainerCreating` says nothing; the kubelet's latest Warning event (sandbox,
    mount or pull failures) does, so it wins over a waiting reason without a message.
    """
    for cond in status.get("conditions") or []:
        if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
            return f"{cond.get('reason', 'Unschedulable')}: {cond.get('message', '')}".strip()
    waiting = next(
        (
            (c.get("state") or {}).get("waiting")
            for c in status.get("containerStatuses") or []
            if (c.get("state") or {}).get("waiting")
        ),
        None,
    )
    if waiting and waiting.get("message"):
        return f"{waiting.get('reason', 'Waiting')}: {waiting['message']}"
    try:
        events = cluster.raw(
            "GET",
            f"/api/v1/namespaces/{namespace}/events",
            [("fieldSelector", f"involvedObject.name={name}")],
        ).get("items", [])
    except ApiException:
        events = []
    warnings = [e for e in events if e.get("type") == "Warning"] or events
    if warnings:
        last = warnings[-1]
        return f"{last.get('reason', '')}: {last.get('message', '')}".strip(": ")
    if waiting:
        return str(waiting.get("reason", "Waiting"))
    return "no scheduling message (is a scheduler and kubelet running?)"


def delete_pod(cluster: Cluster, namespace: str, name: str) -> None:
    """Delete with the pod's own grace period, never force: a pod still running stays in the
    API (Terminating) until its kubelet has stopped it and given its GPU back, so the scheduler
    keeps counting that GPU as taken (the API server makes the deletion of a pod that has
    finished or was never scheduled immediate anyway)."""
    try:
        cluster.raw("DELETE", f"/api/v1/namespaces/{namespace}/pods/{name}")
    except ApiException as exc:
        if exc.status != 404:
            raise GpustackError(
                f"cannot delete verification pod {namespace}/{name}: {status_message(exc)}",
                f"delete it by hand: kubectl -n {namespace} delete pod {name}",
            ) from None


VOLCANO_JOBS = "/apis/batch.volcano.sh/v1alpha1/namespaces/{namespace}/jobs"
JOB_LABEL = "gpustack.io/verify-job"  # on a Volcano Job's pod template: which Job a pod is of


def job_name(node: str) -> str:
    """A Volcano Job name (its pods carry it in a label, so at most 63 characters)."""
    base = re.sub(r"[^a-z0-9-]+", "-", node.lower()).strip("-")[:40].strip("-")
    return f"gpustack-share-{base}-{uuid.uuid4().hex[:5]}"


def run_volcano_jobs(
    cluster: Cluster, jobs: dict[str, dict[str, Any]], pods_each: int, timeout: float, clock: Clock
) -> dict[str, list[PodOutcome] | str]:
    """Create the Volcano Jobs, wait until each has `pods_each` finished pods or `timeout`, read
    their logs; always delete the Jobs and their pods. host -> the pods' outcomes, or why the
    Job got no such outcomes (its API not served, too few pods created)."""
    if not jobs:
        return {}
    run = uuid.uuid4().hex[:10]
    namespace = next(iter(jobs.values()))["metadata"]["namespace"]
    created: list[str] = []
    out: dict[str, list[PodOutcome] | str] = {}
    try:
        for host, job in jobs.items():
            name = job["metadata"]["name"]
            job["metadata"].setdefault("labels", {})[RUN_LABEL] = run
            for task in job["spec"]["tasks"]:
                labels = task["template"].setdefault("metadata", {}).setdefault("labels", {})
                labels.update({RUN_LABEL: run, JOB_LABEL: name})
            try:
                cluster.raw("POST", VOLCANO_JOBS.format(namespace=namespace), body=job,
                            ctype="application/json")  # fmt: skip
            except ApiException as exc:
                if exc.status == 404:
                    out[host] = (
                        "the cluster does not serve Volcano's Job API (batch.volcano.sh/v1alpha1):"
                        " is Volcano installed?"
                    )
                    continue
                raise GpustackError(
                    f"cannot create Volcano Job {namespace}/{name}: {status_message(exc)}",
                    api_hint(exc),
                ) from None
            created.append(name)
        by_job = {j["metadata"]["name"]: h for h, j in jobs.items() if h not in out}
        start = clock.now()
        groups: dict[str, list[dict]] = {}
        while by_job:
            listing = cluster.list_all(
                f"/api/v1/namespaces/{namespace}/pods",
                "list verification pods",
                labelSelector=f"{RUN_LABEL}={run}",
            )
            groups = {name: [] for name in by_job}
            for pod in listing:
                job = (pod["metadata"].get("labels") or {}).get(JOB_LABEL)
                if job in groups:
                    groups[job].append(pod)
            done = all(
                len(pods) >= pods_each and all(_phase(p) in ("Succeeded", "Failed") for p in pods)
                for pods in groups.values()
            )
            elapsed = clock.now() - start
            if done or elapsed >= timeout:
                break
            clock.sleep(POLL_SECONDS)
        for name, host in by_job.items():
            pods = sorted(groups.get(name, []), key=lambda p: p["metadata"]["name"])
            if len(pods) < pods_each:
                out[host] = (
                    f"Volcano created {len(pods)} of {pods_each} pods for Job {name} in "
                    f"{timeout:.0f} s ({_job_state(cluster, namespace, name)}): are Volcano's "
                    "controllers and scheduler running, with deviceshare.VGPUEnable?"
                )
                continue
            out[host] = [
                _outcome(cluster, namespace, p["metadata"]["name"], p, timeout, elapsed)
                for p in pods
            ]
    finally:
        for name in created:
            try:
                cluster.raw("DELETE", f"{VOLCANO_JOBS.format(namespace=namespace)}/{name}",
                            body={"propagationPolicy": "Background"},
                            ctype="application/json")  # fmt: skip
            except ApiException as exc:
                if exc.status != 404:
                    raise GpustackError(
                        f"cannot delete Volcano Job {namespace}/{name}: {status_message(exc)}",
                        f"delete it by hand: kubectl -n {namespace} delete jobs.batch.volcano.sh "
                        f"{name}",
                    ) from None
        if created:  # their pods too: Volcano's controller may be gone, the GC may be late
            for pod in cluster.list_all(
                f"/api/v1/namespaces/{namespace}/pods",
                "list verification pods",
                labelSelector=f"{RUN_LABEL}={run}",
            ):
                delete_pod(cluster, namespace, pod["metadata"]["name"])
    return out


def _phase(pod: dict) -> str:
    return (pod.get("status") or {}).get("phase", "Pending")


def _job_state(cluster: Cluster, namespace: str, name: str) -> str:
    try:
        job = cluster.raw("GET", f"{VOLCANO_JOBS.format(namespace=namespace)}/{name}")
    except ApiException:
        return "Job state unknown"
    state = ((job.get("status") or {}).get("state") or {}).get("phase")
    return f"Job phase {state}" if state else "the Job has no status: no Volcano controller?"
