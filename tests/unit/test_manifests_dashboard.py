"""The shipped Grafana dashboard queries only metrics gpustack's dcgm-exporter exports."""

from __future__ import annotations

import json
import re

from gpustack import paths
from gpustack.k8s.manifests import default_counters

DASHBOARD = paths.templates_dir() / "grafana" / "gpustack-gpus.json"
METRIC = re.compile(r"\bDCGM_FI_[A-Z0-9_]+\b")


def _exported() -> dict[str, str]:
    """{field: type} from the default counters CSV (comments and blank lines skipped)."""
    fields = {}
    for line in default_counters().splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, kind, help_text = (part.strip() for part in line.split(",", 2))
        assert kind in ("gauge", "counter", "label"), line
        assert help_text, line
        fields[name] = kind
    return fields


def _expressions(dashboard: dict) -> list[str]:
    found = []
    for panel in dashboard["panels"]:
        found.extend(t["expr"] for t in panel.get("targets", []))
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            found.append(variable["definition"])
    return found


def test_dashboard_is_valid_json_with_panels():
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dashboard["uid"] and dashboard["title"]
    assert len(dashboard["panels"]) >= 8
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
    for panel in dashboard["panels"]:
        assert panel["targets"], panel["title"]


def test_every_dashboard_metric_is_in_the_default_counters():
    exported = _exported()
    used = {
        m for expr in _expressions(json.loads(DASHBOARD.read_text())) for m in METRIC.findall(expr)
    }
    assert {"DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"} <= used
    missing = used - set(exported)
    assert not missing, f"dashboard queries metrics dcgm-exporter will not export: {missing}"
    for metric in used:  # rate() only makes sense on counters
        for expr in _expressions(json.loads(DASHBOARD.read_text())):
            if f"rate({metric}" in expr:
                assert exported[metric] == "counter", metric


def test_counters_have_no_duplicates():
    names = [
        line.split(",")[0].strip()
        for line in default_counters().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    assert len(names) == len(set(names))
