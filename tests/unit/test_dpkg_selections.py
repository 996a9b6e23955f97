"""gpustack_dpkg_selections (plugins/modules, used by roles/dpkg_ready): several packages' selections in one call.

Runs the module as a script against a TEST DOUBLE of dpkg (a state file: `name selection` per
line; unknown packages are reported and ignored as dpkg does). On lab nodes the module runs
against the real dpkg (tests/lab/test_driver.py: holds after install).
"""

from __future__ import annotations

from tests.conftest import ROOT
from tests.unit.host_modules import run_module

MODULE = ROOT / "plugins/modules/gpustack_dpkg_selections.py"
FAKE_DPKG = r"""#!/bin/sh
# TEST DOUBLE (gpustack unit tests): dpkg --get-selections / --set-selections over a file.
state="$FAKE_DPKG_STATE"
case "$1" in
--get-selections)
  shift
  for p in "$@"; do
    grep -E "^$p[[:space:]]" "$state" || echo "dpkg: no packages found matching $p" >&2
  done ;;
--set-selections)
  echo "$(date +%s%N)" >> "$state.calls"
  # another package manager holds the lock for as many calls as $state.locked says
  if [ -s "$state.locked" ]; then
    left=$(cat "$state.locked")
    [ "$left" = forever ] || echo $((left - 1)) > "$state.locked"
    [ "$left" = 0 ] || {
      echo "dpkg: error: dpkg frontend lock was locked by another process with pid $$" >&2
      exit 2
    }
  fi
  while read -r name sel; do
    if grep -qE "^$name[[:space:]]" "$state"; then
      sed -i "s/^$name[[:space:]].*/$name\t$sel/" "$state"
    else
      echo "dpkg: warning: package not in status nor available database: $name" >&2
    fi
  done ;;
*) exit 2 ;;
esac
"""


def run(tmp_path, names, selection, check=False, lock_timeout=0) -> dict:
    args = {"names": names, "selection": selection, "lock_timeout": lock_timeout,
            "_ansible_check_mode": check}  # fmt: skip
    return run_module(MODULE, args, tmp_path, {"dpkg": FAKE_DPKG},
                      {"FAKE_DPKG_STATE": str(tmp_path / "selections")})  # fmt: skip


def selections(tmp_path) -> dict[str, str]:
    lines = (tmp_path / "selections").read_text().splitlines()
    return dict(line.split() for line in lines)


def test_holds_every_package_in_one_dpkg_call_and_is_idempotent(tmp_path):
    (tmp_path / "selections").write_text(
        "nvidia-smi\tinstall\nlibcuda1\thold\nnvidia-kernel-dkms\tinstall\n"
    )
    result = run(tmp_path, ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1"], "hold")
    assert result["changed"] is True
    assert result["items"] == [
        {"item": "nvidia-kernel-dkms", "before": "install", "after": "hold"},
        {"item": "nvidia-smi", "before": "install", "after": "hold"},
    ]
    assert set(selections(tmp_path).values()) == {"hold"}
    assert len((tmp_path / "selections.calls").read_text().splitlines()) == 1
    again = run(tmp_path, ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1"], "hold")
    assert again["changed"] is False and again["items"] == []
    assert len((tmp_path / "selections.calls").read_text().splitlines()) == 1  # no second write


def test_check_mode_reports_the_change_and_makes_none(tmp_path):
    (tmp_path / "selections").write_text("nvidia-smi\thold\n")
    result = run(tmp_path, ["nvidia-smi", "nvidia-persistenced"], "install", check=True)
    assert result["changed"] is True
    assert result["items"] == [
        {"item": "nvidia-smi", "before": "hold", "after": "install"},
        {"item": "nvidia-persistenced", "before": "not present", "after": "install"},
    ]
    assert selections(tmp_path) == {"nvidia-smi": "hold"}
    assert not (tmp_path / "selections.calls").exists()


def calls(tmp_path) -> int:
    path = tmp_path / "selections.calls"
    return len(path.read_text().splitlines()) if path.exists() else 0


def test_waits_for_the_dpkg_lock_and_then_sets(tmp_path):
    (tmp_path / "selections").write_text("nvidia-smi\tinstall\n")
    (tmp_path / "selections.locked").write_text("2")  # refused twice, then free
    result = run(tmp_path, ["nvidia-smi"], "hold", lock_timeout=30)
    assert result["changed"] is True and not result.get("failed"), result
    assert selections(tmp_path) == {"nvidia-smi": "hold"}
    assert calls(tmp_path) == 3


def test_a_lock_held_past_the_timeout_fails_naming_the_holder(tmp_path):
    (tmp_path / "selections").write_text("nvidia-smi\tinstall\n")
    (tmp_path / "selections.locked").write_text("forever")
    result = run(tmp_path, ["nvidia-smi"], "hold", lock_timeout=1)
    assert result["failed"] is True
    assert result["msg"].startswith("The dpkg lock is still held after 1 s by pid ")
    assert "Hint: " in result["msg"] and "dpkg_ready_lock_timeout" in result["msg"]
    assert selections(tmp_path) == {"nvidia-smi": "install"}
    assert 2 <= calls(tmp_path) <= 3  # tried, waited a second, tried again


def test_dpkg_refusing_before_it_reads_its_input_is_still_a_held_lock(tmp_path):
    """dpkg checks its lock before it reads the selections: on a held lock it exits while the
    module still writes them. More than a pipe's worth (64 KiB) makes that write fail for sure;
    the refusal must still be reported as a held lock, not as 'Error executing command.'."""
    (tmp_path / "selections").write_text("nvidia-smi\tinstall\n")
    (tmp_path / "selections.locked").write_text("forever")
    names = [f"pkg{i:03d}-" + "x" * 400 for i in range(200)]  # unknown to dpkg: 'not present'
    result = run(tmp_path, names, "hold", lock_timeout=1)
    assert result["failed"] is True
    assert result["msg"].startswith("The dpkg lock is still held after 1 s by pid "), result["msg"]


def test_without_a_timeout_a_held_lock_fails_at_once(tmp_path):
    (tmp_path / "selections").write_text("nvidia-smi\tinstall\n")
    (tmp_path / "selections.locked").write_text("forever")
    result = run(tmp_path, ["nvidia-smi"], "hold")
    assert result["failed"] is True and "after 0 s" in result["msg"]
    assert calls(tmp_path) == 1


def test_nothing_to_change_needs_no_lock(tmp_path):
    (tmp_path / "selections").write_text("nvidia-smi\thold\n")
    (tmp_path / "selections.locked").write_text("forever")
    result = run(tmp_path, ["nvidia-smi"], "hold", lock_timeout=30)
    assert result["changed"] is False and not result.get("failed"), result
    assert calls(tmp_path) == 0
