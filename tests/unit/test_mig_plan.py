"""Pure MIG logic of the nvidia_mig role: layout files, selection, nvidia-smi parsing, planning."""

import pytest

from tests.unit.mig_local import LAYOUTS, fixture, plan

H100 = {"index": 0, "uuid": "GPU-a", "name": "NVIDIA H100 80GB HBM3", "bus_id": "00000000:18:00.0",
        "device_id": "0x233010DE", "sub_device_id": "0x16C110DE", "mig_capable": True,
        "mode_current": "Disabled", "mode_pending": "Disabled"}  # fmt: skip


def entry(**kw):
    return {"devices": "all", "mig-enabled": True, "mig-devices": {"1g.10gb": 7}, **kw}


@pytest.mark.parametrize(
    ("text", "name"),
    [("1g.10gb", "1g.10gb"), ("1c.1g.10gb", "1g.10gb"), ("1c.3g.40gb", "1c.3g.40gb"),
     ("1g.10gb+me", "1g.10gb+me"), ("1g.24gb+me.all", "1g.24gb+me.all"), ("1g.24gb-me", "1g.24gb-me"),
     ("7g.141gb", "7g.141gb")],
)  # fmt: skip
def test_profile_names_are_canonical(text, name):
    assert plan.profile_name(text) == name


@pytest.mark.parametrize(
    "text", ["bogus", "1g", "1g.10", "g.10gb", "1g.10gb+me-x", "1x.1g.10gb", "1g.10gb+1me", ""]
)
def test_malformed_profiles(text):
    with pytest.raises(plan.LayoutError):
        plan.parse_profile(text)


def config(*entries):
    return {"version": "v1", "mig-configs": {"x": list(entries)}}


# The cases of NVIDIA/mig-parted@bd7160f4 api/spec/v1/spec_test.go TestMigConfigSpec, plus gpustack's.
@pytest.mark.parametrize(
    ("spec", "why"),
    [
        ({"mig-enabled": True, "mig-devices": {"1g.5gb": 2}}, "missing required field: devices"),
        ({"devices": "all", "mig-devices": {"1g.5gb": 2}}, "missing required field: mig-enabled"),
        ({"devices": "all", "mig-enabled": True}, "missing required field 'mig-devices'"),
        (
            {"devices": "all", "mig-enabled": True, "mig-devices": {"bogus": 2}},
            "profile .bogus.: expected",
        ),
        ({"bogus": "field", "devices": "all", "mig-enabled": False}, "unexpected field: bogus"),
        ({"devices": "bogus", "mig-enabled": False}, "devices must be 'all'"),
        ({"devices": {}, "mig-enabled": False}, "devices must be 'all'"),
        (
            {"devices": "all", "mig-enabled": False, "mig-devices": {"1g.5gb": 1}},
            "included when 'mig-enabled' is false",
        ),
        ({"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": 0}}, "all counts"),
        ({"devices": "all", "mig-enabled": True, "mig-devices": {"1g.5gb": -1}}, "invalid count"),
        ({"devices": "all", "mig-enabled": "yes"}, "mig-enabled must be true or false"),
        (
            {"device-filter": "MODEL", "devices": "all", "mig-enabled": False},
            "device-filter must be PCI ids",
        ),
    ],
)
def test_bad_layout_entries(spec, why):
    with pytest.raises(plan.LayoutError, match=why):
        plan.parse_config(config(spec))


@pytest.mark.parametrize(
    "doc",
    [{"mig-configs": {"x": [entry()]}}, {"version": "v2", "mig-configs": {"x": [entry()]}},
     {"version": "v1"}, {"version": "v1", "mig-configs": {"x": []}}, {"version": "v1", "x": 1}, "not a mapping"],
)  # fmt: skip
def test_bad_layout_files(doc):
    with pytest.raises(plan.LayoutError):
        plan.parse_config(doc)


