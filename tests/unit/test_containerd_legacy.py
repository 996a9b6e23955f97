"""The loaded-configuration check and the merge on a version-1 containerd configuration with the
deprecated `default_runtime` table, against what real containerd 1.6.20, 1.7.24 and 2.1.9 printed
for it (tests/fixtures/containerd-v1-schema: `config dump` and the running daemon's CRI
configuration, recorded on lab nodes). tests/lab/test_containerd_v1_schema.py runs the same on the
lab's nodes."""

from __future__ import annotations

import copy
import json
import re
import tomllib

import pytest

from tests.conftest import ROOT
from tests.unit.host_modules import utils
from tests.unit.test_driver_filters import load

containerd = utils("gpustack_containerd")
cr = load("plugins/filter/container_runtime.py", "cr_legacy")
DATA = ROOT / "tests/fixtures/containerd-v1-schema"
CONFIG = (DATA / "config.toml").read_text()
BIN = "/usr/bin/nvidia-container-runtime"
RELEASES = {"1.6.20": "1.6.20~ds1", "1.7.24": "1.7.24~ds1", "2.1.9": "2.1.9+unknown"}


def with_type(dump, table, runtime_type):
    """The dump with the runtime_type of its `containerd.<table>` table set."""
    lines = r"(?:[ \t]*[^\s\[][^\n]*\n)*?"  # the table's key lines before runtime_type
    section = re.compile(rf"(containerd\.{table}\]\n{lines}[ \t]*runtime_type = )\"[^\"]*\"")
    changed = section.sub(lambda m: f'{m.group(1)}"{runtime_type}"', dump, count=1)
    assert changed != dump
    return changed


def recorded(release):
    dump = (DATA / f"containerd-{release}-config-dump.toml").read_text()
    cri = json.loads((DATA / f"containerd-{release}-cri-config.json").read_text())
    return dump, cri


@pytest.mark.parametrize("release", ["1.6.20", "1.7.24"])
def test_containerd_1_loads_the_legacy_table_as_the_runtime_default_and_the_check_agrees(release):
    """Before the fix, install failed here: "runtime 'default' is loaded but no longer in the
    files" (the dump prints the table as `default_runtime`, not under `runtimes`)."""
    dump, cri = recorded(release)
    assert cri["containerd"]["defaultRuntimeName"] == "default"  # what the daemon really did
    disk = containerd.disk_runtimes(dump)
    assert sorted(disk) == ["default", "runc"]
    assert disk["default"] == {"runtime_type": "io.containerd.runc.v2",
                               "options": {"SystemdCgroup": True}}  # fmt: skip
    assert containerd.differences(containerd.loaded_runtimes(cri), disk) == []


@pytest.mark.parametrize("release", ["1.6.20", "1.7.24"])
def test_the_check_stays_strict_about_the_legacy_runtime(release):
    dump, cri = recorded(release)
    disk = containerd.disk_runtimes(dump)
    without = copy.deepcopy(cri)
    del without["containerd"]["runtimes"]["default"]  # a daemon started before the table was added
    assert containerd.differences(containerd.loaded_runtimes(without), disk) == [
        "runtime 'default' is in the files but not loaded"
    ]
    other = copy.deepcopy(cri)
    other["containerd"]["runtimes"]["default"]["options"]["SystemdCgroup"] = False
    assert containerd.differences(containerd.loaded_runtimes(other), disk) == [
        "runtime 'default': loaded SystemdCgroup=False, files say True"
    ]
    # the table taken out of the files while the daemon still runs it
    untyped = containerd.disk_runtimes(with_type(dump, "default_runtime", ""))
    assert containerd.differences(containerd.loaded_runtimes(cri), untyped) == [
        "runtime 'default' is loaded but no longer in the files"
    ]


def test_containerd_2_1_has_no_legacy_runtime_on_either_side():
    dump, cri = recorded("2.1.9")
    assert cri["containerd"]["defaultRuntimeName"] == "runc"
    assert ".default_runtime" not in dump  # containerd 2 has no such field
    assert sorted(containerd.disk_runtimes(dump)) == ["runc"]
    assert containerd.differences(containerd.loaded_runtimes(cri),
                                  containerd.disk_runtimes(dump)) == []  # fmt: skip
    # and it ignores the version-1 file's CRI table altogether (fixed in containerd 2.3.0)
    assert "registry.k8s.io/pause:3.6" not in dump and "mirror.example.com" not in dump


def test_an_untyped_legacy_table_as_every_1_x_dump_prints_it_adds_no_runtime():
    """containerd 1.x prints `default_runtime` and `untrusted_workload_runtime` in every dump,
    with runtime_type "" unless the files set one."""
    dump, _ = recorded("1.6.20")
    assert "untrusted_workload_runtime]" in dump
    assert "untrusted" not in containerd.disk_runtimes(dump)
    typed = with_type(dump, "untrusted_workload_runtime", "io.containerd.kata.v2")
    assert containerd.disk_runtimes(typed)["untrusted"]["runtime_type"] == "io.containerd.kata.v2"


@pytest.mark.parametrize("release", ["1.6.20", "1.7.24"])
def test_the_merge_on_containerd_1_keeps_the_table_and_gives_nvidia_its_cgroup_setting(release):
    dump, _ = recorded(release)
    out = cr.containerd_nvidia(CONFIG, dump, RELEASES[release])
    assert out["dropin_version"] == 1 and out["plugin_key"] == "cri"
    cri = tomllib.loads(out["dropin"])["plugins"]["cri"]
    assert cri["sandbox_image"] == "registry.k8s.io/pause:3.6"
    assert cri["registry"]["mirrors"]["docker.io"]["endpoint"][0] == "https://mirror.example.com"
    assert cri["containerd"]["default_runtime"]["options"] == {"SystemdCgroup": True}
    nvidia = cri["containerd"]["runtimes"]["nvidia"]
    assert nvidia["options"]["SystemdCgroup"] is True and nvidia["options"]["BinaryName"] == BIN
    assert cri["containerd"]["runtimes"]["runc"]["options"]["SystemdCgroup"] is False


def test_the_merge_on_containerd_2_1_writes_a_version_3_dropin():
    dump, _ = recorded("2.1.9")
    out = cr.containerd_nvidia(CONFIG, dump, RELEASES["2.1.9"])
    dropin = tomllib.loads(out["dropin"])
    assert dropin["version"] == 3
    runtimes = dropin["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]
    assert list(runtimes) == ["nvidia"] and runtimes["nvidia"]["options"]["BinaryName"] == BIN
    assert runtimes["nvidia"]["options"]["SystemdCgroup"] is False  # runc's: 2.x has no legacy
