"""Structured edits of APT sources by the gpustack_apt_components module (its work in
module_utils/gpustack_apt_components, which gpustack_apt_lists runs too)."""

import json

from tests.unit.host_modules import load, utils

load("plugins/modules/gpustack_apt_components.py", "gpustack_apt_components")
m = utils("gpustack_apt_components")
SUITES = ["bookworm", "bookworm-updates", "bookworm-security"]
NONFREE = ["contrib", "non-free", "non-free-firmware"]

DEB822 = """# Debian's own archive
Types: deb deb-src
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main contrib
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: https://download.docker.com/linux/debian
Suites: bookworm
Components: stable
"""


def test_deb822_adds_missing_components_and_keeps_everything_else():
    after, touched = m.edit_deb822(DEB822, SUITES, NONFREE, remove=False)
    assert "Components: main contrib non-free non-free-firmware" in after
    assert after.count("Components: main contrib non-free non-free-firmware") == 2
    assert "Components: stable" in after  # a third-party repo without main is left alone
    assert "# Debian's own archive" in after and "Signed-By:" in after
    assert [t["added"] for t in touched] == [NONFREE, ["non-free", "non-free-firmware"]]
    again, touched_again = m.edit_deb822(after, SUITES, NONFREE, remove=False)
    assert again == after and touched_again == []


def test_deb822_remove_takes_back_only_what_was_named():
    after, _ = m.edit_deb822(DEB822, SUITES, NONFREE, remove=False)
    back, _ = m.edit_deb822(after, SUITES, ["non-free", "non-free-firmware"], remove=True)
    assert "Components: main contrib\n" in back  # contrib was the user's on security
    assert back.count("Components: main contrib") == 2


ONE_LINE = """deb http://deb.debian.org/debian bookworm main
# deb http://deb.debian.org/debian bookworm main
deb [arch=amd64 signed-by=/k.gpg] http://deb.debian.org/debian-security bookworm-security main non-free
deb http://deb.debian.org/debian sid main
deb https://apt.example.org stable main
"""


def test_one_line_format():
    after, touched = m.edit_one_line(ONE_LINE, SUITES, NONFREE, remove=False)
    lines = after.splitlines()
    assert (
        lines[0]
        == "deb http://deb.debian.org/debian bookworm main contrib non-free non-free-firmware"
    )
    assert lines[1].startswith("# deb")  # comments untouched
    assert lines[2] == (
        "deb [arch=amd64 signed-by=/k.gpg] http://deb.debian.org/debian-security "
        "bookworm-security main non-free contrib non-free-firmware"
    )
    assert lines[3:] == ONE_LINE.splitlines()[3:]  # other suites untouched
    assert len(touched) == 2


def run_module(tmp_path, **args) -> dict:
    """The module as Ansible runs it (its module_utils resolved), against a private /etc/apt and
    state directory."""
    from tests.unit import host_modules

    params = {"components": NONFREE, "suites": SUITES, "sources_dir": str(tmp_path / "apt"),
              "state_file": str(tmp_path / "state/apt-components.json"), **args}  # fmt: skip
    module = host_modules.ROOT / "plugins/modules/gpustack_apt_components.py"
    return host_modules.run_module(module, params, tmp_path / "run")


def test_a_change_stays_pending_until_committed(tmp_path):
    """Issue 16 item 1: the record and the pending mark exist once the sources change, and
    survive until the caller refreshed the lists and committed; a run killed in between
    leaves them for the next run, which then knows it must refresh."""
    (tmp_path / "apt/sources.list.d").mkdir(parents=True)
    (tmp_path / "apt/sources.list.d/debian.sources").write_text(DEB822)
    marker = tmp_path / "state/apt-txn/archive-components.pending"
    first = run_module(tmp_path)
    assert first["changed"] is True and first["pending"] is True and marker.exists()
    record = (tmp_path / "state/apt-components.json").read_text()
    assert '"non-free"' in record
    # the next run (the first one was killed before refreshing): nothing to change, still pending
    again = run_module(tmp_path)
    assert again["changed"] is False and again["pending"] is True
    assert run_module(tmp_path, state="commit")["pending"] is False and not marker.exists()
    assert run_module(tmp_path)["pending"] is False
    # a later rollback (state=absent) takes back exactly what was recorded
    undo = run_module(tmp_path, state="absent")
    assert undo["changed"] is True
    # byte for byte, including the user's own contrib on bookworm-security (gpustack added
    # contrib to the other stanza only)
    assert (tmp_path / "apt/sources.list.d/debian.sources").read_text() == DEB822
    assert not (tmp_path / "state/apt-components.json").exists()


