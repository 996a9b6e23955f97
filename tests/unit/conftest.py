"""Fixtures shared by the unit tests of gpustack's apt modules (test_apt_lists.py,
test_apt_install.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.fixtures import lab_fixtures


@pytest.fixture(scope="module")
def apt_repo():
    return Path(lab_fixtures.build_toolkit_repo()["path"])


@pytest.fixture
def apt_env(tmp_path, apt_repo):
    """Private apt directories, one source: the fixture repository over file://."""
    for sub in ("parts", "lists/partial", "cache/archives/partial", "periodic"):
        (tmp_path / sub).mkdir(parents=True)
    key = tmp_path / "key.gpg"
    subprocess.run(["gpg", "--batch", "--yes", "--dearmor", "-o", str(key), str(apt_repo / "gpgkey")],
                   check=True)  # fmt: skip
    (tmp_path / "parts/fixture.sources").write_text(
        f"Types: deb\nURIs: file://{apt_repo}/stable/deb/$(ARCH)\nSuites: /\nSigned-By: {key}\n"
    )
    options = [f"Dir::Etc::SourceList={tmp_path}/none.list", f"Dir::Etc::SourceParts={tmp_path}/parts",
               f"Dir::State::Lists={tmp_path}/lists", f"Dir::Cache={tmp_path}/cache",
               "Debug::NoLocking=1", "APT::Sandbox::User=root"]  # fmt: skip
    return {"options": options, "lists": tmp_path / "lists", "parts": tmp_path / "parts",
            "stamp": tmp_path / "periodic/update-success-stamp"}  # fmt: skip
