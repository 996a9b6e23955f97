"""The collection's documentation as `ansible-doc` reads it: every module has DOCUMENTATION,
EXAMPLES and RETURN, every filter and role is documented, and ansible-doc says nothing on stderr."""

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.conftest import ROOT

BIN = Path(sys.executable).parent
MODULES = sorted(p.stem for p in (ROOT / "plugins/modules").glob("*.py"))
ROLES = sorted(
    p.name for p in (ROOT / "roles").iterdir() if (p / "meta/argument_specs.yml").is_file()
)


def ansible_doc(*args):
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(ROOT / ".collections"), "NO_COLOR": "1"}
    proc = subprocess.run([str(BIN / "ansible-doc"), *args], capture_output=True, text=True,
                          cwd=ROOT, env=env, timeout=300)  # fmt: skip
    # ansible-core 2.21 warns about its own internal collection (ansible/_protomatter) having no
    # MANIFEST.json; any other line on stderr is about gpustack's docs.
    stderr = [line for line in proc.stderr.splitlines()
              if line.strip() and "ansible/_protomatter" not in line]  # fmt: skip
    assert proc.returncode == 0 and not stderr, proc.stderr
    return proc.stdout


def test_every_module_has_examples_and_return():
    docs = json.loads(
        ansible_doc("--json", "-t", "module", *[f"gpustack.gpustack.{m}" for m in MODULES])
    )
    assert sorted(d.split(".")[-1] for d in docs) == MODULES
    for name, doc in docs.items():
        assert doc["doc"]["short_description"], name
        examples = yaml.safe_load(doc["examples"])
        assert any(name in task for task in examples), f"{name}: no example calls it"
        assert doc["return"], f"{name}: no RETURN"


def test_every_filter_is_documented():
    listing = ansible_doc("-t", "filter", "-l", "gpustack.gpustack")
    assert "UNDOCUMENTED" not in listing, listing
    names = [line.split()[0] for line in listing.splitlines() if line.strip()]
    docs = json.loads(ansible_doc("--json", "-t", "filter", *names))
    assert len(docs) == len(names) >= 29
    for name, doc in docs.items():
        assert doc["doc"]["short_description"] and doc["examples"].strip(), name
        assert doc["return"]["_value"]["description"], name


def test_every_role_is_documented():
    docs = json.loads(
        ansible_doc("--json", "-t", "role", *[f"gpustack.gpustack.{r}" for r in ROLES])
    )
    assert sorted(d.split(".")[-1] for d in docs) == ROLES


def test_changelog_fragments_use_the_configured_sections():
    """What `antsibull-changelog lint` checks first: every fragment is a mapping of configured
    section names to entries (the release summary a string, other sections lists of strings)."""
    config = yaml.safe_load((ROOT / "changelogs/config.yaml").read_text())
    sections = {name for name, _ in config["sections"]}
    sections |= {config["prelude_section_name"], config["trivial_section_name"]}
    assert yaml.safe_load((ROOT / "changelogs/changelog.yaml").read_text())["ancestor"] is None
    fragments = sorted((ROOT / "changelogs/fragments").glob("*.yml"))
    assert fragments
    for path in fragments:
        doc = yaml.safe_load(path.read_text())
        assert isinstance(doc, dict) and set(doc) <= sections, path.name
        for section, entries in doc.items():
            if section == config["prelude_section_name"]:
                assert isinstance(entries, str) and entries.strip(), path.name
            else:
                assert entries and all(isinstance(e, str) and e.strip() for e in entries), path.name
