"""Every directory under tests/fixtures/real-gpu/ is parsed (README.md there: the layout).

`<date>-<gpu>/` directories are captures of ours (`gpustack smoke --capture`): each file must be
listed in COMMANDS.md, nothing may carry an unmasked serial, and the parser must still read from
the raw files what the smoke report recorded on the host. `public/<source>-<gpu>/` samples were
published by others or hand-written (SOURCE.md says which) and carry hand-checked expected.json.
A capture written by today's code is validated the same way, so the rules are exercised by the
code that writes captures now, not only by the one real capture (2026-11-23, one H100)."""

import json
import re
from datetime import date

import pytest
import yaml

from gpustack.smoke import capture, checks, parse
from tests.conftest import ROOT
from tests.unit.test_smoke_checks import gpu_host

FIXTURES = ROOT / "tests/fixtures/real-gpu"
CAPTURE_DIR = re.compile(r"^\d{4}-\d{2}-\d{2}-[a-z0-9-]+$")
DIRS = sorted(p for p in FIXTURES.iterdir() if p.is_dir() and p.name != "public") + sorted(
    (FIXTURES / "public").iterdir()
)


def validate_capture(path):
    """The rules of README.md for one `<date>-<gpu>/` capture directory."""
    assert CAPTURE_DIR.match(path.name), f"{path.name}: not <date>-<gpu>"
    commands = (path / "COMMANDS.md").read_text()
    assert "Masking:" in commands
    files = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()} - {"COMMANDS.md"}
    listed = set(re.findall(r"^\| `([^`]+)` \|", commands, re.MULTILINE))
    assert files == listed, f"files and COMMANDS.md differ: {sorted(files ^ listed)}"
    report = json.loads((path / "smoke-report.json").read_text())
    assert report["smoke"]["verdict"] in ("pass", "fail", "no NVIDIA device")
    for name in files:
        for serial in capture.serials_in((path / name).read_text(errors="replace")):
            assert re.fullmatch(r"SERIAL-MASKED-\d+", serial), f"{name}: unmasked serial"
    xml = path / "nvidia-smi-q-x.xml"
    if xml.exists():
        log = parse.parse_xml(xml.read_text())
        recorded = report["smoke"]["gpus"]
        assert [g.uuid for g in log.gpus] == [g["uuid"] for g in recorded]
        assert [g.to_dict() | {"index": i} for i, g in enumerate(log.gpus)] == recorded
    return report


@pytest.mark.parametrize("path", DIRS, ids=[p.name for p in DIRS])
def test_every_fixture_directory_parses(path):
    if (path / "SOURCE.md").exists():
        expected = json.loads((path / "expected.json").read_text())
        log = parse.parse_xml((path / "nvidia-smi-q-x.xml").read_text())
        assert log.driver_version == expected["driver_version"]
        assert [g.uuid for g in log.gpus] == [g["uuid"] for g in expected["gpus"]]
    else:
        validate_capture(path)


def test_no_other_layout_creeps_in():
    for path in FIXTURES.iterdir():
        if path.is_dir() and path.name != "public":
            assert CAPTURE_DIR.match(path.name), path.name
    for path in (FIXTURES / "public").iterdir():
        assert {"SOURCE.md", "expected.json", "nvidia-smi-q-x.xml"} <= {
            p.name for p in path.iterdir()
        }


def test_a_capture_written_today_meets_the_rules(tmp_path):
    facts = gpu_host()
    facts["gpustack_smoke"]["hostname"] = "dgx07"
    report = checks.host_smoke("dgx07", facts)
    target = capture.write_capture(tmp_path, "dgx07", facts, report, "0.1.0", date(2026, 6, 1))
    saved = validate_capture(target)
    assert saved["smoke"]["verdict"] == "pass"


TOOLKIT_CAPTURES = [p for p in DIRS if (p / "cdi").is_dir()]