def test_a_rollback_takes_back_only_what_no_commit_ended(tmp_path):
    """A run that enables the components on a new source line, then fails (a broken source, a
    version not offered), rolls back that line only: what a committed run enabled earlier stays
    (seen on lab nodes: the rollback of an upgrade's target check left Debian's archive at
    `main` under an installed driver). The uninstall (state=absent) still takes back both."""
    parts = tmp_path / "apt/sources.list.d"
    parts.mkdir(parents=True)
    (parts / "debian.sources").write_text(DEB822)
    assert run_module(tmp_path)["changed"] is True
    assert run_module(tmp_path, state="commit")["pending"] is False
    committed = (parts / "debian.sources").read_text()
    mirror = "deb http://mirror.example/extra bookworm main\n"
    (parts / "extra.list").write_text(mirror)
    change = run_module(tmp_path)
    assert change["changed"] is True and change["files"] == [str(parts / "extra.list")]
    undo = run_module(tmp_path, state="rollback")
    assert undo["changed"] is True and undo["files"] == [str(parts / "extra.list")]
    assert (parts / "extra.list").read_text() == mirror
    assert (parts / "debian.sources").read_text() == committed
    assert not (tmp_path / "state/apt-txn/archive-components.pending").exists()
    assert run_module(tmp_path, state="rollback")["changed"] is False  # nothing left to undo
    # the uninstall takes back what the committed run added, byte for byte
    assert run_module(tmp_path, state="absent")["changed"] is True
    assert (parts / "debian.sources").read_text() == DEB822
    assert (parts / "extra.list").read_text() == mirror
    assert not (tmp_path / "state/apt-components.json").exists()


def test_a_rollback_after_an_interrupted_run_takes_back_its_change(tmp_path):
    """Killed after the change and before any commit: the next run finds nothing to change
    (pending), fails, and its rollback takes back the interrupted run's additions."""
    (tmp_path / "apt/sources.list.d").mkdir(parents=True)
    (tmp_path / "apt/sources.list.d/debian.sources").write_text(DEB822)
    assert run_module(tmp_path)["changed"] is True  # then killed
    again = run_module(tmp_path)
    assert again["changed"] is False and again["pending"] is True
    assert run_module(tmp_path, state="rollback")["changed"] is True
    assert (tmp_path / "apt/sources.list.d/debian.sources").read_text() == DEB822
    assert not (tmp_path / "state/apt-components.json").exists()


def test_a_rollback_of_an_older_record_with_a_pending_change_takes_back_all_it_knows(tmp_path):
    """A record written by an earlier gpustack (no "uncommitted" list) with the pending mark:
    the rollback undoes what the record names, as it did then."""
    (tmp_path / "apt/sources.list.d").mkdir(parents=True)
    (tmp_path / "apt/sources.list.d/debian.sources").write_text(DEB822)
    assert run_module(tmp_path)["changed"] is True
    state = tmp_path / "state/apt-components.json"
    record = json.loads(state.read_text())
    state.write_text(json.dumps({k: v for k, v in record.items() if k != "uncommitted"}))
    assert run_module(tmp_path, state="rollback")["changed"] is True
    assert (tmp_path / "apt/sources.list.d/debian.sources").read_text() == DEB822
