"""How gpustack's host modules run commands (module_utils/gpustack_host.run): a bare tool name is
looked up on PATH and then in EXTRA_PATH, because a module's PATH over SSH is minimal."""

import os
import stat

from tests.unit.host_modules import utils

host = utils("gpustack_host")


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


def test_service_state_is_unknown_where_systemd_is_not_init(monkeypatch):
    """A systemctl binary without systemd as init says "inactive" for a daemon started by other
    means (containerd started by hand in a lab rehearsal of the GPU host); gpustack says
    unknown there, and asks systemd only where it booted the host."""
    calls = []
    monkeypatch.setattr(host, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(host, "run", lambda args, **kw: calls.append(args) or (3, "", ""))
    monkeypatch.setattr(host.os.path, "isdir", lambda path: False)
    assert host.service_active("containerd") is None and calls == []
    monkeypatch.setattr(host.os.path, "isdir", lambda path: path == "/run/systemd/system")
    assert host.service_active("containerd") is False
    assert calls == [["systemctl", "is-active", "--quiet", "containerd"]]
