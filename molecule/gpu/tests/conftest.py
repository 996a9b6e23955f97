"""The gpu scenario's verify: real GPU machines from GPUSTACK_GPU_INVENTORY."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config):
    if not os.environ.get("GPUSTACK_GPU_INVENTORY"):
        pytest.exit("skipped: no GPU inventory (set GPUSTACK_GPU_INVENTORY)", returncode=4)


# nvidia-smi where the driver is a package (/usr/bin), or in a driver tree that is not one
# (/usr/local/nvidia/bin, which an SSH session's PATH lacks; `gpustack smoke` looks there too).
SEARCH_PATH = 'PATH="$PATH:/usr/local/nvidia/bin:/usr/bin:/bin"'


def nvidia_smi(host, args: str) -> str:
    return run_ok(host, f"{SEARCH_PATH}; nvidia-smi {args}")


def run_ok(host, command: str) -> str:
    result = host.run(command)
    assert result.rc == 0, f"{command}: rc={result.rc} {result.stderr}"
    return result.stdout


@pytest.fixture
def gpu_names(host) -> list[str]:
    """`nvidia-smi -L` on the host: one line per GPU ("GPU 0: NVIDIA H100 ... (UUID: GPU-…)")."""
    lines = [line for line in nvidia_smi(host, "-L").splitlines() if line.startswith("GPU ")]
    assert lines, "nvidia-smi lists no GPU"
    return lines
