"""nvidia-smi output parsers (gpustack/smoke/parse.py) on published and hand-written samples.

tests/fixtures/real-gpu/public/*/ hold `nvidia-smi -q -x` logs published by other projects
(SOURCE.md names repository, path and blob) and two hand-written ones that say so; each
expected.json was written by hand from the XML, not from the parser.
"""

import json
from dataclasses import asdict

import pytest

from gpustack.smoke import parse
from tests.conftest import ROOT

PUBLIC = sorted((ROOT / "tests/fixtures/real-gpu/public").iterdir())


def _gpu_view(gpu: parse.Gpu, keys) -> dict:
    data = asdict(gpu)
    data["mig_devices"] = [asdict(d) for d in gpu.mig_devices]
    return {k: data[k] for k in keys}


@pytest.mark.parametrize("sample", PUBLIC, ids=[p.name for p in PUBLIC])
def test_public_samples_parse_to_the_hand_checked_values(sample):
    expected = json.loads((sample / "expected.json").read_text())
    log = parse.parse_xml((sample / "nvidia-smi-q-x.xml").read_text())
    for key in ("driver_version", "cuda_version", "attached_gpus", "dtd"):
        assert getattr(log, key) == expected[key], key
    assert len(log.gpus) == len(expected["gpus"])
    for gpu, want in zip(log.gpus, expected["gpus"], strict=True):
        assert _gpu_view(gpu, want) == want


def test_public_samples_include_mig_and_non_mig_and_label_their_source():
    logs = {p.name: parse.parse_xml((p / "nvidia-smi-q-x.xml").read_text()) for p in PUBLIC}
    assert any(g.mig_enabled for log in logs.values() for g in log.gpus)
    assert any(g.mig_current == "N/A" for log in logs.values() for g in log.gpus)
    for sample in PUBLIC:
        source = (sample / "SOURCE.md").read_text()
        assert "NOT captured by gpustack" in source or "HAND-WRITTEN" in source, sample.name


def test_mig_sample_details():
    log = parse.parse_xml(
        (
            ROOT / "tests/fixtures/real-gpu/public/netdata-a100-sxm4-40gb-mig/nvidia-smi-q-x.xml"
        ).read_text()
    )
    (gpu,) = log.gpus
    assert gpu.mig_enabled and not gpu.mig_change_pending
    assert [d.gpu_instance_id for d in gpu.mig_devices] == [1, 2]
    assert log.uuids == ["GPU-27b94a00-ed54-5c24-b1fd-1054085de32a"]


def test_pending_changes_are_seen():
    log = parse.parse_xml(
        (
            ROOT
            / "tests/fixtures/real-gpu/public/handwritten-v12-h100-pending-x2/nvidia-smi-q-x.xml"
        ).read_text()
    )
    first, second = log.gpus
    assert first.mig_change_pending and not first.mig_enabled and not first.ecc_change_pending
    assert second.ecc_change_pending and not second.mig_change_pending
    assert first.mig_devices == ()  # "<mig_devices>None</mig_devices>"


def test_na_is_not_a_pending_change():
    xml = (
        "<nvidia_smi_log><gpu id='0'><mig_mode><current_mig>N/A</current_mig>"
        "<pending_mig>N/A</pending_mig></mig_mode><ecc_mode><current_ecc>Disabled</current_ecc>"
        "<pending_ecc>[N/A]</pending_ecc></ecc_mode></gpu></nvidia_smi_log>"
    )
    (gpu,) = parse.parse_xml(xml).gpus
    assert not gpu.mig_change_pending and not gpu.ecc_change_pending


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty output"),
        (
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
            "not XML",
        ),
        ("<html><body>no</body></html>", "root element is <html>"),
        ("<nvidia_smi_log><gpu>", "not XML"),
    ],
)
def test_not_nvidia_smi_xml_is_an_error(text, message):
    with pytest.raises(parse.NvsmiParseError, match=message):
        parse.parse_xml(text)


def test_external_entities_are_not_read(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("TOPSECRET")
    xml = (
        f'<?xml version="1.0"?><!DOCTYPE nvidia_smi_log [<!ENTITY x SYSTEM "file://{secret}">]>'
        "<nvidia_smi_log><driver_version>&x;</driver_version></nvidia_smi_log>"
    )
    try:
        log = parse.parse_xml(xml)
    except parse.NvsmiParseError:
        return  # refused: fine
    assert "TOPSECRET" not in (log.driver_version or "")


def test_nvidia_smi_list_gpus_and_mig_devices():
    text = (
        "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)\n"
        "  MIG 3g.20gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)\n"
        "  MIG 1g.5gb Device 1: (UUID: MIG-GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77/7/0)\n"
        "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-0000-0000-000000000003)\n"
        "sh: 1: something else\n"
    )
    found = parse.parse_list(text)
    assert [(d["kind"], d["index"]) for d in found] == [
        ("GPU", 0),
        ("MIG", 0),
        ("MIG", 1),
        ("GPU", 1),
    ]
    assert found[0]["name"] == "NVIDIA A100-SXM4-40GB"
    assert found[2]["uuid"] == "MIG-GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77/7/0"
    assert parse.parse_list("sh: nvidia-smi: not found\n") == []
