"""The documents describe the product and its evidence, not how it was worked on: no sessions,
numbered rounds, borrowed machines or issue numbers; the performance report stays a report."""

import re

import pytest

from tests.conftest import ROOT

DOCS = sorted(
    [ROOT / "README.md", ROOT / "CHANGELOG.md", *(ROOT / "docs").glob("*.md"),
     *(ROOT / "roles").glob("*/README.md")]
)  # fmt: skip
NARRATIVE = [
    re.compile(r"\b(loans?|lent|borrowed)\b", re.I),
    re.compile(r"(?<!ssh )(?<!login )(?<!own )(?<!new )\bsessions?\b(?! leader)(?!\.py)", re.I),
    re.compile(r"\b(\w+th|first|second|third|\d+(st|nd|rd|th)) (round|session|stretch)\b", re.I),
    re.compile(r"\bhelper i\d+\b|/work/|\bbuild machines?\b|other people", re.I),
    re.compile(r"(?<![\w/-] )(?<!k3s )\bissue \d+", re.I),  # an upstream repository's issue is fine
]


@pytest.mark.parametrize("path", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_document_narrates_how_the_project_was_worked_on(path):
    text = path.read_text()
    found = [m.group(0) for pattern in NARRATIVE for m in pattern.finditer(text)]
    assert not found, found


def test_the_performance_report_is_a_report():
    text = (ROOT / "docs/performance.md").read_text()
    assert len(text.splitlines()) <= 300
    for benchmark in ("upgrade_makespan.py", "first_install_vs_apt.py", "fleet_scale.py",
                      "status_10000_nodes.py", "upgrade_state.py", "kill_rerun.py"):  # fmt: skip
        assert f"benchmarks/{benchmark}" in text
        assert (ROOT / "benchmarks" / benchmark).is_file()
    assert "**The machine**" in text
