"""What a real H100 80GB printed (driver 580.159.04, MIG disabled; read-only queries, 2026-11-23,
tests/fixtures/real-gpu/2026-11-23-h100-80gb-hbm3/mig/) against the role's parsers and the MIG
test fixture. The fixture models the H100 from this capture: where they differ, the fixture is
wrong. Nothing here was captured with MIG enabled: instance listings, creation and mode changes
remain the fixture's model of NVIDIA's documentation."""

import json

import pytest

from tests.conftest import ROOT
from tests.unit.mig_local import LAYOUTS, FixtureNode, apply, fixture, plan

REAL = ROOT / "tests/fixtures/real-gpu/2026-11-23-h100-80gb-hbm3/mig"


def real(name: str) -> str:
    return (REAL / name).read_text()


@pytest.fixture
def h100(tmp_path):
    return FixtureNode(tmp_path, ["H100-SXM5-80GB"])


def test_fixture_prints_the_real_profile_tables_byte_for_byte(h100):
    assert h100.smi("mig", "-lgip") == (0, real("nvidia-smi-mig-lgip.txt"))
    assert h100.smi("mig", "-i", "0", "-lgip") == (0, real("nvidia-smi-mig-lgip.txt"))
    assert h100.smi("mig", "-lgipp") == (0, real("nvidia-smi-mig-lgipp.txt"))


def test_fixture_lists_like_the_real_tool_while_mig_is_disabled(h100):
    # The real tool exits 0 with this text on stdout; the fixture used to exit 6.
    assert h100.smi("mig", "-lgi") == (0, real("nvidia-smi-mig-lgi.txt"))
    assert h100.smi("mig", "-lci") == (0, real("nvidia-smi-mig-lci.txt"))


def test_fixture_identity_matches_the_real_gpu(h100):
    header, row = real("query-gpu.csv").splitlines()
    fields = [f.strip() for f in header.split(",")]
    rc, out = h100.smi("--query-gpu=" + ",".join(fields), "--format=csv,noheader")
    assert rc == 0
    mine, theirs = out.strip().split(", "), row.split(", ")
    for field, a, b in zip(fields, mine, theirs, strict=True):
        if field not in ("uuid", "pci.bus_id"):  # the host's own identity
            assert a == b, field


def test_role_parsers_read_the_real_output():
    _, row = real("query-gpu.csv").splitlines()
    (gpu,) = plan.parse_query_gpu(row)
    assert gpu["name"] == "NVIDIA H100 80GB HBM3" and gpu["device_id"] == "0x233010DE"
    assert gpu["mig_capable"] and gpu["mode_current"] == gpu["mode_pending"] == "Disabled"
    profiles = plan.parse_lgip(real("nvidia-smi-mig-lgip.txt"))[0]
    assert {name: (p["id"], p["total"], p["gib"]) for name, p in profiles.items()} == {
        "1g.10gb": (19, 7, 9.75),
        "1g.10gb+me": (20, 1, 9.75),
        "1g.20gb": (15, 4, 19.62),
        "2g.20gb": (14, 3, 19.62),
        "3g.40gb": (9, 2, 39.5),
        "4g.40gb": (5, 1, 39.5),
        "7g.80gb": (0, 1, 79.25),
    }
    assert plan.parse_lgi(real("nvidia-smi-mig-lgi.txt")) == []
    assert plan.parse_lci(real("nvidia-smi-mig-lci.txt")) == []
    assert plan.parse_compute_apps(real("query-compute-apps.csv")) == []
    assert plan.parse_list(real("nvidia-smi-L.txt")) == {
        "GPU-f3993bd9-fc71-5bf9-2cd9-6739a33fa32b": 0
    }
    # every shipped H100 80GB profile is one the real GPU offers
    h100_layout = LAYOUTS["all-1g.10gb"]
    entry = plan.select_entry(
        plan.parse_config({"version": "v1", "mig-configs": {"x": h100_layout}})["x"], gpu
    )
    assert entry is not None


class ReplayHost(apply.Host):
    """Serves the captured output for the read-only commands the applier runs; anything else
    (a changing command, a form not captured) fails the test."""

    def run(self, argv, record=False):
        args = argv[1:]
        if args[:1] and args[0].startswith("--query-gpu="):
            return 0, real("query-gpu.csv").splitlines()[1] + "\n"
        if args[:1] and args[0].startswith("--query-compute-apps="):
            return 0, real("query-compute-apps.csv")
        if args == ["-L"]:
            return 0, real("nvidia-smi-L.txt")
        raise AssertionError(f"not captured (or changing): {argv!r}")

    def which(self, binary):
        return None


def test_applier_in_check_mode_on_the_real_outputs(tmp_path):
    recorded = json.loads(real("applier-check-mode.json"))
    for name in ("all-disabled", "all-1g.10gb", "all-balanced"):
        settings = {
            "config": name,
            "layout": LAYOUTS[name],
            "applier": "nvidia-smi",
            "reset": True,
            "clients": [],
            "state_file": str(tmp_path / f"{name}.json"),
            "sysfs": str(tmp_path / "no-sysfs"),
        }
        result = apply.run(settings, check_mode=True, source="manual", host=ReplayHost(settings))
        assert result["commands"] == []
        assert result["state"] == recorded[name]["state"], name
        assert result["changed"] == recorded[name]["changed"], name
        assert result["reason"] == recorded[name]["reason"], name
        assert [g["steps"] for g in result["gpus"]] == [g["steps"] for g in recorded[name]["gpus"]]
    assert (
        recorded["all-disabled"]["state"] == "success" and not recorded["all-disabled"]["changed"]
    )
    assert recorded["all-1g.10gb"]["gpus"][0]["steps"] == ["set-mode", "reset", "create"]


def test_the_fixture_says_where_its_h100_table_comes_from():
    assert "2026-11-23-h100-80gb-hbm3" in (ROOT / "tests/fixtures/nvidia_smi_mig.py").read_text()
    assert fixture.MODELS["H100-SXM5-80GB"][0] == "NVIDIA H100 80GB HBM3"
