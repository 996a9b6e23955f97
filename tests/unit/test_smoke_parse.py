"""nvidia-smi output parsers (gpustack/smoke/parse.py) on hand-written samples.

tests/fixtures/real-gpu/public/*/ hold hand-written `nvidia-smi -q -x` logs in the structure
nvidia-smi prints (v8, v11 and v12 DTDs), none captured from a GPU: each SOURCE.md says so, and
each expected.json was written by hand from the XML, not from the parser.
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
    assert {log.dtd for log in logs.values()} >= {
        "nvsmi_device_v8.dtd",
        "nvsmi_device_v11.dtd",
        "nvsmi_device_v12.dtd",
    }
    for sample in PUBLIC:
        source = (sample / "SOURCE.md").read_text()
        if "HAND-WRITTEN" in source:
            assert "not captured from a GPU" in source, sample.name
        else:
            assert "NOT captured by gpustack" in source, sample.name


def _sample(name: str) -> parse.SmiLog:
    path = ROOT / "tests/fixtures/real-gpu/public" / name / "nvidia-smi-q-x.xml"
    return parse.parse_xml(path.read_text())


def test_mig_sample_details():
    log = _sample("handwritten-v11-a100-sxm4-40gb-mig")
    (gpu,) = log.gpus
    assert gpu.mig_enabled and not gpu.mig_change_pending
    assert [d.index for d in gpu.mig_devices] == [0, 1, 2, 3]
    assert [d.gpu_instance_id for d in gpu.mig_devices] == [2, 3, 9, 10]
    assert [d.compute_instance_id for d in gpu.mig_devices] == [0, 0, 0, 0]
    assert [d.memory_total_mib for d in gpu.mig_devices] == [19968, 9856, 4864, 4864]
    assert log.uuids == ["GPU-1b6ebc9c-aea7-43c3-a9be-5a0657b7731b"]
    assert gpu.persistence_mode == "Disabled" and gpu.ecc_current == gpu.ecc_pending == "Enabled"
    assert (log.driver_version, log.cuda_version) == ("515.105.01", "11.7")


def test_non_mig_consumer_sample_on_driver_535():
    log = _sample("handwritten-v12-rtx-3090-driver-535")
    (gpu,) = log.gpus
    assert log.dtd == "nvsmi_device_v12.dtd"
    assert (log.driver_version, log.cuda_version) == ("535.183.01", "12.2")
    assert gpu.mig_current == gpu.mig_pending == "N/A" and gpu.mig_devices == ()
    assert not gpu.mig_enabled and not gpu.mig_change_pending
    assert gpu.ecc_current == "N/A" and not gpu.ecc_change_pending
    assert gpu.persistence_mode == "Enabled" and gpu.serial == "N/A"
    assert log.uuids == ["GPU-61099a06-0166-4f9b-bdcd-08d2abe42258"]


def test_ecc_and_persistence_sample_without_architecture():
    log = _sample("handwritten-v11-tesla-p100-pcie-16gb-ecc")
    (gpu,) = log.gpus
    assert (log.driver_version, log.cuda_version) == ("470.256.02", "11.4")
    assert gpu.ecc_current == gpu.ecc_pending == "Enabled" and not gpu.ecc_change_pending
    assert gpu.persistence_mode == "Enabled"
    assert gpu.architecture is None  # driver 470 prints no <product_architecture>
    assert gpu.mig_current == "N/A" and gpu.mig_devices == ()
    assert log.uuids == ["GPU-8ed17429-48ce-449c-87e9-df1076e1911c"]


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
