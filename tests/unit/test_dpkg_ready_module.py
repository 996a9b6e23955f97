"""gpustack_dpkg_ready (plugins/modules, used by roles/dpkg_ready): the dpkg/apt locks waited for
and an interrupted dpkg run looked for, in one module call.

Runs the module as a script against TEST DOUBLES of `lslocks` (prints a holder of dpkg's lock for
the first N calls) and `dpkg --audit`. On lab nodes it runs against real util-linux and dpkg
(tests/lab/test_kill_rerun.py holds the real lock-frontend and checks the message; the kill
campaign recovers interrupted dpkg runs through it).
"""

from __future__ import annotations

import importlib.util
import os

from tests.conftest import ROOT
from tests.unit.host_modules import load, run_module

MODULE = ROOT / "plugins/modules/gpustack_dpkg_ready.py"
FAKE_LSLOCKS = """#!/bin/sh
# TEST DOUBLE (gpustack unit tests): a holder of dpkg's lock for the first $FAKE_HELD calls.
n=$(cat "$FAKE_DIR/lslocks.calls" 2>/dev/null || echo 0); echo $((n + 1)) > "$FAKE_DIR/lslocks.calls"
[ -e "$FAKE_DIR/lslocks.broken" ] && exit 1
echo "1 /run/other.lock"
[ "$n" -lt "$FAKE_HELD" ] && echo "$FAKE_PID /var/lib/dpkg/lock-frontend"
exit 0
"""
FAKE_DPKG = """#!/bin/sh
# TEST DOUBLE (gpustack unit tests): dpkg --audit.
[ "$1" = --audit ] && cat "$FAKE_DIR/audit" 2>/dev/null
exit 0
"""


def run(tmp_path, held=0, **args) -> dict:
    env = {"FAKE_DIR": str(tmp_path), "FAKE_HELD": str(held), "FAKE_PID": str(os.getpid())}
    return run_module(MODULE, args, tmp_path, {"lslocks": FAKE_LSLOCKS, "dpkg": FAKE_DPKG}, env)


def calls(tmp_path) -> int:
    return int((tmp_path / "lslocks.calls").read_text())


def test_free_locks_and_a_clean_dpkg(tmp_path):
    result = run(tmp_path, audit=True)
    assert result["changed"] is False and result["holders"] == [] and result["audit"] == ""
    assert calls(tmp_path) == 1 and result["waited_s"] < 1


def test_waits_until_the_holder_is_gone_then_audits(tmp_path):
    (tmp_path / "audit").write_text(
        "The following packages are only half configured, probably due to problems\n"
        " nvidia-kernel-dkms   NVIDIA binary kernel module DKMS source\n"
    )
    result = run(tmp_path, held=2, timeout=30, audit=True)
    assert result["holders"] == [] and calls(tmp_path) == 3 and result["waited_s"] >= 2
    assert "half configured" in result["audit"] and "nvidia-kernel-dkms" in result["audit"]
    assert run(tmp_path, audit=False)["audit"] == ""  # without audit: dpkg is not asked


def test_names_the_holder_at_the_timeout_and_does_not_audit(tmp_path):
    (tmp_path / "audit").write_text("half configured\n")
    result = run(tmp_path, held=100, timeout=1, audit=True)
    assert len(result["holders"]) == 1
    holder = result["holders"][0]
    assert holder.startswith(f"pid {os.getpid()} (") and "python" in holder
    assert result["audit"] == "" and 1 <= result["waited_s"] < 5


def test_an_lslocks_that_fails_counts_as_no_holder(tmp_path):
    (tmp_path / "lslocks.broken").write_text("")
    result = run(tmp_path, held=100, timeout=30)
    assert result["holders"] == [] and calls(tmp_path) == 1


