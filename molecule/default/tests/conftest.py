"""Shared helpers for the default scenario's testinfra checks (run by `molecule verify`)."""

from __future__ import annotations

import json
import os
import sys
import tomllib
from pathlib import Path

import pytest

# The TEST FIXTURE definitions (stand-in toolkit versions, runtime log, image) live in the
# project's tests package; Molecule runs these tests from the scenario directory.
sys.path.insert(0, os.environ["MOLECULE_PROJECT_DIRECTORY"])
from tests.fixtures import lab_fixtures

DRIVER_PACKAGES = ("nvidia-kernel-dkms", "nvidia-smi", "libcuda1")
TOOLKIT_PACKAGES = tuple(lab_fixtures.PACKAGES)
NVIDIA_BINARY = "/usr/bin/nvidia-container-runtime"
USER_MARK = "# molecule prepare: the user's own settings"


@pytest.fixture(scope="session")
def fixture_vars() -> dict:
    """The -e variables prepare wrote for converge (fixture repo, test image, ctr args)."""
    path = Path(os.environ["MOLECULE_EPHEMERAL_DIRECTORY"]) / "fixture-vars.json"
    return json.loads(path.read_text())


@pytest.fixture
def hostvars(host) -> dict:
    """The scenario's inventory variables for this host (what molecule.yml asked for)."""
    return host.ansible.get_variables()


def run_ok(host, command: str) -> str:
    result = host.run(command)
    assert result.rc == 0, f"{command}: rc={result.rc} {result.stderr}"
    return result.stdout


def containerd_dump(host) -> dict:
    return tomllib.loads(run_ok(host, "containerd config dump"))


def cri_sections(dump: dict) -> tuple[dict, dict]:
    """(runtime plugin, images settings) for config version 2 (containerd 1.x) or 3 (2.x)."""
    plugins = dump["plugins"]
    if dump["version"] >= 3:
        return plugins["io.containerd.cri.v1.runtime"], plugins["io.containerd.cri.v1.images"]
    cri = plugins["io.containerd.grpc.v1.cri"]
    return cri, cri
