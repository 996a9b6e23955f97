"""The repository as the Ansible collection gpustack.gpustack: metadata, what the tarball holds,
names the roles call, and the execution environment's build context (docs/collection.md).

Here `ansible-builder create` renders the execution environment's build context, and the galaxy
stage's install command and the builder stage's dependency introspection run on that context,
outside a container; tests/lab/test_execution_environment.py builds the image and runs it.
"""

import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
from pathlib import Path

import yaml

from gpustack import paths
from tests.conftest import ROOT
from tests.unit.host_modules import load

BIN = Path(sys.executable).parent
GALAXY = yaml.safe_load((ROOT / "galaxy.yml").read_text())
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_galaxy_metadata_matches_the_package():
    assert (GALAXY["namespace"], GALAXY["name"]) == (
        paths.COLLECTION_NAMESPACE,
        paths.COLLECTION_NAME,
    )
    assert GALAXY["version"] == PYPROJECT["project"]["version"]
    assert GALAXY["dependencies"] == {}  # ansible-core only
    assert (ROOT / GALAXY["readme"]).is_file()


def test_one_ansible_core_range_everywhere():
    """pyproject.toml, meta/runtime.yml, the execution environment and the roles' meta declare
    the same range, the one CI runs at both ends (scripts/test.sh)."""
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet

    core = next(d for d in PYPROJECT["project"]["dependencies"] if d.startswith("ansible-core"))
    declared = Requirement(core.split("#")[0]).specifier
    assert declared == SpecifierSet(">=2.19,<2.22")
    runtime = yaml.safe_load((ROOT / "meta/runtime.yml").read_text())
    assert SpecifierSet(runtime["requires_ansible"]) == declared
    ee = yaml.safe_load((ROOT / "execution-environment.yml").read_text())
    assert Requirement(ee["dependencies"]["ansible_core"]["package_pip"]).specifier == declared
    oldest = min(s.version for s in declared if s.operator == ">=")
    for meta in (ROOT / "roles").glob("*/meta/main.yml"):
        assert yaml.safe_load(meta.read_text())["galaxy_info"]["min_ansible_version"] == oldest
    # the constraints of both ends pin an ansible-core inside it
    for name, series in (("py3.11.txt", "2.19."), ("py3.13.txt", "2.21.")):
        pins = dict(
            line.split("==")
            for line in (ROOT / "constraints" / name).read_text().splitlines()
            if "==" in line and not line.startswith("#")
        )
        assert pins["ansible-core"].startswith(series) and pins["ansible-core"] in declared


def test_no_role_keeps_role_embedded_plugins():
    # Ansible loads a role's library/, module_utils/ and filter_plugins/ only for roles outside
    # a collection (ansible/playbook/role/__init__.py, "legacy role"): in the collection they
    # would be dead. Everything lives in plugins/.
    for role in (ROOT / "roles").iterdir():
        for kind in ("library", "module_utils", "filter_plugins"):
            assert not (role / kind).exists(), f"{role.name}/{kind}: move it to plugins/"


def _referenced(pattern: str) -> set[str]:
    found = set()
    for path in [*(ROOT / "roles").rglob("*.yml"), *(ROOT / "roles").rglob("*.j2")]:
        found |= set(re.findall(pattern, path.read_text(), re.MULTILINE))
    return found


def test_every_fqcn_the_roles_call_exists_in_the_collection():
    modules = _referenced(r"^\s*(?:- )?gpustack\.gpustack\.(\w+):")
    assert {"gpustack_host_probe", "gpustack_apt_source", "gpustack_mig"} <= modules
    assert modules == {p.stem for p in (ROOT / "plugins/modules").glob("*.py")}
    filters = _referenced(r"\|\s*gpustack\.gpustack\.(\w+)")
    defined = set()
    for path in (ROOT / "plugins/filter").glob("*.py"):
        plugin = load(str(path.relative_to(ROOT)), f"collection_meta_{path.stem}")
        defined |= set(plugin.FilterModule().filters())
    assert "nvidia_driver_resolve_version" in filters
    assert filters <= defined, filters - defined


