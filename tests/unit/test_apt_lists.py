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
from tests.unit import host_modules
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


# The driver role's distro source: the archive components added in this call, before the refresh
# (gpustack_apt_components' work, module_utils/gpustack_apt_components). The Debian sources file
# here is in a private /etc/apt that apt-get (reading apt_env's sources) does not see: these tests
# prove the order, the forced refresh and the results, not that apt fetches the added components
# (the lab tests do, on Debian's archive).
DEBIAN = "Types: deb\nURIs: http://deb.debian.org/debian\nSuites: bookworm\nComponents: main\n"
NONFREE = ["contrib", "non-free", "non-free-firmware"]


def components(tmp_path) -> dict:
    etc = tmp_path / "etc-apt"
    (etc / "sources.list.d").mkdir(parents=True, exist_ok=True)
    if not (etc / "sources.list.d/debian.sources").exists():
        (etc / "sources.list.d/debian.sources").write_text(DEBIAN)
    return {"components": NONFREE, "suites": ["bookworm"], "sources_dir": str(etc),
            "state_file": str(tmp_path / "state/apt-components.json")}  # fmt: skip


def debian_sources(tmp_path) -> str:
    return (tmp_path / "etc-apt/sources.list.d/debian.sources").read_text()


def test_components_added_first_refresh_fresh_lists_at_once(apt_env, tmp_path):
    age(apt_env, 60)  # fresh: only the components' change makes this call refresh
    result = run(apt_env, tmp_path, components=components(tmp_path), valid_seconds=3600)
    assert not result.get("failed"), result
    assert result["sources_changed"] is True and result["sources_pending"] is True
    assert result["refreshed"] is True and result["changed"] is True
    assert "Components: main contrib non-free non-free-firmware" in debian_sources(tmp_path)
    path = str(tmp_path / "etc-apt/sources.list.d/debian.sources")
    assert result["files"] == [path] and result["diff"][0]["after_header"] == path
    assert (tmp_path / "state/apt-txn/archive-components.pending").exists()
    assert '"non-free"' in (tmp_path / "state/apt-components.json").read_text()
    assert set(versions(result)) == set(lab_fixtures.VERSIONS)


def test_a_pending_change_refreshes_again_until_committed(apt_env, tmp_path):
    """A run killed after the components' write (or after the refresh, before the transaction
    call's commit): the next call finds the sources as wanted, the change still pending, and
    refreshes whatever the lists' age; after the commit, fresh lists are kept."""
    run(apt_env, tmp_path, components=components(tmp_path))
    age(apt_env, 60)
    again = run(apt_env, tmp_path, components=components(tmp_path))
    assert again["sources_changed"] is False and again["sources_pending"] is True
    assert again["refreshed"] is True, again
    commit = host_modules.utils("gpustack_apt_commit")
    commit.commit_components(str(tmp_path / "state/apt-components.json"))
    age(apt_env, 60)
    after = run(apt_env, tmp_path, components=components(tmp_path))
    assert (after["sources_pending"], after["refreshed"], after["changed"]) == (False, False, False)


def test_check_mode_with_components_to_add_writes_nothing_and_skips_madison(apt_env, tmp_path):
    age(apt_env, 7200)
    result = run(apt_env, tmp_path, components=components(tmp_path), _ansible_check_mode=True)
    assert result["changed"] is True and result["madison_skipped"] is True, result
    assert result["refreshed"] is False and result["stdout"] == "" and not fetched(apt_env)
    assert result["files"] and debian_sources(tmp_path) == DEBIAN
    assert not (tmp_path / "state").exists()


def test_a_refresh_that_fails_after_the_change_reports_it_for_the_rollback(apt_env, tmp_path):
    (apt_env["parts"] / "broken.list").write_text("deb http://deb.debian.org/debian\n")
    result = run(apt_env, tmp_path, components=components(tmp_path))
    assert result["failed"] is True and result["msg"].startswith("apt-get update failed: ")
    assert result["sources_changed"] is True and result["sources_pending"] is True, result


def test_no_source_for_the_suites_fails_with_a_hint_and_changes_nothing(apt_env, tmp_path):
    options = dict(components(tmp_path), suites=["trixie"])
    result = run(apt_env, tmp_path, components=options)
    assert result["failed"] is True and "no APT source for suites trixie" in result["msg"]
    assert "Hint: configure the distribution's archive" in result["msg"]
    assert debian_sources(tmp_path) == DEBIAN and not (tmp_path / "state").exists()
