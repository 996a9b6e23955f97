"""The Molecule scenarios without hosts: the gpu scenario refuses to pass without GPU machines,
and the lab scenarios' playbooks are well-formed and share one lab implementation."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.conftest import ROOT

BIN = Path(sys.executable).parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def molecule(*args: str, **env: str) -> tuple[int, str]:
    """Run the venv's molecule from the repository root; output without colours or wrapping."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSTACK_GPU_", "MOLECULE_"))}
    merged = {**base, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "NO_COLOR": "1",
              "ANSIBLE_NOCOLOR": "1", "COLUMNS": "200", **env}  # fmt: skip
    proc = subprocess.run([str(BIN / "molecule"), *args], cwd=ROOT, env=merged,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    text = ANSI.sub("", proc.stdout + proc.stderr)
    return proc.returncode, " ".join(text.replace("│", " ").split())


def test_gpu_scenario_without_inventory_stops_and_fails():
    rc, out = molecule("test", "-s", "gpu")
    assert rc != 0, out
    assert "skipped: no GPU inventory" in out, out[-2000:]
    assert re.search(r"gpu \S converge: Executed: Failed", out), out[-2000:]
    # It stopped before any host play: the stack's first role never ran.
    assert "gpu_preflight" not in out


def test_gpu_verify_without_inventory_stops_and_fails():
    rc, out = molecule("verify", "-s", "gpu")
    assert rc != 0, out
    assert "skipped: no GPU inventory" in out, out[-2000:]


@pytest.mark.parametrize("scenario", ["default", "upgrade"])
def test_lab_scenario_playbooks_pass_the_syntax_check(scenario):
    rc, out = molecule("syntax", "-s", scenario)
    assert rc == 0, out[-2000:]


def test_lab_scenarios_use_the_shared_lab_playbooks_and_own_lab_names():
    labs = {}
    for scenario in ("default", "upgrade"):
        config = yaml.safe_load((ROOT / "molecule" / scenario / "molecule.yml").read_text())
        playbooks = config["provisioner"]["playbooks"]
        assert playbooks["create"] == "../shared/create.yml"
        assert playbooks["destroy"] == "../shared/destroy.yml"
        names = {p["lab"] for p in config["platforms"]}
        assert len(names) == 1, names
        labs[scenario] = names.pop()
        assert all(p["lab_os"] in ("debian12", "debian13", "forky") for p in config["platforms"])
    assert len(set(labs.values())) == 2, labs  # scenarios can run side by side
    create = (ROOT / "molecule/shared/create.yml").read_text()
    assert "- gpustack\n" in create and "- lab\n" in create and "- up\n" in create
