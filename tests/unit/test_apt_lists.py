"""The gpustack_apt_lists module (the driver role's refresh and madison, one call) against real
apt-get and apt-cache: a signed file:// repository, private sources, lists and cache directories
(nothing of this machine's apt state is touched).

The repository holds the TEST FIXTURE packages of tests/fixtures/lab_fixtures.py.
"""

from __future__ import annotations

import os
import shutil
import time

import pytest

from tests.conftest import ROOT
from tests.fixtures import lab_fixtures
from tests.unit.host_modules import run_module

MODULE = ROOT / "plugins/modules/gpustack_apt_lists.py"
pytestmark = pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs apt-get")
OLD = 1_700_000_000  # 2023: far older than an hour


def run(apt_env, tmp_path, **args) -> dict:
    params = {"apt_options": apt_env["options"], "marks": [str(apt_env["stamp"]), str(apt_env["lists"])],
              "madison": ["nvidia-container-toolkit"], **args}  # fmt: skip
    return run_module(MODULE, params, tmp_path / "work")


def fetched(apt_env) -> bool:
    return any("Packages" in p.name for p in apt_env["lists"].iterdir())


def age(apt_env, seconds_ago: float) -> None:
    when = time.time() - seconds_ago
    os.utime(apt_env["lists"], (when, when))


def versions(result) -> list[str]:
    return [line.split("|")[1].strip() for line in result["stdout_lines"]]


def test_stale_lists_are_refreshed_then_madison_lists_the_versions(apt_env, tmp_path):
    age(apt_env, 7200)
    result = run(apt_env, tmp_path)
    assert not result.get("failed"), result
    assert result["refreshed"] is True and result["cache_updated"] is True and result["changed"]
    assert fetched(apt_env)
    assert set(versions(result)) == set(lab_fixtures.VERSIONS)
    assert result["cache_update_time"] == int(apt_env["lists"].stat().st_mtime)


def test_fresh_lists_are_not_refreshed_and_madison_reads_them(apt_env, tmp_path):
    age(apt_env, 7200)
    run(apt_env, tmp_path)
    age(apt_env, 60)  # refreshed a minute ago
    (apt_env["parts"] / "fixture.sources").rename(apt_env["parts"] / "fixture.sources.off")
    result = run(apt_env, tmp_path)  # with no source at all, only an update would notice
    assert result["refreshed"] is False and result["changed"] is False, result
    assert result["stdout"] == ""  # madison reads the sources: none now
    (apt_env["parts"] / "fixture.sources.off").rename(apt_env["parts"] / "fixture.sources")
    assert set(versions(run(apt_env, tmp_path))) == set(lab_fixtures.VERSIONS)


def test_valid_seconds_0_refreshes_fresh_lists(apt_env, tmp_path):
    age(apt_env, 5)
    result = run(apt_env, tmp_path, valid_seconds=0)
    assert result["refreshed"] is True and fetched(apt_env), result


def test_refresh_false_asks_madison_alone_whatever_the_lists_age(apt_env, tmp_path):
    """The toolkit role's call where no refresh is due: versions only."""
    age(apt_env, 7200)
    run(apt_env, tmp_path)
    age(apt_env, 7200)  # stale again
    result = run(apt_env, tmp_path, refresh=False)
    assert (result["refreshed"], result["changed"], result["refresh"]) == (False, False, False)
    assert set(versions(result)) == set(lab_fixtures.VERSIONS)
    assert run(apt_env, tmp_path)["refresh"] is True


def test_the_success_stamp_counts_before_the_lists_directory(apt_env, tmp_path):
    """ansible.builtin.apt's get_cache_mtime(): the stamp where it exists (Ubuntu), else the
    lists directory."""
    age(apt_env, 7200)
    apt_env["stamp"].touch()  # refreshed just now, says the stamp
    assert run(apt_env, tmp_path)["refreshed"] is False
    os.utime(apt_env["stamp"], (OLD, OLD))
    age(apt_env, 5)  # a fresh directory does not count while the stamp exists
    assert run(apt_env, tmp_path)["refreshed"] is True


def test_no_mark_at_all_means_stale(apt_env, tmp_path):
    result = run(apt_env, tmp_path, marks=[str(tmp_path / "none"), str(tmp_path / "none2")])
    assert result["refreshed"] is True and result["cache_update_time"] == 0, result


def test_check_mode_reports_a_stale_refresh_and_fetches_nothing(apt_env, tmp_path):
    age(apt_env, 7200)
    result = run(apt_env, tmp_path, _ansible_check_mode=True)
    assert result["changed"] is True and result["refreshed"] is False, result
    assert not fetched(apt_env) and result["stdout"] == ""
    age(apt_env, 60)
    assert run(apt_env, tmp_path, _ansible_check_mode=True)["changed"] is False


def test_a_source_apt_cannot_read_fails_with_apts_words(apt_env, tmp_path):
    (apt_env["parts"] / "broken.list").write_text("deb http://deb.debian.org/debian\n")  # no suite
    age(apt_env, 7200)
    result = run(apt_env, tmp_path)
    assert result["failed"] is True
    assert result["msg"].startswith("apt-get update failed: "), result["msg"]
    assert "Malformed entry 1 in list file" in result["msg"] and "broken.list" in result["msg"]


def test_a_fresh_cache_with_a_source_apt_cannot_read_fails_in_madison(apt_env, tmp_path):
    """ansible.builtin.apt fails here too (opening the cache), fresh lists or not."""
    age(apt_env, 60)
    (apt_env["parts"] / "broken.list").write_text("deb http://deb.debian.org/debian\n")
    result = run(apt_env, tmp_path)
    assert result["failed"] is True and not result.get("refreshed")
    assert result["msg"].startswith("apt-cache madison failed: "), result["msg"]
    assert "Malformed entry 1" in result["msg"]


def test_a_source_that_cannot_be_fetched_fails_although_apt_get_exits_0(apt_env, tmp_path):
    """apt-get update exits 0 when a source cannot be fetched (W: Failed to fetch ...); the
    module fails, as ansible.builtin.apt's refresh does (python-apt's FetchFailedException)."""
    (apt_env["parts"] / "gone.list").write_text("deb [trusted=yes] http://127.0.0.1:9/mirror ./\n")
    age(apt_env, 7200)
    result = run(apt_env, tmp_path)
    assert result["failed"] is True, result
    assert "http://127.0.0.1:9/mirror" in result["msg"], result["msg"]
    assert "Could not connect" in result["msg"] or "refused" in result["msg"], result["msg"]
    assert result["rc"] == 0  # apt-get's own exit code: it let the failure pass
