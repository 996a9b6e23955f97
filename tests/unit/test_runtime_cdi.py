"""CDI in containerd for NVIDIA's DRA driver: gpu_preflight's refusal on containerd 1.6 and the
role's decision (Ansible on the controller, made-up preflight facts); the merge itself is in
test_runtime_merge.py, the live run in tests/lab/test_runtime_cdi.py."""

import pytest

from tests.conftest import ROOT, run_playbook

PLAYBOOK = ROOT / "tests/unit/playbooks/runtime_cdi_refuse.yml"


def facts(version):
    return {"systemd": True, "runtime": "containerd", "kubelet": {}, "cri_dockerd": {},
            "runtimes": [{"kind": "containerd", "version": version, "config_version": 2}]}  # fmt: skip


def refuse(tmp_path, version, **variables):
    proc = run_playbook(PLAYBOOK, {"gpustack_preflight": facts(version), "out": str(tmp_path),
                                   **variables}, ANSIBLE_ROLES_PATH=str(ROOT / "roles"))  # fmt: skip
    return proc, (tmp_path / "passed").exists()


def test_dra_on_containerd_1_6_is_refused_before_any_change(tmp_path):
    proc, passed = refuse(tmp_path, "1.6.20~ds1", gpustack_k8s_gpu_allocation="dra")
    assert proc.returncode != 0 and not passed
    assert "containerd 1.6.20~ds1 on localhost has no CDI support" in proc.stdout, proc.stdout
    assert "gpustack_k8s_gpu_allocation=dra needs" in proc.stdout
    assert "Nothing was changed on this host. Hint: upgrade containerd to 1.7 or newer; or use " \
           "gpustack_k8s_gpu_allocation=device-plugin" in proc.stdout  # fmt: skip


def test_cdi_asked_for_explicitly_on_containerd_1_6_is_refused(tmp_path):
    proc, passed = refuse(tmp_path, "1.6.20", container_runtime_enable_cdi="true")
    assert proc.returncode != 0 and not passed
    assert "which container_runtime_enable_cdi=true needs" in proc.stdout, proc.stdout


@pytest.mark.parametrize(
    ("version", "variables"),
    [("1.6.20~ds1", {}),  # device-plugin: no CDI needed
     ("1.6.20", {"gpustack_k8s_gpu_allocation": "dra", "container_runtime_enable_cdi": "false"}),
     ("1.7.24~ds1", {"gpustack_k8s_gpu_allocation": "dra"}),
     ("2.1.9", {"gpustack_k8s_gpu_allocation": "dra"}),
     (None, {"gpustack_k8s_gpu_allocation": "dra"})],  # version unknown: not refused
)  # fmt: skip
def test_no_refusal_where_cdi_is_not_needed_or_containerd_has_it(tmp_path, version, variables):
    proc, passed = refuse(tmp_path, version, **variables)
    assert proc.returncode == 0 and passed, proc.stdout + proc.stderr
