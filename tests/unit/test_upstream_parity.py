"""docs/upstream-parity.yaml against the rendered manifests: later drift fails here.

Every row of the table names where a field lives and gpustack's value per scenario; these
tests render every scenario and compare, and check that docs/upstream-parity.md is the
Markdown generated from the table (python scripts/upstream_parity.py --write).
"""

from __future__ import annotations

import copy
import importlib.util
import re

import pytest

from tests.conftest import ROOT

SPEC = importlib.util.spec_from_file_location(
    "upstream_parity", ROOT / "scripts" / "upstream_parity.py"
)
parity = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(parity)

DATA = parity.load()
ROWS = [(operand, row) for operand in DATA["operands"] for row in operand["rows"]]


def test_rendered_manifests_match_the_table_in_every_scenario():
    drift, compared, _ = parity.mismatches(DATA)
    assert drift == []
    # 7 scenarios x ~100 rows, minus objects a scenario does not render
    assert compared > 550


def test_only_rows_of_the_pending_gfd_design_are_not_checkable():
    """Nothing is skipped silently: rows waiting for gpustack_k8s_gfd_mode (helper i12's GFD
    design) are the only ones, and once that setting exists every row is checked."""
    _, _, unavailable = parity.mismatches(DATA)
    if "gfd_mode" in parity.known_fields():
        assert unavailable == []
    else:
        assert unavailable and all("gfd_mode" in line for line in unavailable), unavailable
        assert len(unavailable) <= 8


def test_the_markdown_is_generated_from_the_table():
    assert (ROOT / "docs" / "upstream-parity.md").read_text(encoding="utf-8") == parity.markdown(
        DATA
    ), "run: python scripts/upstream_parity.py --write"


def test_a_changed_value_is_caught():
    changed = copy.deepcopy(DATA)
    operand = next(o for o in changed["operands"] if o["name"] == "MPS control daemon DaemonSet")
    row = next(r for r in operand["rows"] if r["field"] == "hostPID")
    row["gpustack"] = "<absent>"  # what the template rendered before issue 12
    drift, _, _ = parity.mismatches(changed)
    assert drift == [
        f'MPS control daemon DaemonSet / hostPID [{scenario}]: table says "<absent>", rendered true'
        for scenario in ("mps", "mps-renamed")
    ]


def test_a_changed_template_is_caught(monkeypatch):
    """A template that renders something else for a recorded field fails the comparison."""
    from gpustack.k8s import manifests

    original = manifests._render_template

    def drifted(template, **context):
        obj = original(template, **context)
        if template == "dcgm-exporter/daemonset.yaml.j2":
            obj["spec"]["template"]["spec"]["hostNetwork"] = True
            obj["spec"]["template"]["spec"]["containers"][0]["env"].append(
                {"name": "DCGM_EXPORTER_INTERVAL", "value": "1000"}
            )
        return obj

    monkeypatch.setattr(manifests, "_render_template", drifted)
    drift, _, _ = parity.mismatches(DATA)
    fields = {line.split(" [")[0] for line in drift}
    assert fields == {
        "dcgm-exporter DaemonSet / pod spec fields",
        "dcgm-exporter DaemonSet / env names",
        "Environment and securityContext per mode / dcgm-exporter, every mode — env",
    }


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("a.b", 1),
        ('m["x.y/z"]', "dotted"),
        ("l[name=two].v", 2),
        ("l[*].name", ["one", "two"]),
        ("l[1].v", 2),
        ("m|keys", ["x.y/z"]),
        ("t|yaml.k", [1, 2]),
        ("c|csvfields", ["F1", "F2"]),
    ],
)
def test_paths_resolve(path, value):
    obj = {
        "a": {"b": 1},
        "m": {"x.y/z": "dotted"},
        "l": [{"name": "one", "v": 1}, {"name": "two", "v": 2}],
        "t": "k: [1, 2]\n",
        "c": "# comment\nF1, gauge, x\n\nF2, counter, y\n",
    }
    assert parity.resolve(obj, parity.tokens(path)) == value


def test_missing_paths_are_absent_not_errors():
    obj = {"a": {"b": 1}, "l": [{"name": "one"}]}
    for path in ("a.c", "x.y.z", "l[name=two].v", "l[3]", "a.b.c"):
        assert parity.normalise(parity.resolve(obj, parity.tokens(path))) == "<absent>"
    with pytest.raises(ValueError):
        parity.tokens("a..b")


def test_pod_and_container_shorthands():
    daemonset = {"kind": "DaemonSet"}
    assert parity.expand("ctr.env", daemonset, "x") == "spec.template.spec.containers[name=x].env"
    assert parity.expand("pod|keys", daemonset, None) == "spec.template.spec|keys"
    assert parity.expand("pod.nodeName", {"kind": "Pod"}, None) == "spec.nodeName"
    assert (
        parity.expand("init.mount-shm.command", daemonset, None)
        == "spec.template.spec.initContainers[name=mount-shm].command"
    )


def test_every_row_is_sourced_and_every_source_is_pinned():
    for key, source in DATA["sources"].items():
        assert re.fullmatch(r"[0-9a-f]{40}", source["commit"]), key
        assert source["repo"].count("/") == 1 and source["path"], key
    for operand, row in ROWS:
        where = f"{operand['name']} / {row['field']}"
        assert {"field", "upstream", "source", "gpustack"} <= set(row), where
        assert row["source"], where
        for ref in row["source"]:
            assert ref.split(" ")[0] in DATA["sources"], (where, ref)
        if row.get("fixed"):
            assert row["fixed"].strip(), where


def test_every_daemonset_records_its_pod_fields_and_env():
    """The `pod|keys` and `env names` rows make an added pod field or variable fail the test."""
    for operand in DATA["operands"]:
        if not operand["object"].startswith("DaemonSet/"):
            continue
        paths = {row.get("path") for row in operand["rows"]}
        if operand["name"] == "GPU Feature Discovery":
            continue  # the GFD rows follow helper i12's design; its pod fields are its own
        if operand["name"] == "Environment and securityContext per mode":
            continue  # rows of several DaemonSets, one mode each; their env rows name containers
        assert "pod|keys" in paths, operand["name"]
        assert "ctr.env[*].name" in paths, operand["name"]


def test_counts_the_doc_reports():
    counts = parity.counts(DATA)
    assert counts["rows"] == len(ROWS) >= 100
    assert counts["fixed"] >= 6 and counts["differ"] >= 30


def test_a_row_of_one_mode_names_its_scenarios_in_the_markdown():
    text = parity.markdown(DATA)
    line = next(
        line for line in text.splitlines() if line.startswith("| GFD, MIG strategy single or mixed")
    )
    field = line.split(" | ")[0]
    assert "in `mig-single`, `mig-mixed`, `mig-single-time-slicing`" in field
    assert "`none`" not in field
