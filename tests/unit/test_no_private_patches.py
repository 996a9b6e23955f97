"""gpustack uses ansible-core through its public interfaces only: no module of gpustack (the CLI's
package, the collection's plugins, the benchmarks) assigns to, deletes or wraps an attribute of
an ansible-core module or class, or imports one of its underscore names. What CI tests is then
what `ansible-playbook` as ansible-core ships it runs for every user."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("gpustack", "plugins", "benchmarks")


def _is_ansible(module: str) -> bool:
    return module == "ansible" or module.startswith("ansible.")


def _private(dotted: str) -> bool:
    """An underscore name in a dotted path (`__version__` and the like are public)."""
    return any(p.startswith("_") and not p.endswith("__") for p in dotted.split("."))


def _root(node: ast.expr) -> str | None:
    """The name an attribute chain starts from (`a` of `a.b.c`), or None."""
    while isinstance(node, ast.Attribute):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def offences(source: str, filename: str = "<source>") -> list[str]:
    """Every place `source` patches ansible-core or imports its private names."""
    tree = ast.parse(source, filename)
    bound: set[str] = set()  # names that are ansible-core modules, classes or functions here
    found: list[str] = []

    def where(node: ast.AST) -> str:
        return f"{filename}:{node.lineno}"

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if _is_ansible(alias.name):
                    bound.add(alias.asname or alias.name.split(".")[0])
                    if _private(alias.name):
                        found.append(f"{where(node)}: imports private {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and _is_ansible(node.module):
            for alias in node.names:
                bound.add(alias.asname or alias.name)
                dotted = f"{node.module}.{alias.name}"
                if _private(dotted):
                    found.append(f"{where(node)}: imports private {dotted}")
    for node in ast.walk(tree):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = node.targets
        for target in targets:
            for sub in ast.walk(target):
                if isinstance(sub, ast.Attribute) and _root(sub) in bound:
                    found.append(f"{where(node)}: changes {ast.unparse(sub)}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
            and _root(node.args[0]) in bound
        ):
            found.append(f"{where(node)}: {node.func.id} on {ast.unparse(node.args[0])}")
    return found


def python_files() -> list[Path]:
    return sorted(p for top in CHECKED for p in (ROOT / top).rglob("*.py"))


def test_no_module_patches_or_imports_private_ansible_core_names():
    files = python_files()
    assert len(files) > 50  # the walk found the package
    found = [o for path in files for o in offences(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == []


@pytest.mark.parametrize(
    "source",
    [
        # patches of the kinds the rule forbids: wrapped methods and functions, replaced
        # settings, private imports
        "from ansible.executor.task_queue_manager import TaskQueueManager\n"
        "TaskQueueManager.run = lambda self, play: None\n",
        "from ansible.executor import module_common\nmodule_common._find_module_utils = print\n",
        "from ansible._internal._templating import _jinja_bits as bits\n",
        "from ansible import constants as C\nC.INVENTORY_ENABLED = ['ini']\n",
        "import ansible.constants\nansible.constants.DEFAULT_FORKS += 1\n",
        "import ansible.plugins.strategy as s\nsetattr(s.StrategyBase, '_queue_task', None)\n",
        "from ansible.plugins.strategy import StrategyBase\ndel StrategyBase._queue_task\n",
        "from ansible.executor.task_result import _RawTaskResult\n",
    ],
)
def test_the_check_catches_a_patch(source):
    assert offences(source)


def test_public_use_and_own_objects_pass():
    source = (
        "from ansible.inventory.manager import InventoryManager\n"
        "from ansible import constants as C\n"
        "manager = InventoryManager(loader=None)\n"
        "manager.cache = {}\n"  # an object of our own making, not a class or module of ansible's
        "enabled = C.INVENTORY_ENABLED\n"
        "from ansible.release import __version__\n"
        "import ansible_runner\n"
        "ansible_runner.x = 1\n"  # not ansible-core
    )
    assert offences(source) == []