# TEST DOUBLES of the system interpreters Ansible's apt module respawns under: one that imports
# python3-apt (exit 0), one that does not (exit 1). The interpreter running these tests (the
# project's virtual environment) does not see python3-apt itself: asserted, not assumed.
def interpreter(tmp_path, name, rc) -> str:
    path = tmp_path / name
    path.write_text(f'#!/bin/sh\n# TEST DOUBLE: a Python that {"imports" if rc == 0 else "lacks"} apt_pkg.\n'
                    f'echo "$@" >> "{tmp_path}/{name}.calls"\nexit {rc}\n')  # fmt: skip
    path.chmod(0o755)
    return str(path)


def test_python_apt_is_found_in_a_system_interpreter_the_apt_module_would_use(tmp_path):
    assert importlib.util.find_spec("apt_pkg") is None, "the venv must not see python3-apt"
    without, with_apt = interpreter(tmp_path, "py-without", 1), interpreter(tmp_path, "py-with", 0)
    assert run(tmp_path, audit=True, interpreters=[without, with_apt])["python_apt"] is True
    assert (tmp_path / "py-with.calls").read_text().strip() == "-c import apt, apt_pkg"
    result = run(tmp_path, audit=True, interpreters=[without, str(tmp_path / "absent")])
    assert result["python_apt"] is False and result["audit"] == ""


def test_python_apt_is_only_looked_for_with_the_audit(tmp_path):
    without = interpreter(tmp_path, "py-without", 1)
    assert run(tmp_path, interpreters=[without])["python_apt"] is True  # not asked: no claim
    assert not (tmp_path / "py-without.calls").exists()


PROBE = ROOT / "plugins/modules/gpustack_host_probe.py"
RUNTIMES = {kind: {"config": f"/nonexistent/{kind}", "service": kind}
            for kind in ("k3s", "rke2", "crio", "containerd", "docker")}  # fmt: skip


def probed(tmp_path, held=0) -> dict:
    """site.yml's probe, section dpkg (the rest of the probe reads this machine)."""
    env = {"FAKE_DIR": str(tmp_path), "FAKE_HELD": str(held), "FAKE_PID": str(os.getpid())}
    args = {"sections": ["dpkg"], "runtimes": RUNTIMES, "rke2_bin": str(tmp_path / "rke2")}
    result = run_module(PROBE, args, tmp_path, {"lslocks": FAKE_LSLOCKS, "dpkg": FAKE_DPKG}, env)
    assert not result.get("failed"), result
    return result["ansible_facts"]["gpustack_dpkg_probe"]


def test_the_host_probe_reads_what_this_module_finds_without_waiting(tmp_path):
    """site.yml leaves roles/dpkg_ready out where the probe found dpkg `ready`."""
    clean = probed(tmp_path)
    assert clean["holders"] == [] and clean["audit"] == ""
    assert clean["ready"] is clean["python_apt"]
    held = probed(tmp_path, held=5)
    assert held["holders"] == [f"pid {os.getpid()} ({_cmdline()})"] and held["ready"] is False
    assert calls(tmp_path) == 2  # one look each: no wait
    (tmp_path / "audit").write_text("The following packages are only half configured\n")
    left = probed(tmp_path)
    assert "half configured" in left["audit"] and left["ready"] is False


def _cmdline() -> str:
    with open(f"/proc/{os.getpid()}/cmdline", "rb") as fh:
        return fh.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()[:160]


def test_the_probe_leaves_dpkg_out_where_every_converged_stamp_shows_no_problem():
    probe = load("plugins/modules/gpustack_host_probe.py", "gpustack_host_probe_dpkg")
    clean = {"gpustack_converged_probe": {"stamps": {"a": {"problems": []}, "b": {"problems": []}}}}
    assert probe.looks_converged(clean) is True
    drifted = {"gpustack_converged_probe": {"stamps": {"a": {"problems": ["pin changed"]}}}}
    assert probe.looks_converged(drifted) is False
    assert probe.looks_converged({"gpustack_converged_probe": {"stamps": {}}}) is False  # first run
    assert probe.looks_converged({}) is False  # section converged not asked for