def test_good_entries():
    good = config(
        {"devices": "all", "mig-enabled": False},
        {"devices": [0, 1, 2], "mig-enabled": False},
        {"devices": "all", "mig-enabled": True, "mig-devices": {}},
        {"device-filter": ["0x233010DE", "0x20B010DE:0x134F10DE"], "devices": "all", "mig-enabled": True,
         "mig-devices": {"1g.10gb": 2, "2g.20gb": 1}},
    )  # fmt: skip
    assert len(plan.parse_config(good)["x"]) == 4


def test_shipped_layouts():
    shipped = plan.parse_config({"version": "v1", "mig-configs": LAYOUTS})
    for name in ("all-disabled", "all-enabled", "all-1g.5gb", "all-1g.10gb", "all-2g.20gb", "all-3g.40gb",
                 "all-7g.80gb", "all-1g.18gb", "all-7g.141gb", "all-balanced"):  # fmt: skip
        assert name in shipped
    balanced = plan.select_entry(shipped["all-balanced"], H100)
    assert plan.desired_devices(balanced) == {"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}


def model_profiles(model):
    """The fixture's profile table for a model, shaped like parse_lgip's output."""
    rows = fixture.MODELS[model][5]
    return {
        r[1]: {"id": r[0], "total": r[2], "g": r[10], "gib": float(r[3]), "free": r[2]}
        for r in rows
    }


@pytest.mark.parametrize(
    "model", ["H100-SXM5-80GB", "A100-SXM4-40GB", "A100-SXM4-80GB", "H200-SXM5-141GB"]
)
def test_layouts_fit_the_models_they_select(model):
    """Each shipped layout either has no entry for a model or one whose profiles the model offers."""
    _, device_id, sub, *_ = fixture.MODELS[model]
    gpu = dict(H100, device_id=device_id, sub_device_id=sub)
    fitting = []
    for name, entries in LAYOUTS.items():
        chosen = plan.select_entry(entries, gpu)
        wanted = plan.desired_devices(chosen) if chosen else {}
        if (
            chosen
            and chosen["mig-enabled"]
            and wanted
            and plan.check_profiles(wanted, model_profiles(model)) is None
        ):
            fitting.append(name)
        elif chosen and chosen["mig-enabled"] and wanted and chosen.get("device-filter"):
            pytest.fail(
                f"{name}: its {model} entry does not fit: {plan.check_profiles(wanted, model_profiles(model))}"
            )
    expected = {"H100-SXM5-80GB": "all-1g.10gb", "A100-SXM4-40GB": "all-1g.5gb", "A100-SXM4-80GB": "all-7g.80gb",
                "H200-SXM5-141GB": "all-1g.35gb"}  # fmt: skip
    assert expected[model] in fitting and "all-balanced" in fitting


def test_device_filters_and_indexes_select_entries():
    entries = [
        {"devices": "all", "mig-enabled": False},
        {
            "device-filter": "0x20B010DE",
            "devices": "all",
            "mig-enabled": True,
            "mig-devices": {"1g.5gb": 7},
        },
        {"devices": [1], "mig-enabled": True, "mig-devices": {"7g.80gb": 1}},
    ]
    assert plan.select_entry(entries, H100)["mig-enabled"] is False
    assert plan.select_entry(entries, dict(H100, device_id="0x20b010de"))["mig-devices"] == {
        "1g.5gb": 7
    }
    assert plan.select_entry(entries, dict(H100, index=1))["mig-devices"] == {"7g.80gb": 1}
    assert plan.select_entry(entries[1:2], H100) is None
    sub = [{"device-filter": "0x233010DE:0x16C010DE", "devices": "all", "mig-enabled": False}]
    assert plan.select_entry(sub, H100) is None  # subsystem id differs


# Tables as the MIG User Guide prints them ("Getting Started with MIG", A100 40GB examples).
GUIDE_LGI = """+----------------------------------------------------+
| GPU instances:                                     |
| GPU   Name          Profile  Instance   Placement  |
|                       ID       ID       Start:Size |
|====================================================|
|   0  MIG 1g.5gb       19        7          0:1     |
+----------------------------------------------------+
|   0  MIG 2g.10gb      14        4          2:2     |
+----------------------------------------------------+
|   0  MIG 3g.20gb       9        2          4:4     |
+----------------------------------------------------+
"""
GUIDE_LCI = """+-------------------------------------------------------+
| Compute instances:                                    |
| GPU     GPU       Name             Profile   Instance |
|       Instance                       ID        ID     |
|         ID                                            |
|=======================================================|
|   0      2       MIG 1c.3g.20gb       0         0     |
+-------------------------------------------------------+
|   0      2       MIG 1c.3g.20gb       0         1     |
+-------------------------------------------------------+
|   0      7       MIG 1g.5gb           0         0     |
+-------------------------------------------------------+
"""
GUIDE_LGIP = """|   0  MIG 1g.5gb        19     7/7        4.75       No     14     0     0   |
|                                                             1     0     0   |
|   0  MIG 3g.20gb        9     2/2        19.50      No     42     2     0   |
"""


def test_parses_the_guides_tables():
    gis, cis = plan.parse_lgi(GUIDE_LGI), plan.parse_lci(GUIDE_LCI)
    assert [(g["name"], g["gi"], g["start"], g["size"]) for g in gis] == [
        ("1g.5gb", 7, 0, 1), ("2g.10gb", 4, 2, 2), ("3g.20gb", 2, 4, 4)]  # fmt: skip
    # two 1c compute instances on the 3g GI, a whole one on the 1g GI, none on the 2g GI
    assert plan.current_devices(0, gis, cis) == ({"1c.3g.20gb": 2, "1g.5gb": 1}, 1)
    assert plan.parse_lgip(GUIDE_LGIP) == {0: {
        "1g.5gb": {"id": 19, "free": 7, "total": 7, "g": 1, "gib": 4.75},
        "3g.20gb": {"id": 9, "free": 2, "total": 2, "g": 3, "gib": 19.5}}}  # fmt: skip


def test_parse_list_maps_mig_devices_to_their_gpu():
    text = (
        "GPU 0: A100-SXM4-40GB (UUID: GPU-e86cb44c-6756-fd30-cd4a-1e6da3caf9b0)\n"
        "  MIG 3g.20gb Device 0: (UUID: MIG-c7384736-a75d-5afc-978f-d2f1294409fd)\n"
        "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-b)\n"
        "  MIG 1g.10gb     Device  0: (UUID: MIG-x)\n"
    )  # the guide's form, then the padded form of newer drivers
    assert plan.parse_list(text) == {
        "GPU-e86cb44c-6756-fd30-cd4a-1e6da3caf9b0": 0,
        "MIG-c7384736-a75d-5afc-978f-d2f1294409fd": 0,
        "GPU-b": 1,
        "MIG-x": 1,
    }


def test_parse_query_and_apps():
    gpus = plan.parse_query_gpu("0, NVIDIA H100 80GB HBM3, GPU-a, 00000000:18:00.0, 0x233010DE, 0x16C110DE, "
                                "Enabled, Disabled\n1, Tesla T4, GPU-b, 00000000:2A:00.0, 0x1EB810DE, "
                                "0x12A210DE, [N/A], [N/A]\n")  # fmt: skip
    assert gpus[0]["mode_pending"] == "Disabled" and gpus[0]["mig_capable"] is True
    assert gpus[1]["mig_capable"] is False
    apps = plan.parse_compute_apps("4242, GPU-a, python3 train.py, with, commas\n")
    assert apps == [{"pid": 4242, "gpu_uuid": "GPU-a", "name": "python3 train.py, with, commas"}]


@pytest.mark.parametrize(
    ("current", "pending", "instances", "spec", "steps"),
    [
        ("Disabled", "Disabled", {}, entry(), ["set-mode", "reset", "create"]),
        (
            "Disabled",
            "Enabled",
            {},
            entry(),
            ["reset", "create"],
        ),  # set earlier, reboot/reset pending
        ("Enabled", "Enabled", {"1g.10gb": 7}, entry(), []),
        ("Enabled", "Enabled", {"1g.10gb": 6}, entry(), ["destroy", "create"]),
        ("Enabled", "Enabled", {}, entry(), ["create"]),
        ("Enabled", "Enabled", {"1g.10gb": 7}, entry(**{"mig-devices": {}}), ["destroy"]),
        (
            "Enabled",
            "Enabled",
            {"1g.10gb": 7},
            {"devices": "all", "mig-enabled": False},
            ["destroy", "set-mode", "reset"],
        ),
        ("Enabled", "Disabled", {}, {"devices": "all", "mig-enabled": False}, ["reset"]),
        ("Disabled", "Enabled", {}, {"devices": "all", "mig-enabled": False}, ["set-mode"]),
        ("Disabled", "Disabled", {}, {"devices": "all", "mig-enabled": False}, []),
        # a pending disable under a matching layout: cleared first, as mig-parted does before SetMigMode
        ("Enabled", "Disabled", {"1g.10gb": 7}, entry(), ["destroy", "set-mode", "create"]),
    ],
)
def test_plan_steps(current, pending, instances, spec, steps):
    gpu = dict(H100, mode_current=current, mode_pending=pending)
    assert plan.plan_gpu(gpu, spec, (instances, 0))["steps"] == steps


def test_plan_empty_gpu_instances_are_drift():
    gpu = dict(H100, mode_current="Enabled", mode_pending="Enabled")
    assert plan.plan_gpu(gpu, entry(), ({"1g.10gb": 7}, 1))["steps"] == ["destroy", "create"]


def test_plan_problems():
    assert "no entry for GPU 0" in plan.plan_gpu(H100, None, ({}, 0))["problem"]
    t4 = dict(H100, name="Tesla T4", mig_capable=False, mode_current="[N/A]", mode_pending="[N/A]")
    assert plan.plan_gpu(t4, entry(), ({}, 0)) == {
        "in_layout": True,
        "desired_mode": "[N/A]",
        "desired": {"1g.10gb": 7},
        "steps": [],
        "problem": None,
    }
    assert "not MIG-capable" in plan.plan_gpu(t4, entry(devices=[0]), ({}, 0))["problem"]


def test_check_profiles():
    h100 = model_profiles("H100-SXM5-80GB")
    assert plan.check_profiles({"1g.10gb": 7}, h100) is None
    assert plan.check_profiles({"1g.10gb": 8}, h100) == "8 x 1g.10gb asked, the GPU holds at most 7"
    assert plan.check_profiles({"4g.40gb": 1, "3g.40gb": 1, "1g.10gb": 1}, h100) == (
        "the profiles need 8 compute slices, the GPU has 7"
    )
    assert plan.check_profiles({"2g.10gb": 1}, h100).startswith(
        "profile 2g.10gb is not offered by this GPU"
    )


def test_creation_orders_biggest_first_then_alternatives():
    h100 = model_profiles("H100-SXM5-80GB")
    orders = plan.creation_orders({"1g.10gb": 2, "2g.20gb": 1, "3g.40gb": 1}, h100)
    assert orders[0] == [9, 14, 19, 19]
    assert len(orders) == len({tuple(o) for o in orders}) == 12  # 4!/2! distinct orders
    assert plan.creation_orders({"4g.40gb": 1, "3g.40gb": 1}, h100)[0] == [5, 9]


def test_describe():
    gpu = dict(H100)
    text = plan.describe(gpu, plan.plan_gpu(gpu, entry(), ({}, 0)))
    assert text == "GPU 0: enable MIG mode (reset or reboot), create 7 x 1g.10gb"
