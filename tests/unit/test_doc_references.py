"""Hints name docs/*.md; from an installed wheel they name the copy shipped in the package."""

from gpustack import paths
from gpustack.errors import BadInput
from gpustack.terminal import output
from tests.conftest import ROOT


def test_every_doc_a_hint_names_exists():
    # The docs the code's hints and help texts name are all in docs/, which the wheel ships.
    import re

    named = set()
    sources = [*(ROOT / "gpustack").rglob("*.py"), *(ROOT / "roles").rglob("*.yml")]
    for path in sources:
        named |= set(re.findall(r"docs/([\w.-]+\.md)", path.read_text()))
    assert named, "no hint names a doc: the pattern is stale"
    missing = sorted(n for n in named if not (ROOT / "docs" / n).is_file())
    assert not missing, missing


def test_checkout_keeps_the_relative_name():
    assert paths.resolve_doc_references("see docs/variables.md") == "see docs/variables.md"


def test_installed_wheel_names_the_shipped_file(tmp_path, monkeypatch, capsys):
    (tmp_path / "docs").mkdir()
    monkeypatch.setattr(paths, "content_root", lambda: tmp_path)
    text = "see docs/variables.md and `docs/fleet.md`, not tests/docs/x.md"
    assert paths.resolve_doc_references(text) == (
        f"see {tmp_path}/docs/variables.md and `{tmp_path}/docs/fleet.md`, not tests/docs/x.md"
    )
    output.print_error(BadInput("bad value", "see docs/variables.md"))
    assert f"Hint: see {tmp_path}/docs/variables.md" in capsys.readouterr().err


def test_help_names_the_installed_docs(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from gpustack.cli import app

    monkeypatch.setattr(paths, "content_root", lambda: tmp_path)
    text = CliRunner().invoke(app, ["upgrade", "--help"]).output
    assert f"({tmp_path}/docs/upgrade.md)" in text.replace("\n  ", " ").replace("  ", " ")
