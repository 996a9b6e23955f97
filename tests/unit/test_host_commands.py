"""How gpustack's host modules run commands (module_utils/gpustack_host.run): a bare tool name is
looked up on PATH and then in EXTRA_PATH, because a module's PATH over SSH is minimal. The lent
H100 hosts keep nvidia-smi only in /usr/local/nvidia/bin (tests/fixtures/real-gpu/2026-11-26-*,
setup/run-log.txt: `which nvidia-smi`), so a probe over SSH must look there too."""

import os
import stat

from tests.conftest import ROOT
from tests.unit.host_modules import utils

host = utils("gpustack_host")


def test_the_driver_directory_of_the_real_gpu_hosts_is_searched():
    log = (ROOT / "tests/fixtures/real-gpu/2026-11-26-h100-80gb-hbm3/setup/run-log.txt").read_text()
    assert "/usr/local/nvidia/bin/nvidia-smi" in log  # what `which nvidia-smi` printed there
    assert "/usr/local/nvidia/bin" in host.EXTRA_PATH


def test_a_bare_name_runs_from_extra_path_when_path_lacks_it(tmp_path, monkeypatch):
    tool = tmp_path / "gpustack-fake-smi"
    tool.write_text('#!/bin/sh\necho found "$@"\n')
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setattr(host, "EXTRA_PATH", host.EXTRA_PATH + [str(tmp_path)])
    assert host.run(["gpustack-fake-smi", "-L"]) == (0, "found -L\n", "")
    monkeypatch.setattr(host, "EXTRA_PATH", [])
    rc, _, err = host.run(["gpustack-fake-smi", "-L"])
    assert rc == 127 and "gpustack-fake-smi" in err
    assert os.environ["PATH"] == "/nonexistent"  # nothing changed the module's environment
