"""Shared helpers: run the real `gpustack` entry point in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GPUSTACK = [sys.executable, "-m", "gpustack"]


@pytest.fixture
def state_dir(tmp_path, monkeypatch) -> Path:
    """Each test gets its own run directory, so tests can prove nothing was run."""
    path = tmp_path / "state"
    monkeypatch.setenv("GPUSTACK_STATE_DIR", str(path))
    return path


def run_cli(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    merged = {**os.environ, **(env or {})}
    return subprocess.run(
        [*GPUSTACK, *args], capture_output=True, text=True, env=merged, timeout=timeout, cwd=ROOT
    )


def runs_started(state_dir: Path) -> list[Path]:
    runs = state_dir / "runs"
    return sorted(runs.iterdir()) if runs.exists() else []


def collections_path() -> Path:
    """ANSIBLE_COLLECTIONS_PATH in which gpustack.gpustack is this checkout, as the CLI sets it
    (the roles call their modules and filters by collection name)."""
    from gpustack import paths

    return paths.collections_path(Path(tempfile.gettempdir()) / "gpustack-tests")


def run_playbook(playbook: Path, variables: dict, **env: str) -> subprocess.CompletedProcess:
    """Run a controller-only test playbook with the venv's ansible-playbook."""
    merged = {**os.environ, "ANSIBLE_LOCALHOST_WARNING": "False",
              "ANSIBLE_INVENTORY_UNPARSED_WARNING": "False",
              "ANSIBLE_COLLECTIONS_PATH": str(collections_path()), **env}  # fmt: skip
    return subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), str(playbook), "-e",
         json.dumps(variables)],
        capture_output=True, text=True, env=merged, timeout=120,
    )  # fmt: skip
