"""Shared helpers: run the real `gpustack` entry point in a subprocess."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpustack.ansible  # noqa: F401  (Ansible's inventory settings, before any test imports ansible)

ROOT = Path(__file__).resolve().parent.parent
GPUSTACK = [sys.executable, "-m", "gpustack"]


@pytest.fixture
def state_dir(tmp_path, monkeypatch) -> Path:
    """Each test gets its own run directory, so tests can prove nothing was run."""
    path = tmp_path / "state"
    monkeypatch.setenv("GPUSTACK_STATE_DIR", str(path))
    return path


def cli(*args: str) -> list[str]:
    """The command line of `gpustack ARGS`. GPUSTACK_TEST_CONTROLLER names another Python to run
    it (a command line run from the checkout, e.g. `scripts/controller-trixie.sh run python`:
    the newest end of the ansible-core range, scripts/test.sh); `lab` commands, which drive this
    machine's podman, stay on this one."""
    controller = os.environ.get("GPUSTACK_TEST_CONTROLLER")
    if controller and args[:1] != ("lab",):
        return [*shlex.split(controller), "-m", "gpustack", *args]
    return [*GPUSTACK, *args]


def wait_until(found, what: str, timeout: float = 90, interval: float = 0.5):
    """Poll `found()` until it returns something true, and return that; fail the test with
    "timed out waiting for WHAT" after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = found()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {what}")


def run_cli(*args: str, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    merged = {**os.environ, **(env or {})}
    return subprocess.run(
        cli(*args), capture_output=True, text=True, env=merged, timeout=timeout, cwd=ROOT
    )


@contextlib.contextmanager
def lab_nodes(
    name: str, nodes: int, inventory: Path, os_names: str = "debian12", keep: bool = False
) -> Iterator[Path]:
    """`gpustack lab up` of `nodes` nodes (`os_names` as --os takes it) writing `inventory`, and
    `gpustack lab down` when the block ends, also where the lab did not come up or the setup
    after it failed (a lab file's module-scoped fixture: `with lab_nodes(...): ...; yield`);
    `keep` leaves the nodes up to look at them."""
    try:
        proc = run_cli("lab", "up", "--name", name, "--nodes", str(nodes), "--os", os_names,
                       "--inventory", str(inventory), timeout=1800)  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield inventory
    finally:
        if not keep:
            run_cli("lab", "down", "--name", name)


@pytest.fixture(scope="session")
def containerd_binary(tmp_path_factory) -> str:
    """A real `containerd` for `containerd config dump` (no daemon needed): the one on PATH, else
    Debian's, unpacked from the package `apt-get download` fetches. Skipped only on a machine
    without apt-get and dpkg-deb; on Debian (CI) a failed download fails the test."""
    found = shutil.which("containerd")
    if found:
        return found
    if not (shutil.which("apt-get") and shutil.which("dpkg-deb")):
        pytest.skip("needs containerd on PATH, or apt-get and dpkg-deb to unpack Debian's")
    folder = tmp_path_factory.mktemp("containerd")
    proc = subprocess.run(["apt-get", "download", "-q", "containerd"], cwd=folder,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, f"apt-get download containerd failed: {proc.stderr}"
    deb = next(folder.glob("containerd_*.deb"))
    subprocess.run(["dpkg-deb", "-x", str(deb), str(folder / "root")], check=True)
    return str(folder / "root/usr/bin/containerd")


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
