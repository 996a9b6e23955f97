"""The MIG test fixture is at least as strict as the documented nvidia-smi behaviour it models.

These pin the fixture itself (tests/fixtures/nvidia_smi_mig.py): if it became laxer, the role's
lab and unit tests would prove less. None of this says anything about NVIDIA's real binary.
"""

import pytest

from tests.unit.mig_local import FixtureNode, plan


@pytest.fixture
def node(tmp_path):
    return FixtureNode(tmp_path, ["H100-SXM5-80GB", "Tesla-T4"])


def query(node, fields="mig.mode.current,mig.mode.pending"):
    rc, out = node.smi("--query-gpu=" + fields, "--format=csv,noheader")
    assert rc == 0, out
    return [line.split(", ") for line in out.splitlines()]


def test_says_it_is_a_fixture(node):
    rc, out = node.smi("--version")
    assert rc == 0 and "gpustack TEST FIXTURE" in out and "not NVIDIA software" in out
    assert "TEST FIXTURE" in node.smi()[1]
    assert node.smi("-q") == (2, "gpustack TEST FIXTURE: nvidia-smi option not modelled: -q\n")


def test_query_formats(node):
    _, out = node.smi(
        "--query-gpu=index,name,pci.device_id,memory.total,mig.mode.current", "--format=csv"
    )
    assert out.splitlines() == [
        "index, name, pci.device_id, memory.total [MiB], mig.mode.current",
        "0, NVIDIA H100 80GB HBM3, 0x233010DE, 81559 MiB, Disabled",
        "1, Tesla T4, 0x1EB810DE, 15360 MiB, [N/A]",
    ]
    assert node.smi("--query-gpu=bogus", "--format=csv") == (
        2,
        'Field "bogus" is not a valid field to query.\n',
    )


def test_mode_change_stays_pending_until_reset(node):
    rc, out = node.smi("-i", "0", "-mig", "1")
    assert (
        rc == 0
        and "pending enable state" in out
        and "Reboot the system or try nvidia-smi --gpu-reset" in out
    )
    assert query(node)[0] == ["Disabled", "Enabled"]
    assert node.smi("mig", "-lgi") == (0, "No MIG-enabled devices found.\n")  # as a real H100 did
    rc, out = node.smi("-r", "-i", "0")
    assert rc == 0 and "successfully reset" in out
    assert query(node)[0] == ["Enabled", "Enabled"]


def test_mode_change_applies_at_reboot_and_instances_are_lost(node):
    node.smi("-i", "0", "-mig", "1")
    node.reboot()
    assert query(node)[0] == ["Enabled", "Enabled"]
    assert node.smi("mig", "-i", "0", "-cgi", "9,9", "-C")[0] == 0
    assert len(plan.parse_lgi(node.smi("mig", "-lgi")[1])) == 2
    node.reboot()
    assert node.smi("mig", "-lgi") == (6, "No GPU instances found: Not Found\n")
    assert query(node)[0] == ["Enabled", "Enabled"]  # the mode setting itself persists


def test_not_capable_gpu_refuses_mig(node):
    assert node.smi("-i", "1", "-mig", "1") == (
        3,
        "Unable to enable MIG Mode for GPU 00000000:2A:00.0: Not Supported\n",
    )


def test_reset_refused_while_a_process_uses_the_gpu(node):
    node.smi("-i", "0", "-mig", "1")
    proc = node.use_gpu(0)
    try:
        rc, out = node.smi("-r", "-i", "0")
        assert rc == 255 and "currently in use by another process" in out
        assert query(node)[0] == ["Disabled", "Enabled"]
        apps = node.smi("--query-compute-apps=pid,gpu_uuid,process_name", "--format=csv,noheader")[
            1
        ]
        assert plan.parse_compute_apps(apps)[0]["pid"] == proc.pid
    finally:
        proc.kill()
        proc.wait()
    assert node.smi("-r", "-i", "0")[0] == 0  # a dead pid no longer counts
    assert node.smi("--query-compute-apps=pid", "--format=csv,noheader") == (0, "")


def test_reset_not_supported_like_gpu_passthrough(tmp_path):
    node = FixtureNode(tmp_path, ["A100-SXM4-40GB"], reset="not-supported")
    node.smi("-i", "0", "-mig", "1")
    assert node.smi("-r", "-i", "0") == (3, "Resetting GPU 00000000:18:00.0 is not supported.\n")