def _build(tmp_path: Path) -> Path:
    out = tmp_path / "dist"
    proc = subprocess.run(
        [BIN / "ansible-galaxy", "collection", "build", "--output-path", out, ROOT],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (tarball,) = out.glob("gpustack-gpustack-*.tar.gz")
    assert tarball.name == f"gpustack-gpustack-{GALAXY['version']}.tar.gz"
    return tarball


def test_the_tarball_holds_the_ansible_content_only(tmp_path):
    with tarfile.open(_build(tmp_path)) as tar:
        names = set(tar.getnames())
    tops = {name.split("/")[0] for name in names}
    assert {"roles", "playbooks", "plugins", "meta", "MANIFEST.json"} <= tops
    assert not tops & {"gpustack", "tests", "molecule", "benchmarks", "scripts", ".venv", "ee"}
    assert not tops & {".collections", "templates", "pyproject.toml", "ansible.cfg"}
    assert "plugins/modules/gpustack_host_probe.py" in names
    assert "plugins/module_utils/gpustack_driver_version.py" in names
    assert "roles/gpu_preflight/tasks/main.yml" in names and "playbooks/site.yml" in names


def test_execution_environment_context_installs_the_collection(tmp_path):
    work = tmp_path / "ee-src"
    shutil.copytree(
        ROOT / "ee", work / "ee", ignore=shutil.ignore_patterns("collection", "context")
    )
    shutil.copy(ROOT / "execution-environment.yml", work)
    (work / "ee/collection").mkdir()
    shutil.copy(_build(tmp_path), work / "ee/collection/gpustack-gpustack.tar.gz")
    definition = yaml.safe_load((work / "execution-environment.yml").read_text())
    assert definition["version"] == 3 and definition["images"]["base_image"]["name"]
    context = tmp_path / "context"
    proc = subprocess.run(
        [BIN / "ansible-builder", "create", "-f", work / "execution-environment.yml", "-c", context,
         "--output-filename", "Containerfile"],  # Dockerfile where podman is not on PATH
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    containerfile = (context / "Containerfile").read_text()
    base = definition["images"]["base_image"]["name"]
    assert f'ARG EE_BASE_IMAGE="{base}"' in containerfile  # --build-arg EE_BASE_IMAGE=... overrides
    assert "FROM $EE_BASE_IMAGE AS base" in containerfile
    assert "ansible-galaxy collection install" in containerfile
    # A Debian base: apt-get, its package lists read before the first install, Debian's pip
    # (its python3 refuses the ensurepip step ansible-builder would otherwise run).
    assert 'ARG PKGMGR="/usr/bin/apt-get"' in containerfile
    assert containerfile.index("apt-get update") < containerfile.index("$PKGMGR install $PYPKG")
    assert "pip_install $PYCMD" not in containerfile
    build = context / "_build"
    # The galaxy stage's command (WORKDIR /build), run on the rendered context: offline, the
    # collection comes from the tarball the definition copies in.
    collections = tmp_path / "share/collections"
    proc = subprocess.run(
        [BIN / "ansible-galaxy", "collection", "install", "--offline", "-r", "requirements.yml",
         "--collections-path", collections],
        cwd=build, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    installed = collections / "ansible_collections/gpustack/gpustack"
    assert (installed / "roles/nvidia_driver/tasks/main.yml").is_file()
    assert (installed / "plugins/filter/nvidia_driver.py").is_file()
    # The builder stage's introspection: the collection's own Python needs join the user's.
    proc = subprocess.run(
        [sys.executable, build / "scripts/introspect.py", "introspect", collections,
         "--user-pip", build / "requirements.txt", "--user-bindep", build / "bindep.txt",
         "--write-pip", tmp_path / "pip.txt", "--write-bindep", tmp_path / "bindep.txt"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gpustack.gpustack" in proc.stdout and "tomlkit" in proc.stdout
    assert "tomlkit" in (tmp_path / "pip.txt").read_text()
    assert "openssh-clients" in (tmp_path / "bindep.txt").read_text()


def test_mig_boot_applier_source_resolves_from_the_role():
    """configure.yml copies the applier from {{ role_path }}/../../plugins/module_utils: the
    same relative place in the checkout, the wheel's _content and an installed collection."""
    tasks = yaml.safe_load((ROOT / "roles/nvidia_mig/tasks/configure.yml").read_text())
    task = next(t for t in tasks if t["name"].startswith("Applier run by gpustack-mig.service"))
    src = task["ansible.builtin.copy"]["src"]
    assert src.startswith("{{ role_path }}/../../plugins/module_utils/"), src
    for item in task["loop"]:
        path = src.replace("{{ role_path }}", str(ROOT / "roles/nvidia_mig"))
        assert Path(path.replace("{{ item }}", item)).resolve().is_file(), item


def test_every_module_documents_itself_in_valid_yaml():
    """ansible-doc and ansible-lint read DOCUMENTATION/EXAMPLES/RETURN as YAML; a ': ' in a plain
    scalar once made gpustack_apt_source's unreadable."""
    import ast

    import yaml

    for path in sorted((ROOT / "plugins/modules").glob("*.py")):
        docs = {
            node.targets[0].id: node.value.value
            for node in ast.parse(path.read_text()).body
            if isinstance(node, ast.Assign)
            and getattr(node.targets[0], "id", "") in ("DOCUMENTATION", "EXAMPLES", "RETURN")
        }
        assert "DOCUMENTATION" in docs, path.name
        for text in docs.values():
            yaml.safe_load(text)  # raises on invalid YAML
        assert yaml.safe_load(docs["DOCUMENTATION"])["module"] == path.stem, path.name
