"""gpustack's import graph: no cycle, and no module reaches into another's private names."""

import ast

from tests.conftest import ROOT

PACKAGE = ROOT / "gpustack"


def _modules() -> dict[str, ast.Module]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = ast.parse(path.read_text(encoding="utf-8"), str(path))
    return found


MODULES = _modules()


def _imports(tree: ast.Module):
    """(imported module, names taken from it, local names bound to a gpustack module)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "gpustack":
                    yield alias.name, [], []
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module.split(".")[0] != "gpustack":
                continue
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in MODULES:
                    yield sub, [], [alias.asname or alias.name]
                else:
                    yield node.module, [alias.name], []


def _graph() -> dict[str, set[str]]:
    return {
        name: {target for target, _, _ in _imports(tree) if target in MODULES and target != name}
        for name, tree in MODULES.items()
    }


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def test_the_graph_sees_every_module_and_lazy_imports():
    graph = _graph()
    assert "gpustack.cli" in MODULES and len(MODULES) > 40
    assert "gpustack.ansible.runner" in graph["gpustack.ansible.playbook"]  # inside a function
    assert (
        "gpustack.fleet.status" in graph["gpustack.commands"]
    )  # `from gpustack.fleet import status`


def test_no_import_cycle():
    graph = _graph()
    cycles = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> None:
        state[name] = 1
        for target in sorted(graph[name]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target, [*path, target])
        state[name] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])
    assert cycles == []


def test_no_module_imports_a_private_name_of_another():
    reaches = []
    for name, tree in MODULES.items():
        module_names: set[str] = set()
        for target, names, bound in _imports(tree):
            reaches += [f"{name}: {target}.{n}" for n in names if _private(n)]
            module_names.update(bound)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in module_names
                and _private(node.attr)
            ):
                reaches.append(f"{name}: {node.value.id}.{node.attr}")
    assert reaches == []


def test_every_error_gpustack_raises_carries_a_hint():
    """Error: lines come with a Hint: line (a Kubernetes error once had an empty one)."""
    errors = ("GpustackError", "BadInput", "LabError")
    without = []
    for name, tree in MODULES.items():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in errors:
                hint = node.args[1] if len(node.args) > 1 else None
                hint = next((k.value for k in node.keywords if k.arg == "hint"), hint)
                if hint is None or (isinstance(hint, ast.Constant) and not hint.value):
                    without.append(f"{name}:{node.lineno}")
    assert without == []