@pytest.mark.parametrize("path", TOOLKIT_CAPTURES, ids=[p.name for p in TOOLKIT_CAPTURES])
def test_real_toolkit_outputs_agree_with_nvidia_smi(path):
    """What the real nvidia-ctk and the container printed, read by the parsers the checks use:
    the CDI spec and `cdi list` name the same devices, one per GPU UUID plus `all`, and
    `nvidia-smi -L` inside the container saw the host's GPUs."""
    uuids = [g.uuid for g in parse.parse_xml((path / "nvidia-smi-q-x.xml").read_text()).gpus]
    specs = {p.name: p.read_text() for p in (path / "cdi").iterdir()}
    spec_devices = parse.cdi_spec_devices(specs)
    assert sorted(spec_devices) == sorted(
        parse.cdi_list_devices((path / "nvidia-ctk-cdi-list.txt").read_text())
    )
    assert {f"nvidia.com/gpu={u}" for u in uuids} | {"nvidia.com/gpu=all"} <= set(spec_devices)
    assert parse.version_in((path / "nvidia-ctk-version.txt").read_text())
    run = (path / "container-run.txt").read_text()
    assert "gpustack-smoke-ok" in run
    assert re.findall(r"UUID: (GPU-[0-9a-f-]+)", run) == uuids
    report = json.loads((path / "smoke-report.json").read_text())
    statuses = {c["name"]: c["status"] for c in report["smoke"]["checks"]}
    assert statuses["cdi"] == statuses["container"] == "pass"


@pytest.mark.parametrize("path", TOOLKIT_CAPTURES, ids=[p.name for p in TOOLKIT_CAPTURES])
def test_the_container_check_searches_where_the_runtime_mounts_nvidia_smi(path):
    """The runtime mounts nvidia-smi at its host path (`/usr/local/nvidia/bin` on the lent H100,
    not on the PATH of an image without CUDA's ENV); the container script must look there. Its
    first version did not, and the real run printed `nvidia-smi: not found`."""
    from tests.unit.test_smoke_probe import mod

    spec = yaml.safe_load((path / "cdi/nvidia.yaml").read_text())
    mounts = (spec.get("containerEdits") or {}).get("mounts") or []
    smi = [m["containerPath"] for m in mounts if m["containerPath"].endswith("/nvidia-smi")]
    assert smi, "the CDI spec mounts no nvidia-smi"
    searched = re.search(r'PATH="\$PATH:([^"]+)"', mod.CONTAINER_SCRIPT).group(1).split(":")
    for container_path in smi:
        assert container_path.rsplit("/", 1)[0] in searched


def test_a_real_cli_older_than_the_toolkit_broke_legacy_mode_and_now_warns():
    """2026-11-27, one H100: libnvidia-container 1.15 (built from source) under toolkit 1.20. The
    real hook passed `--cuda-compat-mode`, the real CLI refused it, and the container did not
    start; the toolkit check had passed. It warns now, on the versions those tools printed."""
    path = FIXTURES / "2026-11-27-h100-80gb-hbm3"
    failed = (path / "libnvidia-container/container-run-legacy-direct.txt").read_text()
    assert "unrecognized option '--cuda-compat-mode=ldconfig'" in failed
    facts = gpu_host()
    tools = facts["gpustack_smoke"]["toolkit"]
    for name, file in [
        ("nvidia-ctk", "nvidia-ctk-version.txt"),
        ("nvidia-container-runtime", "nvidia-container-runtime-version.txt"),
        ("nvidia-container-cli", "nvidia-container-cli-version.txt"),
    ]:
        tools[name]["stdout"] = (path / file).read_text()
    check = checks.host_smoke("gpu1", facts).check("toolkit")
    assert check.status == "warn"
    assert "nvidia-container-cli 1.15.0 is not at the toolkit's 1.20.0" in check.summary


def test_real_container_cli_info_names_the_gpu_nvidia_smi_names():
    path = FIXTURES / "2026-11-27-h100-80gb-hbm3"
    uuids = [g.uuid for g in parse.parse_xml((path / "nvidia-smi-q-x.xml").read_text()).gpus]
    assert parse.cli_info_uuids((path / "nvidia-container-cli-info.txt").read_text()) == uuids
    assert parse.cli_info_uuids((path / "libnvidia-container/info.txt").read_text()) == uuids
    assert parse.version_in((path / "nvidia-container-cli-version.txt").read_text()).startswith(
        "1.15.0~rc.2"
    )
