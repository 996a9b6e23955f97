"""gpustack/lab/ee.py: the execution environment's base image recipe and podman's options
(tests/lab/test_execution_environment.py builds and runs the image)."""

import shutil

import pytest

from gpustack.lab import ee


def test_engine_options_carry_the_lab_runtime_and_rlimits(monkeypatch):
    if not shutil.which("runc"):
        pytest.skip("needs runc on PATH")
    monkeypatch.setenv("GPUSTACK_LAB_OCI_RUNTIME", "runc")
    assert ee.engine_options() == ["--runtime", "runc", "--ulimit", "nofile=4096:4096",
                                   "--ulimit", "nproc=4096:4096"]  # fmt: skip


def test_base_recipe_has_debian_sources_with_security_and_the_local_cas(monkeypatch, tmp_path):
    monkeypatch.setattr(ee, "LOCAL_CAS", tmp_path)
    script = ee.base_script()
    assert "Suites: bookworm bookworm-updates" in script
    assert "Suites: bookworm-security" in script
    assert "update-ca-certificates" in script
    assert ee.BASE_PACKAGES == ["python3", "python3-pip", "ca-certificates"]
    before = ee.base_image_name()
    assert before.startswith("localhost/gpustack-ee-base:bookworm-")
    (tmp_path / "proxy.crt").write_text("-----BEGIN CERTIFICATE-----\nx\n")
    assert ee.local_cas() == {"proxy.crt": "-----BEGIN CERTIFICATE-----\nx\n"}
    assert ee.base_image_name() != before  # a new CA: a new base image


def test_main_refuses_other_arguments(capsys):
    assert ee.main(["build"]) == 2
    assert "usage: python -m gpustack.lab.ee base" in capsys.readouterr().err
