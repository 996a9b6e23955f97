"""The lab's cgroup-layout detection: crun refuses hybrid hierarchies, runc does not."""

from pathlib import Path

import pytest

from gpustack.errors import LabError
from gpustack.lab import podman as lab


def _tree(tmp_path: Path, layout: str) -> str:
    root = tmp_path / "cgroup"
    root.mkdir()
    if layout == "v2":
        (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    elif layout in ("hybrid", "v1-empty-unified"):
        (root / "memory").mkdir()
        (root / "unified").mkdir()
        controllers = "hugetlb\n" if layout == "hybrid" else "\n"
        (root / "unified" / "cgroup.controllers").write_text(controllers)
    else:
        (root / "memory").mkdir()
    return str(root)


@pytest.mark.parametrize(
    ("layout", "expected"),
    [("v2", "v2"), ("hybrid", "hybrid"), ("v1-empty-unified", "v1"), ("v1", "v1")],
)
def test_cgroup_layout(tmp_path, layout, expected):
    assert lab.cgroup_layout(_tree(tmp_path, layout)) == expected


def test_hybrid_hierarchy_uses_runc(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUSTACK_LAB_OCI_RUNTIME", raising=False)
    monkeypatch.setattr(lab.shutil, "which", lambda name: f"/usr/sbin/{name}")
    assert lab.oci_runtime(_tree(tmp_path, "hybrid")) == "runc"


@pytest.mark.parametrize("layout", ["v2", "v1", "v1-empty-unified"])
def test_other_layouts_keep_podmans_default(tmp_path, monkeypatch, layout):
    monkeypatch.delenv("GPUSTACK_LAB_OCI_RUNTIME", raising=False)
    assert lab.oci_runtime(_tree(tmp_path, layout)) is None


def test_missing_runc_on_hybrid_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUSTACK_LAB_OCI_RUNTIME", raising=False)
    monkeypatch.setattr(lab.shutil, "which", lambda name: None)
    with pytest.raises(LabError) as err:
        lab.oci_runtime(_tree(tmp_path, "hybrid"))
    assert "runc" in err.value.message and "apt-get install runc" in err.value.hint


def test_environment_override(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSTACK_LAB_OCI_RUNTIME", "crun")
    monkeypatch.setattr(lab.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert lab.oci_runtime(_tree(tmp_path, "hybrid")) == "crun"
