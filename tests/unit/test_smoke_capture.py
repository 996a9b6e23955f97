"""Masking and writing of captures (gpustack/smoke/capture.py): real outputs become test data
without the site's hostnames and serial numbers."""

import json
from datetime import date

from gpustack.smoke import capture, checks, parse
from tests.unit.test_smoke_checks import A100_UUID, gpu_host


def test_serials_are_masked_everywhere_with_stable_numbers():
    text = (
        "<serial>1324321002473</serial><serial>N/A</serial><serial>0324217145110</serial>"
        '{"serial": "1324321002473"} part 1324321002473X stays'
    )
    masker = capture.Masker.build([], capture.serials_in(text))
    out = masker.apply(text)
    assert "<serial>SERIAL-MASKED-1</serial>" in out and "<serial>SERIAL-MASKED-2</serial>" in out
    assert '{"serial": "SERIAL-MASKED-1"}' in out and "<serial>N/A</serial>" in out
    assert "1324321002473X" in out, "only whole values are serials"
    assert "0324217145110" not in out


def test_hostnames_fqdn_first_any_case_whole_words():
    masker = capture.Masker.build(["dgx07.corp.example.com", "dgx07", "localhost"], [])
    assert masker.hostnames == ("dgx07.corp.example.com", "dgx07")
    out = masker.apply("DGX07 dgx07.corp.example.com dgx070 my-dgx07 dgx07_x ssh root@dgx07:")
    assert out == "gpu-host gpu-host dgx070 my-dgx07 gpu-host_x ssh root@gpu-host:"


def test_generic_hostnames_are_reported_not_replaced():
    masker = capture.Masker.build(["gpu", "n1", "localhost"], [])
    assert masker.hostnames == () and masker.not_masked == ("gpu", "n1")
    assert masker.apply("<gpu id='0'>") == "<gpu id='0'>"
    assert "NOT masked" in masker.describe() and "`gpu`" in masker.describe()


def test_directory_names():
    facts = gpu_host()
    report = checks.host_smoke("gpu1", facts)
    assert capture.directory_name(date(2026, 6, 1), report, facts) == "2026-06-01-a100-sxm4-40gb"
    report.gpus = report.gpus * 8
    assert capture.directory_name(date(2026, 6, 1), report, facts) == "2026-06-01-a100-sxm4-40gb-x8"
    bare = checks.HostSmoke("lab", "no NVIDIA device", "")
    assert capture.directory_name(date(2026, 6, 1), bare, {}) == "2026-06-01-no-gpu"


def test_write_capture_masks_every_file_and_lists_every_command(tmp_path):
    facts = gpu_host()
    facts["gpustack_smoke"]["hostname"] = "dgx07"
    facts["gpustack_smoke"]["fqdn"] = "dgx07.corp.example.com"
    facts["gpustack_smoke"]["container"]["run"]["stderr"] = "warning from dgx07.corp.example.com\n"
    report = checks.host_smoke("dgx07.corp.example.com", facts)
    target = capture.write_capture(
        tmp_path, "dgx07.corp.example.com", facts, report, "0.1.0", date(2026, 6, 1)
    )
    assert target.name == "2026-06-01-a100-sxm4-40gb"
    files = sorted(str(p.relative_to(target)) for p in target.rglob("*") if p.is_file())
    assert files == sorted([
        "COMMANDS.md", "smoke-report.json", "nvidia-smi-q-x.xml", "proc-driver-nvidia-version.txt",
        "lspci-nn-D-d-10de.txt", "systemctl-show-nvidia-fabricmanager.txt", "nvidia-ctk-version.txt",
        "nvidia-container-runtime-version.txt", "nvidia-container-cli-version.txt",
        "nvidia-container-cli-info.txt", "cdi/nvidia.yaml", "nvidia-ctk-cdi-generate.log",
        "nvidia-ctk-cdi-list.txt", "container-run.txt", "container-run.stderr.txt",
    ])  # fmt: skip
    for path in target.rglob("*"):
        if path.is_file():
            text = path.read_text()
            assert "1324321002473" not in text, path
            assert "dgx07" not in text.lower(), path
            assert "/tmp/gpustack-smoke-cdi-abc" not in text or path.name.endswith(".yaml"), path
    commands = (target / "COMMANDS.md").read_text()
    for name in files:
        assert f"`{name}`" in commands or name == "COMMANDS.md", name
    assert "`nvidia-ctk cdi generate --output=<tmp>/nvidia.yaml`" in commands
    assert "1 hostname(s)" not in commands and "2 hostname(s) replaced" in commands
    # The masked XML still parses to the same GPUs, serial aside; UUIDs are kept.
    log = parse.parse_xml((target / "nvidia-smi-q-x.xml").read_text())
    assert log.gpus[0].serial == "SERIAL-MASKED-1" and log.gpus[0].uuid == A100_UUID
    saved = json.loads((target / "smoke-report.json").read_text())
    assert saved["host"] == "gpu-host" and saved["smoke"]["verdict"] == "pass"
    assert saved["smoke"]["gpus"][0]["serial"] == "SERIAL-MASKED-1"
    again = capture.write_capture(tmp_path, "dgx07", facts, report, "0.1.0", date(2026, 6, 1))
    assert again.name == "2026-06-01-a100-sxm4-40gb-2", "an earlier capture is never overwritten"
