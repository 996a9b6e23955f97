"""The nvidia_mig role's controller-side checks and rendered files (Ansible on the controller only)."""

import json

import pytest

from tests.conftest import ROOT, run_playbook

PLAYBOOK = ROOT / "tests/unit/playbooks/mig_role.yml"
DEBIAN = {"os": {"id": "debian", "version_id": "12", "family": "Debian"}}
EL8 = {"os": {"id": "rocky", "version_id": "8.10", "family": "RedHat"}}


def render(tmp_path, facts=DEBIAN, **variables):
    # This build machine runs no systemd: a directory stands in for /run/systemd/system.
    variables.setdefault("__nvidia_mig_systemd_marker", str(tmp_path))
    proc = run_playbook(PLAYBOOK, {"gpustack_preflight": facts, "out": str(tmp_path), **variables},
                        ANSIBLE_ROLES_PATH=str(ROOT / "roles"))  # fmt: skip
    return proc, tmp_path


def test_a_host_without_systemd_is_refused_before_any_change(tmp_path):
    """The H100 lent on 2026-11-23 ran no systemd: no boot unit could re-apply a layout there."""
    proc, out = render(tmp_path, nvidia_mig_config="all-1g.10gb",
                       __nvidia_mig_systemd_marker=str(tmp_path / "absent"))  # fmt: skip
    assert proc.returncode != 0
    assert "localhost does not run systemd" in proc.stdout and "Nothing was changed" in proc.stdout
    assert not (out / "unit").exists()


def test_shipped_layout_renders_unit_and_settings(tmp_path):
    proc, out = render(tmp_path, nvidia_mig_config="all-1g.10gb")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    unit = (out / "unit").read_text()
    assert (
        "ExecStart=/usr/bin/python3 /usr/local/lib/gpustack/mig/gpustack_mig_apply.py --settings"
        in unit
    )
    assert "After=local-fs.target systemd-modules-load.service nvidia-persistenced.service" in unit
    before = next(line for line in unit.splitlines() if line.startswith("Before="))
    assert {
        "nvidia-dcgm.service",
        "dcgm-exporter.service",
        "kubelet.service",
        "shutdown.target",
    } <= set(before[7:].split())
    settings = json.loads((out / "settings.json").read_text())
    assert (
        settings["config"] == "all-1g.10gb"
        and settings["applier"] == "auto"
        and settings["reset"] is True
    )
    assert [e["mig-devices"] for e in settings["layout"]] == [{"1g.10gb": 7}, {"1g.10gb": 4}]
    assert settings["state_file"] == "/var/lib/gpustack/mig/state.json"


def test_el8_uses_the_platform_python(tmp_path):
    proc, out = render(tmp_path, EL8, nvidia_mig_config="all-disabled")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ExecStart=/usr/libexec/platform-python " in (out / "unit").read_text()


def test_own_layout_file(tmp_path):
    own = tmp_path / "mine.yaml"
    own.write_text("version: v1\nmig-configs:\n  half:\n    - devices: [0]\n      mig-enabled: true\n"
                   "      mig-devices:\n        3g.40gb: 2\n    - devices: [1]\n      mig-enabled: false\n")  # fmt: skip
    proc, out = render(tmp_path, nvidia_mig_config="half", nvidia_mig_config_file=str(own))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    layout = json.loads((out / "settings.json").read_text())["layout"]
    assert layout == [{"devices": [0], "mig-enabled": True, "mig-devices": {"3g.40gb": 2}},
                      {"devices": [1], "mig-enabled": False}]  # fmt: skip


@pytest.mark.parametrize(
    ("variables", "message"),
    [
        (
            {"nvidia_mig_config": "all-1g.11gb"},
            "it has no layout named all-1g.11gb (it has: all-1g.10gb,",
        ),
        (
            {"nvidia_mig_config": "x", "nvidia_mig_config_file": "mine.yaml"},
            "no such file on the controller",
        ),
    ],
)
def test_bad_inputs_stop_on_the_controller(tmp_path, variables, message):
    proc, _ = render(tmp_path, **variables)
    assert proc.returncode != 0
    assert message in proc.stdout + proc.stderr
    assert "Hint:" in proc.stdout + proc.stderr


def test_broken_layout_file(tmp_path):
    own = tmp_path / "broken.yaml"
    own.write_text("version: v1\nmig-configs:\n  x:\n    - devices: all\n      mig-enabled: true\n"
                   "      mig-devices:\n        bogus: 2\n")  # fmt: skip
    proc, _ = render(tmp_path, nvidia_mig_config="x", nvidia_mig_config_file=str(own))
    assert proc.returncode != 0
    assert "mig-configs.x[0]: profile 'bogus': expected <g>g.<gb>gb" in proc.stdout + proc.stderr
