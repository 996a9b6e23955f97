"""The gpustack_apt_install module (the driver role's transaction: ansible.builtin.apt's install
with apt-get alone) against real dpkg-query and apt-get: the signed file:// repository of
test_apt_lists.py in private apt directories. This machine's packages are only read: the
install itself is simulated here (check mode); lab nodes run it for real (tests/lab: every first
install, upgrade and kill/re-run).

The repository holds the TEST FIXTURE packages of tests/fixtures/lab_fixtures.py.
"""

from __future__ import annotations

import subprocess

from tests.conftest import ROOT
from tests.fixtures import lab_fixtures
from tests.unit.host_modules import run_module
from tests.unit.test_apt_lists import pytestmark  # noqa: F401 (apt-get needed)

MODULE = ROOT / "plugins/modules/gpustack_apt_install.py"
LISTS = ROOT / "plugins/modules/gpustack_apt_lists.py"
OLD, NEW = lab_fixtures.VERSIONS
TOOLKIT = ["nvidia-container-toolkit", "nvidia-container-toolkit-base",
           "libnvidia-container-tools", "libnvidia-container1"]  # fmt: skip


def install(apt_env, tmp_path, packages, check=True, **args) -> dict:
    params = {"packages": packages, "apt_options": apt_env["options"],
              "extended_states": str(tmp_path / "extended_states"), "_ansible_check_mode": check,
              **args}  # fmt: skip
    return run_module(MODULE, params, tmp_path / "work")


def refreshed(apt_env, tmp_path):
    result = run_module(LISTS, {"apt_options": apt_env["options"], "valid_seconds": 0,
                                "marks": [str(apt_env["lists"])]}, tmp_path / "lists-work")  # fmt: skip
    assert not result.get("failed"), result


def own(name: str) -> str:
    """The version of a package installed on this machine."""
    return subprocess.run(["dpkg-query", "-W", "-f=${Version}", name], capture_output=True,
                          text=True, check=True).stdout  # fmt: skip


def test_missing_packages_are_simulated_at_their_versions_in_check_mode(apt_env, tmp_path):
    refreshed(apt_env, tmp_path)
    result = install(apt_env, tmp_path, [f"{name}={OLD}" for name in TOOLKIT])
    assert not result.get("failed"), result
    assert result["changed"] is True
    assert "--simulate" in result["cmd"] and result["needed"] == [f"{n}={OLD}" for n in TOOLKIT]
    for name in TOOLKIT:
        assert f"Inst {name} ({OLD}" in result["stdout"], result["stdout"]
    assert subprocess.run(["dpkg-query", "-W", TOOLKIT[0]], capture_output=True).returncode != 0


def test_a_version_the_sources_do_not_offer_fails_with_apts_words(apt_env, tmp_path):
    refreshed(apt_env, tmp_path)
    result = install(apt_env, tmp_path, [f"{TOOLKIT[0]}=9.9.9-1"])
    assert result["failed"] is True
    words = "failed: E: Version '9.9.9-1' for 'nvidia-container-toolkit' was not found"
    assert words in result["msg"], result["msg"]


def test_installed_packages_at_their_versions_need_no_transaction(apt_env, tmp_path):
    """dpkg at the version installed here, and a name without a version that is installed: no
    apt-get at all (nothing in the private lists offers either), nothing changed."""
    result = install(apt_env, tmp_path, [f"dpkg={own('dpkg')}", "apt"], check=False)
    assert (result["changed"], result["needed"], result["manual"]) == (False, [], [])
    assert "cmd" not in result


def test_an_automatically_installed_package_is_marked_manual_as_the_apt_module_does(
    apt_env, tmp_path
):
    (tmp_path / "extended_states").write_text(
        "Package: dpkg\nArchitecture: amd64\nAuto-Installed: 1\n\n"
        "Package: apt\nArchitecture: amd64\nAuto-Installed: 0\n"
    )
    # check mode: named, not run (outside it, apt-mark manual would change this machine)
    result = install(apt_env, tmp_path, [f"dpkg={own('dpkg')}", "apt"])
    assert (result["changed"], result["manual"]) == (False, ["dpkg"])


def pin(version: str) -> str:
    return f"Package: {' '.join(TOOLKIT)}\nPin: version {version}\nPin-Priority: 1001\n"


def test_check_mode_simulates_with_the_pins_the_run_writes(apt_env, tmp_path):
    """A pin on disk at another version refuses the change (the dependencies' candidates stay
    there), in apt-get's simulation as in the apt module's; with the pins the run writes first,
    the simulation is what the run installs. The directory on disk is left as it was."""
    refreshed(apt_env, tmp_path)
    prefs = tmp_path / "preferences.d"
    prefs.mkdir()
    (prefs / "gpustack-tk.pref").write_text(pin(NEW))
    options = [*apt_env["options"], f"Dir::Etc::PreferencesParts={prefs}"]
    wanted = [f"nvidia-container-toolkit={OLD}"]
    refused = install(apt_env, tmp_path, wanted, apt_options=options)
    assert refused["failed"] is True
    assert f"but {NEW} is to be installed" in refused["stdout"], refused
    written = [{"dest": str(prefs / "gpustack-tk.pref"), "content": pin(OLD)}]
    planned = install(apt_env, tmp_path, wanted, apt_options=options, pins=written,
                      preferences_dir=str(prefs))  # fmt: skip
    assert not planned.get("failed"), planned
    for name in TOOLKIT:
        assert f"Inst {name} ({OLD}" in planned["stdout"], planned["stdout"]
    assert (prefs / "gpustack-tk.pref").read_text() == pin(NEW)
    assert [p.name for p in prefs.iterdir()] == ["gpustack-tk.pref"]
