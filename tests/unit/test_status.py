"""`gpustack status`: the probe module's parsers, the drift rules, and a real local run."""

from __future__ import annotations

import json
import subprocess
from types import SimpleNamespace

import pytest

from gpustack.fleet import status as fleet
from gpustack.k8s.cluster import status as cluster_status
from gpustack.k8s.cluster.nodes import NodeMatch
from tests.conftest import run_cli, runs_started
from tests.unit.host_modules import utils

probe = utils("gpustack_host")

OLD, NEW = "535.261.03-1", "535.309.01-0+deb12u1"
TK = "1.17.8-1~gpustackfixture"


def facts(installed=OLD, loaded=None, gpus=0, pinned=OLD, held=True, tk=TK, tk_pinned=TK,
          tk_held=True, wired=True, kind="containerd", inputs=None, reboot_file=False,
          cdi=None):  # fmt: skip
    """Facts as the status play publishes them (keys of gpustack_preflight/gpustack_status)."""
    return {
        "gpustack_preflight": {
            "os": {"id": "debian", "version_id": "12", "family": "Debian"},
            "kernel": "6.1.0-18-amd64",
            "gpus": {"count": gpus, "devices": [{"model": "NVIDIA H100"}] * gpus},
            "driver": {
                "installed": {
                    "package": "nvidia-kernel-dkms" if installed else None,
                    "version": installed,
                },
                "loaded_version": loaded,
            },
            "runtime": kind,
        },
        "gpustack_status": {
            "driver": {
                "packages": {},
                "held": ["nvidia-kernel-dkms"] if held else [],
                "pinned_version": pinned,
            },
            "toolkit": {
                "installed_version": tk,
                "held": ["nvidia-container-toolkit"] if tk_held else [],
                "pinned_version": tk_pinned,
            },
            "runtime": {"kind": kind, "wired": wired, "binary_present": bool(tk), "cdi": cdi},
            "reboot_required_file": reboot_file,
        },
        "gpustack_converged_desired": {"nvidia_driver_source": "distro", **(inputs or {})},
    }


def test_a_node_as_install_left_it_has_no_drift():
    assert fleet.node_status("n1", facts()).drift == []


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"inputs": {"nvidia_driver_version": NEW}}, [f"driver installed {OLD}, desired {NEW}"]),
        ({"pinned": NEW}, [f"driver installed {OLD}, pinned {NEW}"]),
        ({"inputs": {"nvidia_driver_branch": "550"}}, [f"driver installed {OLD}, desired branch 550"]),
        ({"installed": None, "pinned": None, "gpus": 1},
         ["driver not installed (desired newest available)"]),
        ({"held": False}, ["driver package nvidia-kernel-dkms not held"]),
        ({"gpus": 2}, [f"driver {OLD} not loaded"]),
        ({"gpus": 1, "loaded": "535.104.05"},
         [f"driver loaded 535.104.05, installed {OLD}: reboot required"]),
        ({"tk": None, "tk_pinned": None, "gpus": 1, "loaded": "535.261.03"}, ["toolkit not installed"]),
        ({"inputs": {"nvidia_container_toolkit_version": "1.18.0-1"}},
         [f"toolkit installed {TK}, desired 1.18.0-1"]),
        ({"tk_pinned": "1.18.0-1"}, [f"toolkit installed {TK}, pinned 1.18.0-1"]),
        ({"tk_held": False}, ["toolkit packages not held"]),
        ({"wired": False}, ["containerd: runtime 'nvidia' not in the effective configuration"]),
    ],
)  # fmt: skip
def test_every_difference_is_named(kwargs, expected):
    assert fleet.node_status("n1", facts(**kwargs)).drift == expected


def test_a_host_without_gpu_is_not_drift_where_none_is_required():
    """doctor calls a host without an NVIDIA device expected unless gpustack_require_gpu is true;
    status agrees: what is not installed there is a note, exit 0; what is installed is checked."""
    bare = {"installed": None, "pinned": None, "tk": None, "tk_pinned": None, "wired": False}
    row = fleet.node_status("cpu1", facts(**bare))
    assert row.drift == []
    assert row.notes == [
        "no NVIDIA GPU and gpustack_require_gpu is false (expected on lab or CPU nodes): "
        "driver not installed (desired newest available); toolkit not installed; "
        "containerd: runtime 'nvidia' not in the effective configuration"
    ]
    required = fleet.node_status("cpu1", facts(**bare, inputs={"gpustack_require_gpu": "true"}))
    assert required.notes == [] and required.drift == [
        "driver not installed (desired newest available)",
        "toolkit not installed",
        "containerd: runtime 'nvidia' not in the effective configuration",
    ]
    # Installed without a GPU (the lab): still held to what install would make of it.
    partly = fleet.node_status("cpu1", facts(held=False, tk=None, tk_pinned=None))
    assert partly.drift == ["driver package nvidia-kernel-dkms not held"]
    assert partly.notes[0].endswith("toolkit not installed")


