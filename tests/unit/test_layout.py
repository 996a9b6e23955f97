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


def _role_calls():
    """(role, tasks_from, file) of every include_role/import_role with tasks_from."""
    found = []

    def walk(node, path):
        if isinstance(node, dict):
            for key, value in node.items():
                role_call = key.split(".")[-1] in ("include_role", "import_role")
                if role_call and isinstance(value, dict) and "tasks_from" in value:
                    found.append((value["name"].split(".")[-1], value["tasks_from"], path))
                walk(value, path)
        elif isinstance(node, list):
            for item in node:
                walk(item, path)

    files = [*(ROOT / "roles").glob("*/tasks/**/*.yml"), *(ROOT / "playbooks").glob("*.yml")]
    for path in files:
        walk(yaml.safe_load(path.read_text()), str(path.relative_to(ROOT)))
    return found


def _specs(role: str) -> dict:
    return yaml.safe_load((ROOT / "roles" / role / "meta/argument_specs.yml").read_text())[
        "argument_specs"
    ]


def test_every_entry_point_called_from_elsewhere_has_an_argument_spec():
    """Ansible looks the spec up by the tasks_from value as written (role/__init__.py,
    `argspecs.get(entrypoint)`), so `x.yml` would miss a spec named `x`."""
    calls = _role_calls()
    assert len({(role, entry) for role, entry, _ in calls}) >= 22
    missing = [(r, e, where) for r, e, where in calls if e not in _specs(r)]
    assert missing == []


def test_state_handed_between_roles_in_internal_variables_is_in_the_specs():
    """A `__<role>_*` variable read or set outside its role is declared (an option of the entry
    point that reads it, or named in the description of the one that sets it) in the owning
    role's spec, and in the spec of the other role that uses it."""
    roles = sorted(p.name for p in (ROOT / "roles").iterdir() if p.is_dir())
    name = re.compile(r"\b__(" + "|".join(roles) + r")_\w+")
    crossing: dict[str, set[str]] = {}
    for path in [*(ROOT / "roles").rglob("*.yml"), *(ROOT / "playbooks").glob("*.yml")]:
        rel = path.relative_to(ROOT)
        user = rel.parts[1] if rel.parts[0] == "roles" else "playbooks"
        if rel.parts[-2] == "meta":
            continue
        for match in name.finditer(path.read_text()):
            if match.group(1) != user:
                crossing.setdefault(match.group(0), set()).add(user)
    assert crossing  # site.yml hands __nvidia_driver_background to the driver role, at least
    for variable, users in crossing.items():
        owner = name.match(variable).group(1)
        for role in {owner} | (users - {"playbooks"}):
            text = (ROOT / "roles" / role / "meta/argument_specs.yml").read_text()
            assert variable in text, f"{variable} (used by {sorted(users)}) not in {role}'s spec"


def test_every_entry_point_spec_accepts_the_roles_defaults():
    """Each entry point's spec is well formed and agrees with defaults/main.yml, checked by
    Ansible's own validator (what the role's validation task runs)."""
    from ansible.module_utils.common.arg_spec import ArgumentSpecValidator

    for role in sorted(p for p in (ROOT / "roles").iterdir() if p.is_dir()):
        defaults = yaml.safe_load((role / "defaults/main.yml").read_text()) or {}
        for entry, spec in _specs(role.name).items():
            options = spec.get("options") or {}
            provided = {k: v for k, v in defaults.items() if k in options}
            sample = {"list": ["x"], "dict": {"x": 1}, "bool": True, "int": 1}
            provided.update({k: (o.get("choices") or [sample.get(o.get("type"), "x")])[0]
                             for k, o in options.items() if o.get("required")})  # fmt: skip
            result = ArgumentSpecValidator(options).validate(provided)
            assert not result.error_messages, (role.name, entry, result.error_messages)
