"""The role's applier (module_utils/gpustack_mig_apply.py) driving the MIG test fixture locally.

The applier is the code the Ansible module and gpustack-mig.service run; here it runs unchanged
against the fixture's nvidia-smi in a temporary root. Proves gpustack's logic on the fixture's
model only (tests/fixtures/README.md).
"""

import json

import pytest

from tests.unit.mig_local import FixtureNode, InProcessHost, apply

H100x2 = ["H100-SXM5-80GB", "H100-SXM5-80GB"]
H100 = ["H100-SXM5-80GB"]


@pytest.fixture
def node(tmp_path):
    return FixtureNode(tmp_path, H100)


@pytest.fixture
def node2(tmp_path):
    return FixtureNode(tmp_path, H100x2)


def applied(result):
    return [g["applied"] for g in result["gpus"]]


def test_check_mode_changes_nothing(node2):
    node = node2
    result = node.apply("all-1g.10gb", check_mode=True)
    assert result["state"] == "pending" and result["changed"] is True
    assert result["reason"] == ("would change: GPU 0: enable MIG mode (reset or reboot), create 7 x 1g.10gb; "
                                "GPU 1: enable MIG mode (reset or reboot), create 7 x 1g.10gb")  # fmt: skip
    assert node.mutating_calls() == [] and not node.state_file.exists()