def test_a_preinstalled_driver_is_drift_unless_it_is_kept():
    """A driver loaded with no package, as on the H100 lent on 2026-11-23 (driver 580.159.04 from
    the machine image): install would stop there, so status says so; with keep it is no drift."""
    pre = {"installed": None, "pinned": None, "gpus": 1, "loaded": "580.159.04"}
    row = fleet.node_status("n1", facts(**pre))
    assert row.drift == [
        "driver 580.159.04 loaded without a driver package (preinstalled, or removed and not yet "
        "unloaded): install stops before any change; nvidia_driver_preinstalled=keep leaves it alone"
    ]
    assert row.driver["state"] == "loaded 580.159.04 (no driver package)"
    kept = fleet.node_status("n1", facts(**pre, inputs={"nvidia_driver_preinstalled": "keep"}))
    assert kept.drift == [] and kept.driver["loaded"] == "580.159.04"


def test_matching_versions_loaded_driver_and_epochs_are_no_drift():
    row = fleet.node_status("n1", facts(gpus=1, loaded="535.261.03",
                                        inputs={"nvidia_driver_version": "1:" + OLD}))  # fmt: skip
    assert row.drift == [] and row.reboot_required is False
    assert row.driver["desired"] == "1:" + OLD and row.gpus == "1× NVIDIA H100"


def test_default_source_desires_the_default_branch():
    row = fleet.node_status("n1", facts(inputs={"nvidia_driver_source": "cuda_repo"}))
    assert row.driver["desired"] == "newest of 580"
    assert row.drift == [f"driver installed {OLD}, desired branch 580"]


def test_no_runtime_means_no_runtime_expectation_and_reboot_file_shows():
    row = fleet.node_status("n1", facts(kind=None, wired=None, reboot_file=True))
    assert row.drift == [] and row.reboot_required is True


def test_kubernetes_columns_add_their_own_drift():
    gpu = facts(gpus=1, loaded="535.261.03")
    ready = {"node": "n1", "allocatable_gpus": 1, "device_plugin_ready": True}
    assert fleet.node_status("n1", gpu, ready, k8s_expected=True).drift == []
    bad = {"node": "n1", "allocatable_gpus": 0, "device_plugin_ready": False}
    assert fleet.node_status("n1", gpu, bad, k8s_expected=True).drift == [
        "nvidia.com/gpu not allocatable on the Kubernetes node",
        "device plugin pod not ready on the Kubernetes node",
    ]
    assert fleet.node_status("n1", gpu, None, k8s_expected=True).drift == [
        "no Kubernetes node for this host"
    ]
    missing = {"node": None, "error": "no Node named 'n'"}  # the lookup's own words
    assert fleet.node_status("n1", gpu, missing, k8s_expected=True).drift == ["no Node named 'n'"]


def test_paused_gpu_clients_are_drift_named_by_why():
    gpu = facts(gpus=1, loaded="535.261.03")
    node = {"metadata": {"name": "n1", "labels": {
        "nvidia.com/gpu.deploy.device-plugin": "paused-for-driver-upgrade",
        "nvidia.com/gpu.deploy.dcgm-exporter": "paused-for-driver-upgrade",
        "nvidia.com/gpu.deploy.gpu-feature-discovery": "true"}},
        "status": {"allocatable": {"nvidia.com/gpu": "1"}}}  # fmt: skip
    view = cluster_status.node_views({"h1": NodeMatch("h1", "n1", node)}, [])["h1"]
    assert view["paused_clients"] == {"dcgm-exporter": "driver-upgrade",
                                      "device-plugin": "driver-upgrade"}  # fmt: skip
    assert fleet.node_status("n1", gpu, view, k8s_expected=True).drift == [
        "device plugin pod not ready on the Kubernetes node",
        "GPU clients paused for driver-upgrade: dcgm-exporter, device-plugin",
    ]


