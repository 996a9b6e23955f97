"""Structural rules the project keeps: one ansible-runner user, roles documented."""

import re

import yaml

from tests.conftest import ROOT

IMPORT = re.compile(r"^\s*(import|from)\s+ansible_runner\b", re.MULTILINE)


def test_only_runner_imports_ansible_runner():
    users = sorted(
        str(path.relative_to(ROOT))
        for path in (ROOT / "gpustack").rglob("*.py")
        if IMPORT.search(path.read_text())
    )
    assert users == ["gpustack/ansible/runner.py"]


def test_every_role_has_argument_specs_and_defaults():
    roles = [p for p in (ROOT / "roles").iterdir() if p.is_dir()]
    assert roles
    for role in roles:
        specs = yaml.safe_load((role / "meta/argument_specs.yml").read_text())
        assert "main" in specs["argument_specs"], role.name
        assert (role / "defaults/main.yml").exists(), role.name
        options = specs["argument_specs"]["main"].get("options") or {}
        for name in options:
            assert name.startswith(role.name + "_"), f"{role.name}: {name} lacks the role prefix"


def test_variables_reference_is_current():
    from gpustack import varsdoc

    committed = (ROOT / "docs/variables.md").read_text()
    assert committed == varsdoc.render(ROOT / "roles"), (
        "docs/variables.md is stale: run `python -m gpustack.varsdoc docs/variables.md`"
    )
