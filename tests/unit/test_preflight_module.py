"""The preflight module's parsers, loaded from the role as Ansible would ship it."""

import importlib.util

import pytest

from tests.conftest import ROOT

SPEC = importlib.util.spec_from_file_location(
    "gpustack_preflight_facts", ROOT / "roles/gpu_preflight/library/gpustack_preflight_facts.py"
)
mod = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(mod)


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ('version = 2\nroot = "/var/lib/containerd"\n[plugins]\n', 2),
        ("version = 3\n\n[plugins.'io.containerd.cri.v1.runtime']\n", 3),
        ('root = "/var/lib/containerd"\n[plugins.cri]\n  version = 7\n', 1),
        ("# comment\n  version=2\n", 2),
    ],
)
def test_containerd_config_version(tmp_path, text, version):
    path = tmp_path / "config.toml"
    path.write_text(text)
    assert mod.containerd_config_version(str(path)) == version


def test_containerd_config_absent(tmp_path):
    assert mod.containerd_config_version(str(tmp_path / "none.toml")) is None


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.07  "
            "Sat Feb 17 22:55:48 UTC 2024\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
            "535.161.07",
        ),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
            "(dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:53:52 UTC 2025\n",
            "580.95.05",
        ),
        ("", None),
    ],
)
def test_loaded_driver_version(text, version):
    assert mod.parse_nvrm_version(text) == version


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1\n", "1.6.20~ds1"),
        ("containerd containerd.io v2.1.4 75cb2b7193e4e490e9fbdc236c0e811ccaba3376\n", "2.1.4"),
        ("Docker version 27.3.1, build ce12230\n", "27.3.1"),
        ("k3s version v1.30.4+k3s1 (98262b5d)\ngo version go1.22.5\n", "1.30.4+k3s1"),
        ("crio version 1.30.1\n", "1.30.1"),
        ("Kubernetes v1.31.2\n", "1.31.2"),
    ],
)
def test_runtime_version_strings(text, version):
    assert mod.first_version(text) == version


def test_primary_runtime_precedence(monkeypatch):
    def kinds(*names):
        return [{"kind": n} for n in names]

    monkeypatch.setattr(mod, "which", lambda name: None)
    assert mod.primary_runtime(kinds("containerd", "docker")) == "docker"
    assert mod.primary_runtime(kinds("crio", "containerd")) == "crio"
    assert mod.primary_runtime(kinds("k3s")) == "k3s"
    assert mod.primary_runtime([]) is None
    monkeypatch.setattr(
        mod, "which", lambda name: "/usr/bin/kubelet" if name == "kubelet" else None
    )
    assert mod.primary_runtime(kinds("containerd", "docker")) == "containerd"
