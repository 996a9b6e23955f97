"""Verification's nvidia-smi parsers against output captured on a real H100 host."""

from __future__ import annotations

from gpustack.k8s.cluster.verify import compare_uuids, csv_uuids, smi_uuids
from tests.conftest import ROOT

DATA = ROOT / "tests" / "fixtures" / "gpu-host"
UUID = "GPU-ebfab540-029d-5747-e4f8-7a648117c213"


def test_nvidia_smi_dash_l_from_a_real_h100_parses_to_its_uuid():
    text = (DATA / "h100-nvidia-smi-L.txt").read_text(encoding="utf-8")
    assert smi_uuids(text) == [UUID]
    assert compare_uuids([UUID], smi_uuids(text))[0] is True


def test_query_gpu_csv_from_a_real_h100_parses_to_the_same_uuid():
    text = (DATA / "h100-query-gpu.csv").read_text(encoding="utf-8")
    assert csv_uuids(text) == [UUID]
    assert "580.159.04" in text and text.strip().endswith("Disabled")
