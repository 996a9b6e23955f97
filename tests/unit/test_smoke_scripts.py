"""scripts/wheelhouse.sh and scripts/gpu-smoke.sh refuse bad input with Error + Hint and exit 2
before touching anything (their real runs, with the network, are in tests/lab/test_smoke.py)."""

import os
import subprocess

import pytest

from tests.conftest import ROOT

WHEELHOUSE = str(ROOT / "scripts/wheelhouse.sh")
SMOKE = str(ROOT / "scripts/gpu-smoke.sh")


def run(*argv, env=None):
    return subprocess.run(argv, capture_output=True, text=True, timeout=60,
                          env={**os.environ, **(env or {})})  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--python-version", "3.10"], "gpustack needs Python >= 3.11, not 3.10"),
        (["--python-version", "three"], "--python-version three is not X.Y"),
        (["--arch", "ppc64le"], "unsupported --arch ppc64le"),
        (["--glibc", "2.5"], "--glibc 2.5 is not 2.N with N >= 17"),
        (["--bogus"], "unknown option --bogus"),
        (["--constraints", "/nonexistent.txt"], "--constraints /nonexistent.txt does not exist"),
    ],
)
def test_wheelhouse_bad_input(tmp_path, args, message):
    proc = run(WHEELHOUSE, "--dest", str(tmp_path / "wh"), *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0] == f"Error: {message}" and lines[1].startswith("Hint: ")
    assert not (tmp_path / "wh").exists(), "nothing is written for bad input"


def test_wheelhouse_refuses_a_non_empty_destination(tmp_path):
    (tmp_path / "old.whl").write_text("x")
    proc = run(WHEELHOUSE, "--dest", str(tmp_path))
    assert proc.returncode == 2 and "is not empty" in proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["old.whl"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--wheelhouse", "/nonexistent"], "wheelhouse /nonexistent is not a directory"),
        (["--venv", "/nonexistent"], "no gpustack in /nonexistent"),
    ],
)
def test_gpu_smoke_bad_input(args, message):
    proc = run(SMOKE, *args, env={"PATH": "/usr/bin:/bin", "GPUSTACK_VENV": ""})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines()[0] == f"Error: {message}"


def test_gpu_smoke_without_gpustack_or_wheelhouse(tmp_path):
    """A copy of the script alone, no gpustack anywhere: it says how to get one."""
    lone = tmp_path / "gpu-smoke.sh"
    lone.write_text((ROOT / "scripts/gpu-smoke.sh").read_text())
    lone.chmod(0o755)
    proc = run(str(lone), env={"PATH": "/usr/bin:/bin", "GPUSTACK_VENV": ""})
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "Error: gpustack is not installed here",
        "Hint: build a wheelhouse on a connected machine (scripts/wheelhouse.sh), copy it here "
        "and run its gpu-smoke.sh",
    ]


def test_gpu_smoke_rejects_an_empty_wheelhouse(tmp_path):
    proc = run(SMOKE, "--wheelhouse", str(tmp_path), env={"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2 and "has no gpustack or pip wheel" in proc.stderr
