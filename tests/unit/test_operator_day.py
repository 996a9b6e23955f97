"""What real operators do (issue 16): killed runs, concurrent runs, hostile nodes, fleet views.

Pure and local checks: host locks across processes, the child guard, SIGTERM, --limit,
doctor on unreachable hosts, status width and companions, the containerd loaded/disk
comparison and its gRPC framing, the companion version choice. The lab side is
tests/lab/test_kill_rerun.py and benchmarks/kill_rerun.py.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from gpustack.ansible import locks
from gpustack.ansible.inventory import Inventory
from gpustack.fleet import doctor
from gpustack.fleet import status as fleet
from gpustack.terminal import fleet_view
from tests.conftest import ROOT, run_cli, runs_started
from tests.unit.host_modules import utils
from tests.unit.test_driver_filters import load
from tests.unit.test_status import facts

loaded_mod = utils("gpustack_containerd")
status_mod = utils("gpustack_host")
driver_filters = load("plugins/filter/nvidia_driver.py", "nd_filters_16")

INI = textwrap.dedent("""\
    [gpu_nodes]
    n1 ansible_host=10.0.0.1
    n2 ansible_host=10.0.0.2 ansible_port=2222
    n3
    """)


@pytest.fixture
def inventory(tmp_path):
    path = tmp_path / "inv.ini"
    path.write_text(INI)
    return path


# --- host locks --------------------------------------------------------------------------------
HOLDER = textwrap.dedent("""\
    import sys, time
    from gpustack.ansible import locks
    from gpustack.ansible.inventory import load_inventory
    inv = load_inventory(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else None)
    with locks.hold(inv, "gpustack install " + sys.argv[1]):
        print("held", flush=True)
        time.sleep(600)
    """)


def _holder(inventory: Path, state_dir: Path, limit: str | None = None) -> subprocess.Popen:
    env = {**os.environ, "GPUSTACK_STATE_DIR": str(state_dir)}
    args = [sys.executable, "-c", HOLDER, str(inventory), *([limit] if limit else [])]
    proc = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_run_on_the_same_hosts_is_refused_naming_the_first(inventory, state_dir):
    first = _holder(inventory, state_dir)
    try:
        proc = run_cli("install", str(inventory), env={"GPUSTACK_STATE_DIR": str(state_dir)})
        assert proc.returncode == 6, proc.stderr
        error, hint = proc.stderr.strip().splitlines()[-2:]
        assert error.startswith("Error: another gpustack run is changing n1, n2, n3")
        assert f"pid {first.pid}" in error and "`gpustack install" in error and "started" in error
        assert "--wait" in hint
        assert runs_started(state_dir) == []  # refused before any host was contacted
    finally:
        first.kill()
        first.wait()


def test_a_killed_run_releases_its_lock_and_wait_takes_it_over(inventory, state_dir):
    from gpustack.ansible.inventory import load_inventory

    first = _holder(inventory, state_dir)
    inv = load_inventory(inventory)
    with pytest.raises(locks.HostsLocked), locks.hold(inv, "second"):
        pass
    first.send_signal(signal.SIGKILL)  # no clean-up code runs: the kernel drops the flock
    first.wait()
    with locks.hold(inv, "second") as held:
        assert held._files


def test_wait_blocks_until_the_holder_ends(inventory, state_dir):
    from gpustack.ansible.inventory import load_inventory

    first = _holder(inventory, state_dir)
    inv = load_inventory(inventory)
    seen = []
    started = time.monotonic()

    def on_wait(busy):
        seen.append(busy)
        first.kill()  # the other run ends while we wait

    with locks.hold(inv, "second", wait=True, poll=0.1, on_wait=on_wait):
        pass
    first.wait()
    assert len(seen) == 1 and isinstance(seen[0][0], locks.Holder)
    assert seen[0][0].pid == first.pid and time.monotonic() - started < 30


def test_disjoint_hosts_do_not_block_and_locks_key_on_the_address(inventory, state_dir):
    from gpustack.ansible.inventory import load_inventory

    first = _holder(inventory, state_dir, limit="n1")
    try:
        with locks.hold(load_inventory(inventory, "n2,n3"), "other hosts"):
            pass
        same_machine = Inventory(inventory, "gpu_nodes", ["alias"], {"alias": {"ansible_host": "10.0.0.1"}})  # fmt: skip
        refused = pytest.raises(locks.HostsLocked, match="changing n1")
        with refused, locks.hold(same_machine, "another inventory, same machine"):
            pass
    finally:
        first.kill()
        first.wait()
    assert (
        locks.host_key("n2", {"ansible_host": "10.0.0.2", "ansible_port": 2222}) == "10.0.0.2_2222"
    )


def test_read_only_commands_take_no_lock(inventory, state_dir):
    first = _holder(inventory, state_dir)
    try:
        proc = run_cli(
            "plan", str(inventory), "--limit", "!!![", env={"GPUSTACK_STATE_DIR": str(state_dir)}
        )
        assert "another gpustack run" not in proc.stderr  # input errors come first, no lock
        from gpustack.ansible.playbook import host_locks
        from gpustack.commands import HostOptions

        with host_locks(HostOptions(inventory=str(inventory)), None, check=True):
            pass  # check mode (plan, install --check): nothing to lock
    finally:
        first.kill()
        first.wait()


# --- child guard and SIGTERM ---------------------------------------------------------------------
GUARDED = textwrap.dedent("""\
    import subprocess, sys, time
    # stands in for gpustack: starts the guard (as ansible-runner would) and then dies
    child = subprocess.Popen([sys.executable, "-m", "gpustack.ansible.childguard", sys.executable, "-c",
        "import subprocess,sys,time; subprocess.Popen([sys.executable,'-c','import time; time.sleep(600)']); time.sleep(600)"],
        start_new_session=True)
    print(child.pid, flush=True)
    time.sleep(600)
    """)


def _alive_in_group(pgid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getpgid(int(entry.name)) == pgid:
                    found.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                pass
    return found


def test_children_die_with_a_sigkilled_controller():
    controller = subprocess.Popen([sys.executable, "-c", GUARDED], stdout=subprocess.PIPE, text=True, cwd=ROOT)  # fmt: skip
    guard = int(controller.stdout.readline())
    deadline = time.monotonic() + 10
    while len(_alive_in_group(guard)) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_alive_in_group(guard)) >= 3  # guard, "ansible-playbook", its "worker"
    controller.send_signal(signal.SIGKILL)
    controller.wait()
    deadline = time.monotonic() + 15
    while _alive_in_group(guard) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _alive_in_group(guard) == []


def test_guard_passes_the_exit_code_through():
    proc = subprocess.run([sys.executable, "-m", "gpustack.ansible.childguard", "sh", "-c", "exit 7"], cwd=ROOT)  # fmt: skip
    assert proc.returncode == 7


def test_sigterm_exits_143_like_ctrl_c(tmp_path):
    script = textwrap.dedent("""\
        import os, signal, sys
        import typer
        from gpustack import cli
        @cli.app.command("sleepy")
        def sleepy():
            os.kill(os.getpid(), signal.SIGTERM)
            import time; time.sleep(5)
        sys.exit(cli.main(["sleepy"]))
        """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert proc.returncode == 143, proc.stderr
    assert "Terminated (SIGTERM)" in proc.stderr and "Traceback" not in proc.stderr


def _sleeping_play(tmp_path: Path) -> tuple[Path, Path]:
    """A playbook whose one task sleeps a minute, and an inventory of this machine (local)."""
    playbook = tmp_path / "sleep.yml"
    playbook.write_text("- hosts: all\n  gather_facts: false\n  tasks:\n"
                        "    - name: Sleep\n      ansible.builtin.command: sleep 60\n"
                        "      changed_when: false\n")  # fmt: skip
    inv = tmp_path / "local.ini"
    inv.write_text(
        "[gpu_nodes]\nlocal1 ansible_connection=local ansible_python_interpreter=/usr/bin/python3\n"
    )
    return playbook, inv


def test_a_cancel_stops_the_playbook_within_a_second(tmp_path, state_dir):
    """ansible-runner asks whether to cancel once per pexpect wait, 5 s by default: a Ctrl-C or
    SIGTERM let the playbook run up to 5 s more (measured on a lab node on 2026-11-29: exit 4.3-5.1 s
    after a SIGTERM during the first seconds of an install, its tasks going on meanwhile)."""
    from gpustack.ansible.runner import RunSpec, run_playbook

    playbook, inv = _sleeping_play(tmp_path)
    started: list[float] = []

    def on_update(tracker, event) -> None:
        if event.get("event") == "runner_on_start" and not started:
            started.append(time.monotonic())

    spec = RunSpec(playbook=playbook, inventory=inv, target_group="gpu_nodes", hosts=["local1"])
    result = run_playbook(spec, on_update=on_update, cancel=lambda: bool(started))
    stopped = time.monotonic()
    assert started and result.status == "canceled", result
    assert stopped - started[0] < 2.0, (
        f"the run went on {stopped - started[0]:.1f} s after the cancel"
    )


def test_sigterm_during_a_playbook_stops_it_and_says_so_once(tmp_path, state_dir):
    """SIGTERM while ansible-playbook runs: the run is canceled (not an exception through the
    command), the process exits 143, its report says 143, and "Terminated" is said once."""
    playbook, inv = _sleeping_play(tmp_path)
    script = textwrap.dedent(f"""\
        import os, signal, sys
        from pathlib import Path
        from gpustack import cli
        from gpustack.ansible.runner import RunSpec, run_playbook
        @cli.app.command("sleepy")
        def sleepy():
            def on_update(tracker, event):
                if event.get("event") == "runner_on_start":
                    os.kill(os.getpid(), signal.SIGTERM)
            spec = RunSpec(playbook=Path({str(playbook)!r}), inventory=Path({str(inv)!r}),
                           target_group="gpu_nodes", hosts=["local1"])
            result = run_playbook(spec, on_update=on_update)
            print(result.status, int(result.exit_code), result.hosts["local1"].status)
            return int(result.exit_code)
        sys.exit(cli.main(["sleepy"]))
        """)
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert proc.returncode == 143, proc.stdout + proc.stderr
    assert proc.stdout.split() == ["canceled", "143", "stopped"], proc.stdout
    assert proc.stderr.count("Terminated (SIGTERM).") == 1, proc.stderr
    assert "Traceback" not in proc.stderr and time.monotonic() - start < 20


# --- --limit -------------------------------------------------------------------------------------
@pytest.mark.parametrize("pattern", ["!!![", "n1,!!n2", "n[1", "nx9", "!nope", "~n[0-9"])
def test_malformed_or_unmatched_limits_are_refused(inventory, state_dir, pattern):
    proc = run_cli("doctor", str(inventory), "--limit", pattern)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    error, hint = proc.stderr.strip().splitlines()[-2:]
    assert error.startswith("Error: --limit") and hint.startswith("Hint:")
    assert runs_started(state_dir) == []


@pytest.mark.parametrize(("pattern", "hosts"), [("n1", ["n1"]), ("n*,!n2", ["n1", "n3"]),
                                                ("gpu_nodes:&n3", ["n3"]), ("~n[12]", ["n1", "n2"])])  # fmt: skip
def test_valid_limits_still_work(inventory, pattern, hosts):
    from gpustack.ansible.inventory import load_inventory

    assert load_inventory(inventory, pattern).hosts == hosts


# --- doctor, status views ----------------------------------------------------------------------------
def test_doctor_counts_an_unreachable_host_as_a_problem():
    hosts = {"a": SimpleNamespace(unreachable=True, unreachable_message="ssh: connect to host a port 22: No route", failed=0),
             "b": SimpleNamespace(unreachable=False, failed=0, failures=[])}  # fmt: skip
    problems = doctor.run_problems(hosts)
    assert [(p.host, p.severity) for p in problems] == [("a", "error")]
    assert "unreachable" in problems[0].message and "SSH" in problems[0].hint


def _rendered(rows, wide=False, kubernetes=False) -> list[str]:
    console = Console(width=400, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(fleet_view.status_table(rows, kubernetes, wide))
    return [line.rstrip() for line in console.export_text().splitlines()]


def _drifty_rows():
    many = facts(installed="535.261.03-1", pinned="535.309.01-0+deb12u1", held=False, tk_held=False,
                 wired=False, inputs={"nvidia_container_toolkit_version": "1.18.0-1"})  # fmt: skip
    rows = [fleet.node_status(f"gpu-node-{i:03d}.example.internal", many) for i in range(3)]
    return rows + [fleet.node_status("ok-node", facts())]


@pytest.mark.parametrize("kubernetes", [False, True])
def test_status_default_fits_120_columns_and_wide_shows_every_column(kubernetes):
    rows = _drifty_rows()
    short = _rendered(rows, kubernetes=kubernetes)
    assert max(len(line) for line in short) <= 120
    assert len(short) == 1 + len(rows)  # one line per node
    assert short[1].split()[-1].endswith("…")  # long drift is cut, not wrapped
    wide = "\n".join(_rendered(rows, wide=True, kubernetes=kubernetes))
    for column in fleet_view._wide_columns(kubernetes):
        assert column.split()[0] in wide
    assert "toolkit packages not held" in wide  # every difference named in full


# --- companions ------------------------------------------------------------------------------------
MADISON = """\
nvidia-persistenced | 535.171.04-1~deb12u1 | http://deb.debian.org/debian bookworm/contrib amd64 Packages
nvidia-modprobe | 535.309.01-0+deb12u1 | http://deb.debian.org/debian-security bookworm-security/contrib amd64 Packages
nvidia-modprobe | 535.161.07-1~deb12u1 | http://deb.debian.org/debian bookworm/contrib amd64 Packages
nvidia-settings | 550.54.14-1 | http://deb.debian.org/debian trixie/contrib amd64 Packages
"""
COMPANIONS = ["nvidia-persistenced", "nvidia-modprobe", "nvidia-settings"]


@pytest.mark.parametrize(
    ("target", "source", "expected"),
    [
        ("535.261.03-1", "distro", {"nvidia-persistenced": "535.171.04-1~deb12u1",
                                    "nvidia-modprobe": "535.161.07-1~deb12u1"}),
        ("535.309.01-0+deb12u1", "distro", {"nvidia-persistenced": "535.171.04-1~deb12u1",
                                            "nvidia-modprobe": "535.309.01-0+deb12u1"}),
        ("535.309.01-0+deb12u1", "cuda_repo", {"nvidia-modprobe": "535.309.01-0+deb12u1"}),
        ("580.95.05-1", "distro", {}),
    ],
)  # fmt: skip
def test_companions_take_the_version_released_with_the_driver(target, source, expected):
    assert driver_filters.companion_versions(MADISON, COMPANIONS, target, source) == expected
    assert driver_filters.package_specs(expected, ["nvidia-modprobe", "absent"]) == (
        [f"nvidia-modprobe={expected['nvidia-modprobe']}"] if "nvidia-modprobe" in expected else []
    )


def _companion_facts(version, pin, held=True):
    data = facts()
    data["gpustack_status"]["driver"]["packages"] = {"nvidia-persistenced": version}
    data["gpustack_status"]["driver"]["pins"] = {"nvidia-persistenced": pin} if pin else {}
    data["gpustack_status"]["driver"]["held"] += ["nvidia-persistenced"] if held else []
    return data


@pytest.mark.parametrize(
    ("version", "pin", "held", "problem"),
    [
        ("535.171.04-1~deb12u1", "535.171.04-1~deb12u1", True, None),
        ("535.171.04-1~deb12u1", None, True, "not pinned with driver 535.261.03-1"),
        ("535.171.04-1~deb12u1", "535.183.01-1", True, "pinned 535.183.01-1"),
        ("535.171.04-1~deb12u1", "535.171.04-1~deb12u1", False, "not held"),
        ("550.54.14-1", "550.54.14-1", True, "not of the driver's branch 535"),
    ],
)
def test_status_shows_a_companion_mismatch(version, pin, held, problem):
    row = fleet.node_status("n1", _companion_facts(version, pin, held))
    drift = [d for d in row.drift if d.startswith("companion")]
    assert drift == (
        []
        if problem is None
        else [f"companion nvidia-persistenced {version}: " + drift[0].split(": ", 1)[1]]
    )
    if problem:
        assert problem in drift[0]


def test_pin_file_stanzas_are_read_per_package():
    text = ("Package: src:nvidia-graphics-drivers\nPin: version 535.261.03-1\nPin-Priority: 1001\n\n"
            "# released with the driver\nPackage: nvidia-persistenced\nPin: version 535.171.04-1~deb12u1\n")  # fmt: skip
    assert status_mod.pins(text) == {"src:nvidia-graphics-drivers": "535.261.03-1",
                                     "nvidia-persistenced": "535.171.04-1~deb12u1"}  # fmt: skip
    assert status_mod.pinned_version(text) == "535.261.03-1"


# --- lost restarts: containerd loaded vs disk -------------------------------------------------------
DUMP = """version = 2
[plugins]
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
      BinaryName = "/usr/bin/nvidia-container-runtime"
      SystemdCgroup = true
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true
"""
CRI = {"containerd": {"runtimes": {
    "runc": {"runtimeType": "io.containerd.runc.v2", "options": {"SystemdCgroup": True, "BinaryName": ""}},
}}}  # fmt: skip


def test_a_daemon_without_the_handler_on_disk_differs():
    disk = loaded_mod.disk_runtimes(DUMP)
    assert disk["nvidia"] == {"runtime_type": "io.containerd.runc.v2",
                              "options": {"BinaryName": "/usr/bin/nvidia-container-runtime", "SystemdCgroup": True}}  # fmt: skip
    loaded = loaded_mod.loaded_runtimes(CRI)
    assert loaded_mod.differences(loaded, disk) == [
        "runtime 'nvidia' is in the files but not loaded"
    ]
    CRI["containerd"]["runtimes"]["nvidia"] = {"runtimeType": "io.containerd.runc.v2",
        "options": {"BinaryName": "/usr/bin/nvidia-container-runtime", "SystemdCgroup": True, "Root": ""}}  # fmt: skip
    assert loaded_mod.differences(loaded_mod.loaded_runtimes(CRI), disk) == []
    CRI["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"] = "/old/runtime"
    assert loaded_mod.differences(loaded_mod.loaded_runtimes(CRI), disk) == [
        "runtime 'nvidia': loaded BinaryName='/old/runtime', files say '/usr/bin/nvidia-container-runtime'"
    ]
    assert loaded_mod.differences(loaded_mod.loaded_runtimes(CRI), {}) == [
        "runtime 'nvidia' is loaded but no longer in the files", "runtime 'runc' is loaded but no longer in the files"]  # fmt: skip


def test_status_and_the_fast_path_treat_a_lost_restart_as_drift():
    data = facts()
    data["gpustack_runtime_loaded"] = {"kind": "containerd", "available": True, "restart_pending": True,
                                       "differences": ["runtime 'nvidia' is in the files but not loaded"]}  # fmt: skip
    row = fleet.node_status("n1", data)
    assert row.drift == ["containerd: restart pending (gpustack wrote its files, no restart since)",
                         "containerd runs another configuration than its files: runtime 'nvidia' is in the files but not loaded"]  # fmt: skip
    assert row.runtime["restart_needed"] is True
    from gpustack.fleet import converged

    decision = converged.decide("n1", {**data, "gpustack_converged_probe": {"stamps": {}}}, "x")
    assert any("restart pending" in r for r in decision.reasons)


def _h2_frame(kind, flags, stream, payload=b""):
    return (
        struct.pack(">I", len(payload))[1:]
        + bytes([kind, flags])
        + struct.pack(">I", stream)
        + payload
    )


def test_grpc_client_reads_the_cri_status_reply(tmp_path):
    """A unix-socket server speaking the HTTP/2 frames containerd sends for CRI Status."""
    import socket
    import threading

    def varint(n):
        out = b""
        while True:
            out += bytes([(n & 0x7F) | (0x80 if n > 0x7F else 0)])
            n >>= 7
            if not n:
                return out

    config = json.dumps(CRI).encode()
    entry = b"\x0a\x06config" + b"\x12" + varint(len(config)) + config
    reply = b"\x0a\x00" + b"\x12" + varint(len(entry)) + entry  # status {}, info {config: ...}
    grpc = b"\x00" + struct.pack(">I", len(reply)) + reply
    path = str(tmp_path / "c.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)
    got = {}

    def serve():
        conn, _ = server.accept()
        data = b""
        while (
            b"\x00\x00\x00\x0b\x00" not in data[-200:] and len(data) < 4096
        ):  # DATA, END_STREAM seen
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
            if b"/runtime.v1.RuntimeService/Status" in data and data.endswith(b"\x08\x01"):
                break
        got["request"] = data
        conn.sendall(_h2_frame(4, 0, 0) + _h2_frame(1, 4, 1, b"\x88") + _h2_frame(0, 0, 1, grpc)
                     + _h2_frame(1, 5, 1, b"\x40\x0bgrpc-status\x010"))  # fmt: skip
        conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert loaded_mod.cri_config(path) == CRI
    thread.join(5)
    assert got["request"].startswith(b"PRI * HTTP/2.0")
    assert got["request"].endswith(b"\x00\x00\x00\x00\x02\x08\x01")  # gRPC frame: verbose=true


def test_status_shows_a_node_moved_after_its_upgrade_was_recorded_done():
    from gpustack.upgrade.state import Target

    hosts = {"a": SimpleNamespace(facts=facts(installed="535.261.03-1", pinned="535.261.03-1"),
                                  unreachable=False, unreachable_message="")}  # fmt: skip
    target = Target(version="535.309.01-0+deb12u1")
    (row,) = fleet.status_rows(hosts, None, {"a": "upgrade-done"}, target)
    assert row.drift == [
        "upgrade to 535.309.01-0+deb12u1 recorded done, driver installed 535.261.03-1"
    ]
    (row,) = fleet.status_rows(hosts, None, {"a": "upgrade-done"}, Target(branch="535"))
    assert row.drift == []


def test_no_upgrade_kill_point_is_a_task_of_the_upgrade_target_check():
    """`gpustack upgrade` first runs playbooks/upgrade_check.yml, and kill_rerun.py watches every
    run under the state directory: a kill point that the check's tasks share would kill the check
    (no node out of service yet) instead of the rollout it means to test."""
    import re

    from benchmarks import kill_rerun

    files = ["playbooks/upgrade_check.yml", "roles/gpu_preflight/tasks/*.yml",
             "roles/dpkg_ready/tasks/*.yml", "roles/apt_signed_repo/tasks/*.yml"] + [
        f"roles/nvidia_driver/tasks/{name}.yml"
        for name in ("check_target", "preflight", "sources", "repository_*", "resolve_*",
                     "commit_sources", "rollback_sources")
    ]  # fmt: skip
    names = set()
    for pattern in files:
        paths = sorted(ROOT.glob(pattern))
        assert paths, pattern
        for path in paths:
            text = path.read_text()
            names |= {
                m.strip().strip("\"'") for m in re.findall(r"^\s*- name:\s*(.+)$", text, re.M)
            }
    assert any(name.startswith("Refresh the package lists (at most hourly") for name in names)
    shared = [point for point, _ in kill_rerun.UPGRADE_POINTS if point in names]
    assert shared == []


def test_every_kill_point_names_a_task_the_roles_have():
    """A renamed task must not leave the kill-and-rerun campaign waiting for a name that never
    starts (its trials then end without a kill at that point)."""
    import glob
    import re

    from benchmarks import kill_rerun

    names = []  # task names (list items), not modules' `name:` parameters
    for path in glob.glob(str(ROOT / "roles/*/tasks/*.yml")) + glob.glob(
        str(ROOT / "playbooks/*.yml")
    ):
        text = Path(path).read_text()
        names += [m.strip().strip("\"'") for m in re.findall(r"^\s*- name:\s*(.+)$", text, re.M)]
    # a name with a template matches its rendered form ("... of {{ gpu_converged_role }}")
    patterns = [re.compile(re.sub(r"\\\{\\\{.*?\\\}\\\}", ".+", re.escape(n)) + "$") for n in names]
    assert not [p.pattern for p in patterns if p.pattern == ".+$"]
    points = kill_rerun.KILL_POINTS + kill_rerun.UNINSTALL_POINTS + kill_rerun.UPGRADE_POINTS
    missing = [point for point, _ in points if not any(p.match(point) for p in patterns)]
    assert missing == []
