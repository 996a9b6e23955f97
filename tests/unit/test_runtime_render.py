"""CRI-O drop-in and k3s/RKE2 config.toml.tmpl, rendered by Ansible (no CRI-O or k3s here)."""

import tomllib

import yaml

from tests.conftest import ROOT, run_playbook


def render(tmp_path, **variables):
    variables = {"out": str(tmp_path), "__container_runtime_k3s_version": 2, **variables}
    proc = run_playbook(ROOT / "tests/unit/playbooks/render_runtime.yml", variables)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return (tmp_path / "crio.toml").read_text(), (tmp_path / "config.toml.tmpl").read_text()


def test_crio_dropin(tmp_path):
    crio, _ = render(tmp_path)
    data = tomllib.loads(crio)
    assert data == {
        "crio": {
            "runtime": {
                "runtimes": {
                    "nvidia": {
                        "runtime_path": "/usr/bin/nvidia-container-runtime",
                        "runtime_type": "oci",
                    }
                }
            }
        }
    }
    crio, _ = render(tmp_path, container_runtime_nvidia_default=True)
    assert tomllib.loads(crio)["crio"]["runtime"]["default_runtime"] == "nvidia"


def test_k3s_template_extends_the_base_and_follows_the_config_version(tmp_path):
    _, tmpl = render(tmp_path)
    assert tmpl.startswith('{{ template "base" . }}\n')
    assert "[plugins.'io.containerd.grpc.v1.cri'.containerd.runtimes.'nvidia'.options]" in tmpl
    assert 'BinaryName = "/usr/bin/nvidia-container-runtime"' in tmpl
    assert "SystemdCgroup = {{ .SystemdCgroup }}" in tmpl
    assert "default_runtime_name" not in tmpl
    _, tmpl = render(tmp_path, __container_runtime_k3s_version=3)
    assert "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'nvidia']" in tmpl


def test_the_k3s_template_task_keeps_the_file_it_replaces():
    """Static check of the role (no k3s here to run it on): a config.toml.tmpl of the user's own is
    kept as a backup when gpustack writes its own (docs/runtime.md)."""
    tasks = yaml.safe_load((ROOT / "roles/container_runtime/tasks/k3s.yml").read_text())
    write = next(t for t in tasks if t["name"].startswith("Write config.toml.tmpl"))
    assert write["ansible.builtin.template"]["backup"] is True
