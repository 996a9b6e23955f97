"""gpustack's import graph: no cycle, no module reaches into another's private names, and the
fleet views stay pure (nothing they import runs a playbook or talks to Kubernetes)."""

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


# What runs commands: the one ansible-runner user (every playbook run goes through it), the one
# Kubernetes client package, and processes started directly.
RUNS_COMMANDS = ("gpustack.ansible.runner", "gpustack.k8s.cluster")
RUNS_COMMANDS_OUTSIDE = ("ansible_runner", "kubernetes", "subprocess")


def _outside_imports(tree: ast.Module) -> set[str]:
    """Top-level names of the packages outside gpustack a module imports (lazy imports too)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found - {"gpustack"}


def _runs_commands(name: str) -> bool:
    return any(name == m or name.startswith(f"{m}.") for m in RUNS_COMMANDS)


def test_fleet_views_reach_nothing_that_runs_a_playbook_or_talks_to_kubernetes():
    """fleet/ is pure views: no import, direct or through other modules, of ansible-runner's
    user, of the Kubernetes side or of a process runner (commands live in the command layer:
    commands.py, upgrade/, mig/)."""
    graph = _graph()
    fleet = sorted(n for n in MODULES if n == "gpustack.fleet" or n.startswith("gpustack.fleet."))
    assert "gpustack.fleet.status" in fleet and "gpustack.fleet.mig" in fleet
    reaches = []
    for start in fleet:
        seen, todo = {start}, [start]
        while todo:
            name = todo.pop()
            outside = _outside_imports(MODULES[name]) & set(RUNS_COMMANDS_OUTSIDE)
            reaches += [f"{start} -> {name}: {o}" for o in sorted(outside)]
            for target in graph[name]:
                if _runs_commands(target):
                    reaches.append(f"{start} -> {name}: {target}")
                elif target not in seen:
                    seen.add(target)
                    todo.append(target)
    assert reaches == []


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
