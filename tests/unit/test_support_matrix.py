"""README's support matrix and the roles' metadata agree: a role lists a platform only where the
matrix says it ran for real (the rest is "rendered and unit-tested" or "unsupported")."""

import yaml

from tests.conftest import ROOT

CELL_STATES = ("run for real", "rendered and unit-tested", "unsupported")
# The matrix's OS rows, by the names Galaxy's platforms use.
ROWS = {
    ("Debian", "bookworm"): "Debian 12 bookworm",
    ("Debian", "trixie"): "Debian 13 trixie",
    ("Ubuntu", "noble"): "Ubuntu 24.04 noble",
    ("Ubuntu", "jammy"): "Ubuntu 22.04 jammy",
    ("EL", "8"): "RHEL, Rocky, AlmaLinux 8 and 9",
    ("EL", "9"): "RHEL, Rocky, AlmaLinux 8 and 9",
}


def matrix_rows() -> dict[str, list[str]]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Support matrix", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) > 1 and not set(cells[0]) <= {"-"}:
            rows[cells[0]] = cells[1:]
    return rows


def test_every_cell_says_how_far_it_went():
    rows = matrix_rows()
    assert "Debian 12 bookworm" in rows and "Hopper (H100 80GB HBM3, H200)" in rows
    for name, cells in rows.items():
        if cells and cells[0] in ("driver (`nvidia_driver`)", "state"):
            continue  # a header row
        for cell in cells:
            assert any(state in cell for state in CELL_STATES), (name, cell)


def test_role_platforms_are_where_the_role_ran_for_real():
    rows = matrix_rows()
    for meta in sorted(ROOT.glob("roles/*/meta/main.yml")):
        platforms = yaml.safe_load(meta.read_text())["galaxy_info"]["platforms"]
        assert platforms, meta
        for platform in platforms:
            for version in platform["versions"]:
                row = ROWS[(platform["name"], str(version))]
                assert any("run for real" in cell for cell in rows[row]), (meta, row)
                assert platform["name"] != "EL", f"{meta}: EL paths are rendered, not run"
