"""JUnit XML for CI systems: one testcase per host per check (install and verify)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpustack.ansible.results import RunResult
from gpustack.errors import BadInput


@dataclass
class Case:
    classname: str  # the host
    name: str  # the check
    status: str  # passed, failed, skipped, error
    message: str = ""
    seconds: float = 0.0


def host_cases(result: RunResult) -> list[Case]:
    """Host-stack checks per host: reachable, every task succeeded, driver loaded."""
    cases = []
    for host in result.hosts.values():
        if host.unreachable:
            cases.append(Case(host.name, "reachable", "failed", host.unreachable_message))
            continue
        if host.status == "not run":
            cases.append(Case(host.name, "reachable", "skipped", "the play did not run here"))
            continue
        cases.append(Case(host.name, "reachable", "passed"))
        if host.stopped and not host.failures:
            message = "the run ended before this host's play did (canceled, or the playbook died)"
            cases.append(Case(host.name, "host stack", "failed", message))
        elif host.failures:
            last = host.failures[-1]
            text = f"{last.role} : {last.task}: {last.message}".strip(" :")
            cases.append(Case(host.name, "host stack", "failed", text))
        else:
            cases.append(Case(host.name, "host stack", "passed", f"{host.changed} change(s)"))
        driver = host.facts.get("gpustack_driver")
        if isinstance(driver, dict) and driver.get("state"):
            state = str(driver["state"])
            status = "passed" if state.startswith("loaded") else "failed"
            if "no NVIDIA device" in state:
                status = "skipped"  # reported, not a host-stack failure (verify fails it)
            cases.append(Case(host.name, "driver loaded", status, state))
    return cases


def node_cases(reports: Iterable[Any]) -> list[Case]:
    """Cluster checks per host from gpustack.k8s.cluster.verify.NodeReport objects."""
    return [
        Case(r.host, f"k8s {c.name}", c.status, c.message, c.seconds)
        for r in reports
        for c in r.checks
    ]


def write(path: str | Path, suite: str, cases: list[Case]) -> None:
    root = ET.Element("testsuites")
    element = ET.SubElement(
        root,
        "testsuite",
        name=suite,
        tests=str(len(cases)),
        failures=str(sum(c.status == "failed" for c in cases)),
        errors=str(sum(c.status == "error" for c in cases)),
        skipped=str(sum(c.status == "skipped" for c in cases)),
        time=f"{sum(c.seconds for c in cases):.2f}",
    )
    for case in cases:
        node = ET.SubElement(
            element,
            "testcase",
            classname=case.classname,
            name=case.name,
            time=f"{case.seconds:.2f}",
        )
        if case.status in ("failed", "error", "skipped"):
            tag = {"failed": "failure", "error": "error", "skipped": "skipped"}[case.status]
            child = ET.SubElement(node, tag, message=case.message[:500])
            child.text = case.message
        elif case.message:
            ET.SubElement(node, "system-out").text = case.message
    ET.indent(root)
    target = Path(path).expanduser()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        ET.ElementTree(root).write(target, encoding="utf-8", xml_declaration=True)
    except OSError as exc:
        raise BadInput(
            f"cannot write JUnit file {path}: {exc.strerror}", "choose a writable path for --junit"
        ) from None
