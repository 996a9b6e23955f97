"""The collection's filter files import nothing heavy at load time.

Ansible resolves a collection filter by loading every file under plugins/filter (ansible-core
2.19, plugins/loader.py Jinja2Loader.get_with_context), and it does so in each worker process: a
fresh fork per task and host that never loaded them. A first install on 2 lab nodes resolved
gpustack filters in some 50 worker processes; tomlkit (imported by the containerd filters) and
module_utils/gpustack_mig_plan (by the MIG filter) were most of that cost (docs/performance.md).
The filters that need them import them when they run.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

from tests.conftest import ROOT

PROBE = """
import importlib.util, json, pathlib, sys
before = set(sys.modules)
for path in sorted(pathlib.Path(sys.argv[1]).glob("*.py")):
    spec = importlib.util.spec_from_file_location("probe_" + path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.FilterModule().filters()
print(json.dumps(sorted(set(sys.modules) - before)))
"""


def loaded_by_the_filter_files() -> list[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, str(ROOT / "plugins/filter")],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return json.loads(out)


def test_loading_every_filter_file_imports_neither_tomlkit_nor_the_mig_planner():
    loaded = loaded_by_the_filter_files()
    assert not [name for name in loaded if name.split(".")[0] == "tomlkit"], loaded
    assert not [name for name in loaded if name.endswith("gpustack_mig_plan")], loaded


def load(name):
    spec = importlib.util.spec_from_file_location(
        name + "_filters", ROOT / f"plugins/filter/{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.FilterModule().filters()


def test_the_filters_that_need_them_import_them_when_they_run():
    # the containerd filters' own tests: tests/unit/test_runtime_merge.py
    canonical = load("container_runtime")["gpustack_toml_canonical"]
    assert canonical("[a]\nb = 1\n") == canonical("[a]\n  b = 1\n")
    layout = {"version": "v1", "mig-configs": {"off": [{"devices": "all", "mig-enabled": False}]}}
    problem = load("nvidia_mig")["nvidia_mig_layout_problem"]
    assert problem(layout, "off") == ""
    assert problem(layout, "other") == "it has no layout named other (it has: off)"
    assert problem({"version": "v1"}, "off") == "at least one entry in 'mig-configs' is required"