def test_apply_switch_and_disable_idempotently(node2):
    node = node2
    first = node.apply("all-1g.10gb")
    assert (first["state"], first["changed"]) == ("success", True)
    assert applied(first) == [{"1g.10gb": 7}] * 2
    assert node.mutating_calls() == [
        ["-i", "0", "-mig", "1"], ["-r", "-i", "0"], ["mig", "-i", "0", "-cgi", ",".join(["19"] * 7), "-C"],
        ["-i", "1", "-mig", "1"], ["-r", "-i", "1"], ["mig", "-i", "1", "-cgi", ",".join(["19"] * 7), "-C"]]  # fmt: skip
    recorded = json.loads(node.state_file.read_text())
    assert recorded["state"] == "success" and recorded["config"] == "all-1g.10gb"

    before = len(node.mutating_calls())
    again = node.apply("all-1g.10gb")
    assert (again["state"], again["changed"], again["commands"]) == ("success", False, [])
    assert len(node.mutating_calls()) == before

    balanced = node.apply("all-balanced")
    assert (
        balanced["state"] == "success"
        and applied(balanced) == [{"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}] * 2
    )
    assert ["mig", "-i", "0", "-cgi", "9,14,19,19", "-C"] in node.mutating_calls()  # biggest first
    assert not any("-r" in c for c in node.mutating_calls()[before:])  # no mode change: no reset

    off = node.apply("all-disabled")
    assert (
        off["state"] == "success" and [g["mode_current"] for g in off["gpus"]] == ["Disabled"] * 2
    )
    assert node.apply("all-disabled")["changed"] is False


def test_busy_gpu_refused_and_named(node2):
    node = node2
    node.apply("all-1g.10gb")
    proc = node.use_gpu(1)
    try:
        before = node.mutating_calls()
        result = node.apply("all-balanced")
        assert result["state"] == "failed" and result["changed"] is False
        assert f"pid {proc.pid} (sleep) on GPU 1 ({result['gpus'][1]['uuid']})" in result["reason"]
        assert result["reason"].endswith("nothing was changed")
        assert result["processes"][0]["pid"] == proc.pid
        assert node.mutating_calls() == before
        assert json.loads(node.state_file.read_text())["state"] == "failed"
    finally:
        proc.kill()
        proc.wait()
    assert node.apply("all-balanced")["state"] == "success"


def test_a_process_on_a_mig_device_counts_for_its_gpu(node):
    node.apply("all-1g.10gb")
    proc = node.use_gpu(0, mig=3)
    try:
        result = node.apply("all-balanced")
        assert result["state"] == "failed" and result["processes"][0]["gpu"] == 0
        assert result["processes"][0]["gpu_uuid"].startswith("MIG-")
        assert f"pid {proc.pid} (sleep) on GPU 0 (MIG-" in result["reason"]
        assert ["-L"] in node.calls()  # the MIG UUID was mapped to its GPU
    finally:
        proc.kill()
        proc.wait()


def test_idle_gpu_is_not_blocked_by_a_busy_one_that_matches(node2):
    node = node2
    node.apply("all-1g.10gb")
    proc = node.use_gpu(1)
    try:
        layout = [{"devices": [0], "mig-enabled": False},
                  {"devices": [1], "mig-enabled": True, "mig-devices": {"1g.10gb": 7}}]  # fmt: skip
        assert node.apply(layout)["state"] == "success"  # GPU 1 is busy but stays as it is
    finally:
        proc.kill()
        proc.wait()


def test_reboot_required_without_reset_then_boot_applies(tmp_path):
    node = FixtureNode(tmp_path, ["A100-SXM4-40GB"])
    first = node.apply("all-1g.5gb", reset=False)
    assert (first["state"], first["reboot_required"], first["changed"]) == ("pending", True, True)
    assert "reboot required" in first["reason"]
    assert [c for c in node.mutating_calls() if "-r" in c] == []
    second = node.apply("all-1g.5gb", reset=False)  # nothing to do until the reboot
    assert (second["state"], second["reboot_required"], second["changed"]) == (
        "pending",
        True,
        False,
    )
    assert "waiting for a reboot" in second["reason"]
    node.reboot()
    boot = node.apply("all-1g.5gb", reset=False, source="boot")
    assert (boot["state"], boot["source"]) == ("success", "boot") and applied(boot) == [
        {"1g.5gb": 7}
    ]


def test_reset_not_supported_means_reboot_required(tmp_path):
    node = FixtureNode(tmp_path, ["A100-SXM4-40GB"], reset="not-supported")
    result = node.apply("all-1g.5gb")
    assert result["state"] == "pending" and result["reboot_required"] is True
    assert "is not supported" in result["reason"]


def test_no_reset_where_sysfs_offers_none(tmp_path):
    """mig-parted's assert_gpu_reset_available: a PCI function without a reset file cannot be reset."""
    node = FixtureNode(tmp_path, ["H100-SXM5-80GB"])
    gpu = node.root / "sys/0000:18:00.0"
    gpu.mkdir(parents=True)
    (gpu / "vendor").write_text("0x10de\n")
    (gpu / "class").write_text("0x030200\n")
    result = node.apply("all-1g.10gb")
    assert result["reboot_required"] is True and not [c for c in node.mutating_calls() if "-r" in c]
    (gpu / "reset").write_text("")
    assert node.apply("all-1g.10gb")["state"] == "success"


def test_still_pending_after_rebooting_is_a_failure(tmp_path):
    node = FixtureNode(tmp_path, ["A100-SXM4-40GB"])
    node.apply("all-1g.5gb", reset=False)
    record = json.loads(node.state_file.read_text())
    node.state_file.write_text(json.dumps(dict(record, state="rebooting")))
    result = node.apply(
        "all-1g.5gb", reset=False, source="boot"
    )  # no reboot happened: mode still pending
    assert (
        result["state"] == "failed"
        and result["reason"] == "MIG mode change did not take effect after rebooting"
    )


def test_boot_restores_instances_lost_on_reboot(node):
    node.apply("all-balanced")
    uuids = node.smi("-L")[1]
    node.reboot()
    assert "MIG " not in node.smi("-L")[1]
    boot = node.apply("all-balanced", source="boot")
    assert boot["state"] == "success" and boot["changed"] is True
    after = node.smi("-L")[1]
    assert after.count("MIG ") == 4 and after != uuids  # re-created: new MIG UUIDs
    assert not [c for c in node.mutating_calls() if "-r" in c[:1]][
        2:
    ]  # the mode survived: no new reset


def test_drift_by_hand_is_seen_and_repaired(node2):
    node = node2
    node.apply("all-1g.10gb")
    gi = node.smi("mig", "-i", "0", "-lgi")[1].splitlines()[5].split()[5]
    node.smi("mig", "-i", "0", "-dci", "-gi", gi)
    node.smi("mig", "-i", "0", "-dgi", "-gi", gi)
    check = node.apply("all-1g.10gb", check_mode=True)
    assert check["changed"] is True and check["gpus"][0]["applied"] == {"1g.10gb": 6}
    assert check["gpus"][0]["matches"] is False and check["gpus"][1]["matches"] is True
    assert node.apply("all-1g.10gb")["gpus"][0]["applied"] == {"1g.10gb": 7}


def test_layout_that_does_not_fit(tmp_path):
    node = FixtureNode(tmp_path, ["A100-SXM4-40GB", "Tesla-T4"])
    # MIG off: profiles are only listed once MIG is on, so the mode is switched and then set back.
    wrong = node.apply("all-2g.20gb")
    assert (
        wrong["state"] == "failed"
        and "profile 2g.20gb is not offered by this GPU" in wrong["reason"]
    )
    assert wrong["reason"].endswith("MIG mode set back to Disabled")
    assert (wrong["gpus"][0]["mode_current"], wrong["gpus"][0]["mode_pending"]) == (
        "Disabled",
        "Disabled",
    )
    node.apply("all-1g.5gb")
    before = node.mutating_calls()
    wrong = node.apply("all-2g.20gb")  # MIG on: refused before any change
    assert (
        wrong["state"] == "failed"
        and "GPU 0 (NVIDIA A100-SXM4-40GB): profile 2g.20gb is not offered" in wrong["reason"]
    )
    assert wrong["reason"].endswith("nothing was changed") and node.mutating_calls() == before
    assert (
        node.apply("all-1g.5gb.me")["state"] == "success"
    )  # devices: all skips the T4, as mig-parted does
    filtered = node.apply([{"device-filter": "0x20B010DE", "devices": "all", "mig-enabled": False}])
    assert (
        filtered["state"] == "failed"
        and "no entry for GPU 1 (Tesla T4, 0x1EB810DE)" in filtered["reason"]
    )
    pinned = node.apply([{"devices": "all", "mig-enabled": False},
                         {"devices": [1], "mig-enabled": True, "mig-devices": {"1g.5gb": 1}}])  # fmt: skip
    assert pinned["state"] == "failed" and "GPU 1 (Tesla T4) is not MIG-capable" in pinned["reason"]


def test_compute_instance_profiles_need_mig_parted(node):
    node.apply("all-enabled")
    result = node.apply([{"devices": "all", "mig-enabled": True, "mig-devices": {"1c.3g.40gb": 3}}])
    assert result["state"] == "failed" and "need nvidia-mig-parted" in result["reason"]


def test_clients_stopped_and_started_again(node, monkeypatch):
    seen = []

    class Host(InProcessHost):
        def active(self, unit):
            return unit == "nvidia-dcgm.service"

        def systemctl(self, verb, unit):
            seen.append((verb, unit, len(node.mutating_calls())))
            self.calls.append({"argv": ["systemctl", verb, unit], "rc": 0, "output": ""})
            return 0, ""

    settings = node.settings(
        "all-1g.10gb", clients=["nvidia-dcgm.service", "dcgm-exporter.service"]
    )
    result = apply.run(settings, host=Host(settings, node.root))
    assert result["clients_stopped"] == ["nvidia-dcgm.service"]
    assert seen == [("stop", "nvidia-dcgm.service", 0), ("start", "nvidia-dcgm.service", 3)]
    seen.clear()
    assert apply.run(settings, host=Host(settings, node.root))["changed"] is False and seen == []


def test_no_gpu_and_driver_not_loaded(tmp_path):
    node = FixtureNode(tmp_path, [])
    (node.root / "etc/gpustack-fixture/nvidia-smi.json").unlink()
    result = node.apply("all-1g.10gb")
    assert result["state"] == "failed" and result["reason"].startswith(
        "no NVIDIA device (nvidia-smi: NVIDIA-SMI has failed"
    )
    gpu = node.root / "sys/0000:18:00.0"
    gpu.mkdir(parents=True)
    (gpu / "vendor").write_text("0x10de\n")
    (gpu / "class").write_text("0x030200\n")
    pending = node.apply("all-1g.10gb")
    assert pending["state"] == "pending" and pending["reason"].startswith(
        "NVIDIA driver not loaded"
    )


def test_mig_parted_applier_sequence(node):
    node.fake_parted()
    settings = dict(mig_parted=str(node.bin / "nvidia-mig-parted"), applier="auto")
    result = node.apply("all-1g.10gb", **settings)
    assert (
        result["applier"] == "nvidia-mig-parted" and result["state"] == "success"
    )  # its assert decides
    base = ["-f", str(node.config_file), "-c", "all-1g.10gb"]
    assert node.parted_calls() == [
        ["assert", *base], ["assert", "--mode-only", *base], ["apply", "--mode-only", *base],
        ["assert", "--mode-only", *base], ["apply", *base], ["assert", *base]]  # fmt: skip
    assert node.apply("all-1g.10gb", **settings)["changed"] is False  # assert passes: nothing run


def test_mig_parted_without_reset_waits_for_reboot(node):
    node.fake_parted(resets_apply_mode=False)
    result = node.apply(
        "all-1g.10gb", mig_parted=str(node.bin / "nvidia-mig-parted"), applier="auto", reset=False
    )
    assert result["reboot_required"] is True and result["state"] == "pending"
    assert [
        "apply",
        "--mode-only",
        "--skip-reset",
        "-f",
        str(node.config_file),
        "-c",
        "all-1g.10gb",
    ] in node.parted_calls()
    assert not [c for c in node.parted_calls() if c[0] == "apply" and "--mode-only" not in c]


def test_mig_parted_asked_for_but_missing(node):
    result = node.apply("all-1g.10gb", applier="nvidia-mig-parted")
    assert result["state"] == "failed" and "is not installed" in result["reason"]


def test_boot_entry_point(node, capsys):
    settings = node.settings("all-1g.10gb")
    path = node.root / "settings.json"
    path.write_text(json.dumps(settings))
    assert apply.main(["--settings", str(path)]) == 0
    assert "gpustack-mig: success: layout all-1g.10gb applied" in capsys.readouterr().out
    assert json.loads(node.state_file.read_text())["source"] == "boot"
    path.write_text(json.dumps(dict(settings, layout=[{"device-filter": "0x20B010DE", "devices": "all",
                                                        "mig-enabled": False}])))  # fmt: skip
    assert apply.main(["--settings", str(path)]) == 1
    assert apply.main(["--bogus"]) == 2