def test_node_views_are_pure_and_map_pods_to_nodes():
    node = {
        "metadata": {"name": "n1", "labels": {cluster_status.UPGRADE_STATE_LABEL: "upgrade-done"}},
        "spec": {"unschedulable": True},
        "status": {"allocatable": {"nvidia.com/gpu": "4"},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip
    pods = [
        {"metadata": {"name": "p1"}, "spec": {"nodeName": "n1"},
         "status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        {"metadata": {"name": "p2"}, "spec": {"nodeName": "other"}, "status": {}},
    ]  # fmt: skip
    views = cluster_status.node_views(
        {"h1": NodeMatch("h1", "n1", node), "h2": NodeMatch("h2", "n2", None, "no Node", "hint")},
        pods,
    )
    assert views["h1"] == {
        "node": "n1", "ready": True, "cordoned": True, "allocatable_gpus": 4,
        "device_plugin_ready": True, "device_plugin_pods": ["p1"], "upgrade_state": "upgrade-done",
        "gfd_labels": False,
    }  # fmt: skip
    assert views["h2"] == {"node": None, "error": "no Node", "hint": "hint"}
    # A node meant to run GFD but without its labels gets a note, worded by NFD's presence.
    node["metadata"]["labels"]["nvidia.com/gpu.deploy.gpu-feature-discovery"] = "true"
    match = {"h1": NodeMatch("h1", "n1", node)}
    note = cluster_status.node_views(match, pods, nfd_api=False)["h1"]["note"]
    assert (
        note.startswith("GFD labels need Node Feature Discovery running")
        and "not installed" in note
    )
    note = cluster_status.node_views(match, pods, nfd_api=True)["h1"]["note"]
    assert "is nfd-master running?" in note
    node["metadata"]["labels"]["nvidia.com/gpu.product"] = "NVIDIA-A100-SXM4-80GB"
    view = cluster_status.node_views(match, pods, nfd_api=False)["h1"]
    assert view["gfd_labels"] is True and "note" not in view


def test_rows_mark_unreachable_hosts_and_take_the_label_upgrade_state():
    hosts = {
        "a": SimpleNamespace(facts=facts(), unreachable=False, unreachable_message=""),
        "b": SimpleNamespace(facts={}, unreachable=True, unreachable_message="ssh: timeout"),
    }
    rows = fleet.status_rows(hosts, None, {"a": "upgrade-done"})
    assert [r.reachable for r in rows] == [True, False]
    assert rows[0].upgrade_state == "upgrade-done" and rows[1].error == "ssh: timeout"
    k8s = {"a": {"node": "a", "upgrade_state": "drain-required", "allocatable_gpus": 0}}
    assert fleet.status_rows(hosts, k8s, {"a": "upgrade-done"})[0].upgrade_state == "drain-required"


def test_probe_parsers():
    pref = "# managed\nPackage: src:nvidia-graphics-drivers\nPin: version 535.261.03-1\nPin-Priority: 1001\n"
    assert probe.pinned_version(pref) == "535.261.03-1"
    assert probe.pinned_version(None) is None
    dpkg = "nvidia-smi 535.261.03-1 hi \nnvidia-driver  un \nlibcuda1 535.261.03-1 ii \n"
    assert probe.parse_dpkg(dpkg) == {"nvidia-smi": "535.261.03-1", "libcuda1": "535.261.03-1"}


V2_WIRED = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "/usr/bin/nvidia-container-runtime"
"""
V3_WIRED = """version = 3
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.'nvidia'.options]
  BinaryName = '/usr/bin/nvidia-container-runtime'
"""


@pytest.mark.parametrize(
    ("cdi", "inputs", "expected"),
    [(False, {"gpustack_k8s_gpu_allocation": "dra"},
      ["containerd: CDI off (enable_cdi = false), which gpustack_k8s_gpu_allocation=dra needs"]),
     (False, {"container_runtime_enable_cdi": "true"},
      ["containerd: CDI off (enable_cdi = false), which container_runtime_enable_cdi=true needs"]),
     (True, {"gpustack_k8s_gpu_allocation": "dra"}, []),
     (False, {}, []),  # device-plugin: CDI is the user's business
     (False, {"gpustack_k8s_gpu_allocation": "dra", "container_runtime_enable_cdi": "false"}, []),
     (None, {"gpustack_k8s_gpu_allocation": "dra"}, [])],  # 1.6: install refuses it instead
)  # fmt: skip
def test_cdi_off_where_install_turns_it_on_is_drift(cdi, inputs, expected):
    assert fleet.node_status("n1", facts(cdi=cdi, inputs=inputs)).drift == expected


def test_cdi_in_a_containerd_dump():
    assert probe.toml_enable_cdi('[plugins."io.containerd.grpc.v1.cri"]\n  enable_cdi = true\n')
    assert probe.toml_enable_cdi("  enable_cdi = false\n") is False
    assert probe.toml_enable_cdi(V2_WIRED) is None  # containerd 1.6 prints no such key


def test_runtime_detection_in_toml():
    binary = "/usr/bin/nvidia-container-runtime"
    assert probe.toml_has_runtime(V2_WIRED, "nvidia", binary)
    assert probe.toml_has_runtime(V3_WIRED, "nvidia", binary)
    assert not probe.toml_has_runtime(
        V2_WIRED, "nvidia", "/usr/local/nvidia/toolkit/nvidia-container-runtime"
    )
    assert not probe.toml_has_runtime(
        V2_WIRED.replace("runtimes.nvidia", "runtimes.runc"), "nvidia", binary
    )


def test_runtime_detection_on_a_real_containerd_dump(tmp_path, containerd_binary):
    """`containerd config dump` of a wired config (no daemon needed) is recognised (Debian's
    containerd where none is installed: tests/conftest.py)."""
    config = tmp_path / "config.toml"
    config.write_text(V2_WIRED)
    dump = subprocess.run([containerd_binary, "--config", str(config), "config", "dump"],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert probe.toml_has_runtime(dump, "nvidia", "/usr/bin/nvidia-container-runtime")
    config.write_text("version = 2\n")
    dump = subprocess.run([containerd_binary, "--config", str(config), "config", "dump"],
                          capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert not probe.toml_has_runtime(dump, "nvidia", "/usr/bin/nvidia-container-runtime")


def test_local_status_run_reports_drift_exit_5_and_changes_nothing(tmp_path, state_dir):
    """A real status play over a local connection: this machine has no gpustack stack and no
    GPU. With gpustack_require_gpu=true that is drift (exit 5); without, doctor calls the missing
    GPU expected and status lists what is missing as a note (exit 0)."""
    inv = tmp_path / "local.ini"
    inv.write_text(
        "[gpu_nodes]\nlocal1 ansible_connection=local ansible_python_interpreter=/usr/bin/python3\n"
    )
    report = tmp_path / "status.json"
    proc = run_cli("status", str(inv), "-e", "nvidia_driver_version=" + NEW, "--output", "json",
                   "-e", "gpustack_require_gpu=true", "--report", str(report))  # fmt: skip
    assert proc.returncode == 5, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc == json.loads(report.read_text())
    assert doc["exit_code"] == 5 and doc["summary"]["changed"] == 0
    node = doc["nodes"]["local1"]
    assert node["driver"]["desired"] == NEW
    assert f"driver not installed (desired {NEW})" in doc["drift"]["local1"]
    assert "toolkit not installed" in doc["drift"]["local1"]
    text = run_cli("status", str(inv))
    assert text.returncode == 0, text.stdout + text.stderr
    assert "Note: local1: no NVIDIA GPU and gpustack_require_gpu is false" in text.stdout
    assert "driver not installed" in text.stdout and "No drift on 1 node(s)" in text.stdout
    assert len(runs_started(state_dir)) == 2


def test_upgrade_state_file_is_read_per_node(tmp_path, state_dir):
    from gpustack.upgrade.state import (
        FileStateStore,
        NodeRecord,
        Target,
        UpgradeRun,
        state_path_for,
    )

    inventory = tmp_path / "inv.ini"
    path = state_path_for(inventory)
    assert fleet.upgrade_states(inventory) == {}  # no upgrade recorded
    FileStateStore(path).save(
        UpgradeRun(
            inventory=str(inventory),
            target=Target(version="535.309.01-0+deb12u1"),
            mode="host-only",
            nodes={"n1": NodeRecord("n1", state="drain-required"), "n2": NodeRecord("n2")},
        )
    )
    assert fleet.upgrade_states(inventory) == {"n1": "drain-required", "n2": "upgrade-required"}
    path.write_text("{not json")
    assert fleet.upgrade_states(inventory) == {}


def mig_fact(state="success", reason="layout all-1g.10gb applied", applied=None, mode="Enabled"):
    """The nvidia_mig role's check-mode gpustack_mig (keys of roles/nvidia_mig docs/mig.md)."""
    return {"config": "all-1g.10gb", "state": state, "reason": reason,
            "gpus": [{"index": 0, "mode_current": mode,
                      "applied": {"1g.10gb": 7} if applied is None else applied}]}  # fmt: skip


def test_mig_layout_and_its_drift():
    row = fleet.node_status("n1", {**facts(), "gpustack_mig": mig_fact()})
    assert row.mig == {"config": "all-1g.10gb", "state": "success",
                       "layout": ["GPU 0: 7 x 1g.10gb"], "drift": ""}  # fmt: skip
    assert row.drift == []
    changed = mig_fact("pending", "would change: GPU 0: create 4 x 1g.10gb", {"1g.10gb": 3})
    row = fleet.node_status("n1", {**facts(), "gpustack_mig": changed})
    assert row.mig["layout"] == ["GPU 0: 3 x 1g.10gb"]
    assert row.drift == ["MIG layout all-1g.10gb: GPU 0: create 4 x 1g.10gb"]
    off = fleet.node_status("n1", {**facts(), "gpustack_mig": mig_fact(mode="Disabled")})
    assert off.mig["layout"] == ["GPU 0: MIG Disabled"]
    assert fleet.node_status("n1", facts()).mig is None  # no layout set: no MIG row


def test_docker_with_the_runtime_in_daemon_json_but_not_loaded_is_drift():
    data = facts(kind="docker")
    data["gpustack_runtime_loaded"] = {"kind": "docker", "available": True, "runtime_loaded": True}
    row = fleet.node_status("n1", data)
    assert row.drift == [] and row.runtime["restart_needed"] is False
    data["gpustack_runtime_loaded"]["runtime_loaded"] = False  # a reload lost
    row = fleet.node_status("n1", data)
    assert row.drift == [
        "docker: runtime 'nvidia' in daemon.json, not loaded by the running daemon"
    ]
    assert row.runtime["restart_needed"] is True
    data["gpustack_runtime_loaded"] = {"kind": "docker", "available": False, "error": "x"}
    assert fleet.node_status("n1", data).drift == []  # Docker not answering: nothing to compare


def test_nvidia_persistenced_not_enabled_is_drift_and_a_left_mask_says_why():
    data = facts()
    driver = data["gpustack_status"]["driver"]
    driver["persistenced"] = {"enabled": "enabled", "active": "inactive"}
    assert fleet.node_status("n1", data).drift == []
    driver["persistenced"] = {"enabled": "masked-runtime", "active": "inactive"}
    assert fleet.node_status("n1", data).drift == [
        "nvidia-persistenced masked-runtime: install enables it"
        " (left by a run stopped in the driver's apt transaction)"
    ]
    driver["persistenced"] = {"enabled": "disabled", "active": "inactive"}
    assert fleet.node_status("n1", data).drift == [
        "nvidia-persistenced disabled: install enables it"
    ]
    data = facts(inputs={"nvidia_driver_persistenced": False})
    data["gpustack_status"]["driver"]["persistenced"] = {"enabled": "disabled", "active": ""}
    assert fleet.node_status("n1", data).drift == []  # not wanted: not drift


def test_an_initramfs_regeneration_left_pending_is_drift():
    """The driver role's marker (roles/nvidia_driver configure.yml): the blacklist changed and
    update-initramfs failed or was stopped since; the probe reports the marker's presence."""
    pending = facts()
    pending["gpustack_status"]["driver"]["initramfs_pending"] = True
    assert fleet.node_status("n1", pending).drift == [
        "initramfs not regenerated since the nouveau blacklist changed (the last run's "
        "update-initramfs failed or was stopped): install regenerates it"
    ]


def test_nvidia_persistenced_on_a_host_without_systemd_is_not_drift():
    """The driver role leaves the unit to the host's init there; systemctl cannot read it."""
    data = facts()
    data["gpustack_status"]["driver"]["persistenced"] = {"enabled": "", "active": ""}
    assert fleet.node_status("n1", data).drift == [
        "nvidia-persistenced unknown: install enables it"
    ]
    data["gpustack_preflight"]["systemd"] = False
    assert fleet.node_status("n1", data).drift == []