def test_gpu_instances_need_destroying_in_order(node):
    node.smi("-i", "0", "-mig", "1")
    node.smi("-r", "-i", "0")
    assert node.smi("mig", "-i", "0", "-cgi", "19,14", "-C")[0] == 0
    rc, out = node.smi("mig", "-i", "0", "-dgi")
    assert rc == 255 and "In use by another client" in out  # compute instances still there
    rc, out = node.smi("-i", "0", "-mig", "0")
    assert rc == 255 and "In use by another client" in out  # instances still there
    assert node.smi("mig", "-i", "0", "-dci")[0] == 0
    assert node.smi("mig", "-i", "0", "-dgi")[0] == 0
    assert node.smi("mig", "-i", "0", "-dgi") == (6, "No GPU instances found: Not Found\n")


def test_placement_order_matters_as_in_the_guide(node):
    """The MIG User Guide's example: -cgi 19,19,14,9 fails (3g must come first), 9,19,14,19 works."""
    node.smi("-i", "0", "-mig", "1")
    node.smi("-r", "-i", "0")
    rc, out = node.smi("mig", "-i", "0", "-cgi", "19,19,14,9")
    assert rc == 255 and "using profile 9: Insufficient Resources" in out
    assert len(plan.parse_lgi(node.smi("mig", "-lgi")[1])) == 3  # the first three stay
    node.smi("mig", "-i", "0", "-dgi")
    assert node.smi("mig", "-i", "0", "-cgi", "9,19,14,19", "-C")[0] == 0
    gis = plan.parse_lgi(node.smi("mig", "-lgi")[1])
    cis = plan.parse_lci(node.smi("mig", "-lci")[1])
    assert plan.current_devices(0, gis, cis) == ({"3g.40gb": 1, "2g.20gb": 1, "1g.10gb": 2}, 0)
    slices = [s for g in gis for s in range(g["start"], g["start"] + g["size"])]
    assert len(slices) == len(set(slices)) and max(slices) <= 7  # placements never overlap


def test_profile_counts_and_compute_slices_are_limits(node):
    node.smi("-i", "0", "-mig", "1")
    node.smi("-r", "-i", "0")
    rc, out = node.smi("mig", "-i", "0", "-cgi", ",".join(["19"] * 8), "-C")
    assert rc == 255 and "Insufficient Resources" in out
    node.smi("mig", "-i", "0", "-dci")
    node.smi("mig", "-i", "0", "-dgi")
    assert node.smi("mig", "-i", "0", "-cgi", "5,9")[0] == 0  # 4g + 3g = 7 compute slices
    assert node.smi("mig", "-i", "0", "-cgi", "19")[0] == 255


def test_profile_tables_per_model(tmp_path):
    node = FixtureNode(tmp_path, ["A100-SXM4-40GB", "H200-SXM5-141GB", "A100-SXM4-80GB"])
    for i in range(3):
        node.smi("-i", str(i), "-mig", "1")
        node.smi("-r", "-i", str(i))
    tables = plan.parse_lgip(node.smi("mig", "-lgip")[1])
    assert {n: p["id"] for n, p in tables[0].items()} == {
        "1g.5gb": 19,
        "1g.5gb+me": 20,
        "1g.10gb": 15,
        "2g.10gb": 14,
        "3g.20gb": 9,
        "4g.20gb": 5,
        "7g.40gb": 0,
    }
    assert sorted(tables[1]) == [
        "1g.18gb",
        "1g.18gb+me",
        "1g.35gb",
        "2g.35gb",
        "3g.71gb",
        "4g.71gb",
        "7g.141gb",
    ]
    assert tables[2]["1g.10gb"]["total"] == 7 and tables[0]["1g.10gb"]["total"] == 4
    assert node.smi("mig", "-lgipp")[1].splitlines()[:3] == [
        "GPU  0 Profile ID 19 Placements: {0,1,2,3,4,5,6}:1",
        "GPU  0 Profile ID 20 Placements: {0,1,2,3,4,5,6}:1",
        "GPU  0 Profile ID 15 Placements: {0,2,4,6}:2",
    ]


def test_list_shows_mig_devices(node):
    node.smi("-i", "0", "-mig", "1")
    node.smi("-r", "-i", "0")
    node.smi("mig", "-i", "0", "-cgi", "3g.40gb", "-C")
    lines = node.smi("-L")[1].splitlines()
    assert lines[0].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    assert lines[1].startswith("  MIG 3g.40gb     Device  0: (UUID: MIG-")
    assert lines[2].startswith("GPU 1: Tesla T4")


def test_every_call_is_logged(node):
    node.smi("-i", "0", "-mig", "1")
    node.smi("mig", "-lgi")
    assert node.calls() == [["-i", "0", "-mig", "1"], ["mig", "-lgi"]]
