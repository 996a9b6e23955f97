"""The real entry point in a subprocess: bad input gives Error + Hint, exit 2, nothing run."""

import json

import pytest

from tests.conftest import run_cli, runs_started

GOOD_INI = "[gpu_nodes]\nn1 ansible_host=127.0.0.1\nn2 ansible_host=127.0.0.1\n"


@pytest.fixture
def inv(tmp_path):
    path = tmp_path / "inv.ini"
    path.write_text(GOOD_INI)
    return path


def bad_cases(tmp_path, inv):
    broken_ini = tmp_path / "broken.ini"
    broken_ini.write_text("[gpu_nodes\nn1\n")
    broken_yml = tmp_path / "broken.yml"
    broken_yml.write_text("all:\n  hosts: [a\n")
    empty = tmp_path / "empty.ini"
    empty.write_text("[gpu_nodes]\n[cpu]\nc1\n")
    return [
        (["install", str(tmp_path / "missing.ini")], "does not exist"),
        (["install", "/proc/self/mem"], "is not readable"),
        (["install", str(broken_ini)], "cannot parse inventory"),
        (["doctor", str(broken_yml)], "YAML parsing failed"),
        (["install", str(empty)], "no hosts in group gpu_nodes"),
        (["install", str(inv), "-e", "nvidia_driver_version"], "is not KEY=VALUE"),
        (["install", str(inv), "--output", "xml"], "unknown --output 'xml'"),
        (["install", str(inv), "--limit", "nosuch"], "matches no host"),
        (["install", str(inv), "--kubeconfig", str(tmp_path / "nokube")], "kubeconfig"),
        (["install", str(inv), "--report", str(tmp_path)], "cannot write report"),
        (["install"], "Missing argument"),
        (["install", str(inv), "--bogus"], "No such option"),
        (["status", str(inv), "--forks", "0"], "Invalid value for '--forks' / '-f'"),
        (
            ["upgrade", str(inv), "--driver-version", "535.261.03-1", "-f", "4"],
            "--forks does not apply to upgrade",
        ),
        (["lab", "up", "--os", "debian99"], "unknown --os 'debian99'"),
        (["install", str(inv), "-e", "nvidia_driver_version=latest"], "is not a package version"),
        (["install", str(inv), "-e", "nvidia_driver_branch=r580"], "is not a driver branch"),
        (["install", str(inv), "-e", "nvidia_driver_source=runfile"], "nvidia_driver_source"),
        (["install", str(inv), "-e", "nvidia_driver_reboot=sometimes"], "nvidia_driver_reboot"),
        (
            ["install", str(inv), "-e", "nvidia_driver_source=mirror"],
            "needs nvidia_driver_mirror_url",
        ),
        (
            [
                "install",
                str(inv),
                "-e",
                "nvidia_driver_branch=550",
                "-e",
                "nvidia_driver_version=535.261.03-1",
            ],
            "is not on branch 550",
        ),
        (["install", str(inv), "-e", "gpustack_require_gpu=maybe"], "is not a valid boolean"),
        (["uninstall", str(inv), "--components", "kernel"], "unknown component"),
        (["uninstall", str(inv), "--components", "k8s", "--yes"], "no kubeconfig"),
        (["verify", str(inv)], "no kubeconfig"),
        (["uninstall", str(inv)], "needs confirmation"),
    ]


def test_every_bad_input_is_one_error_with_hint_and_exit_2(tmp_path, inv, state_dir):
    for args, message in bad_cases(tmp_path, inv):
        proc = run_cli(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert lines[0].startswith("Error: ") and message in lines[0], (args, proc.stderr)
        assert lines[1].startswith("Hint: "), (args, proc.stderr)
        assert "Traceback" not in proc.stderr + proc.stdout
    assert runs_started(state_dir) == [], "a bad input must not start any run"


def test_help_lists_every_subcommand():
    proc = run_cli("--help")
    assert proc.returncode == 0
    for command in (
        "install",
        "plan",
        "doctor",
        "verify",
        "status",
        "upgrade",
        "uninstall",
        "manifests",
        "lab",
    ):
        assert command in proc.stdout


def test_install_flags_mirror_ansible_playbook():
    proc = run_cli("install", "--help")
    for flag in (
        "--check",
        "--diff",
        "--limit",
        "--tags",
        "--skip-tags",
        "--extra-vars",
        "--kubeconfig",
        "--output",
        "--report",
        "--verbose",
        "--forks",
    ):
        assert flag in proc.stdout


def _forks_of_last_run(state_dir) -> str:
    command = json.loads(
        next((runs_started(state_dir)[-1] / "artifacts").glob("*/command")).read_text()
    )
    args = command["command"]
    return args[args.index("--forks") + 1]


def test_forks_reach_ansible_playbook(tmp_path, state_dir):
    """-f/--forks is ansible-playbook's --forks; without it one fork per host (5 at least)."""
    inv = tmp_path / "local.ini"
    inv.write_text(
        "[gpu_nodes]\nlocal1 ansible_connection=local ansible_python_interpreter=/usr/bin/python3\n"
    )
    assert run_cli("doctor", str(inv), "-f", "3", "--output", "json").returncode == 0
    assert _forks_of_last_run(state_dir) == "3"
    assert run_cli("doctor", str(inv), "--output", "json").returncode == 0
    assert _forks_of_last_run(state_dir) == "5"


def test_local_doctor_install_and_report(tmp_path, state_dir):
    """A real ansible-runner run over a local connection: facts, JSON, report, changed=0."""
    inv = tmp_path / "local.ini"
    inv.write_text(
        "[gpu_nodes]\nlocal1 ansible_connection=local ansible_python_interpreter=/usr/bin/python3\n"
    )
    proc = run_cli("doctor", str(inv), "--output", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    pf = doc["hosts"]["local1"]["facts"]["gpustack_preflight"]
    assert pf["os"]["family"] == "Debian"
    assert pf["gpus"]["count"] == 0
    assert doc["summary"] == {"hosts": 1, "ok": 1, "changed": 0, "failed": 0, "unreachable": 0,
                              "stopped": 0}  # fmt: skip
    assert any("no NVIDIA device" in p["message"] for p in doc["problems"])

    report = tmp_path / "report.json"
    # Only the read-only preflight role runs on this machine (tags), never the driver role.
    proc = run_cli("install", str(inv), "--tags", "gpu_preflight", "--report", str(report))
    assert proc.returncode == 0, proc.stderr
    assert "local1" in proc.stdout and "0 failed" in proc.stdout
    saved = json.loads(report.read_text())
    assert saved["command"] == "install" and saved["hosts"]["local1"]["changed"] == 0

    proc = run_cli("doctor", str(inv), "-e", "gpustack_require_gpu=true")
    assert proc.returncode == 3, "a required GPU that is missing fails doctor"
    assert "error" in proc.stdout and "no NVIDIA device" in proc.stdout
    assert len(runs_started(state_dir)) == 3


def test_failed_task_reports_task_and_message_and_artifacts(tmp_path, state_dir):
    inv = tmp_path / "local.ini"
    inv.write_text(
        "[gpu_nodes]\nlocal1 ansible_connection=local "
        "ansible_python_interpreter=/nonexistent/python3\n"
    )
    proc = run_cli("install", str(inv), "--output", "json")
    assert proc.returncode == 1
    doc = json.loads(proc.stdout)
    host = doc["hosts"]["local1"]
    assert host["status"] == "failed"
    assert host["failures"][0]["task"] == "Gather GPU host facts"
    assert "/nonexistent/python3" in host["failures"][0]["message"]
    assert "Artifacts of this run:" in proc.stderr


def test_plan_of_a_failed_host_does_not_say_no_changes(tmp_path, state_dir):
    """A host whose plan stopped at a failure printed "no changes" above the failure (seen on a
    real GPU host, 2026-11-27): it says the plan stopped."""
    inv = tmp_path / "local.ini"
    inv.write_text(
        "[gpu_nodes]\nlocal1 ansible_connection=local "
        "ansible_python_interpreter=/nonexistent/python3\n"
    )
    proc = run_cli("plan", str(inv))
    assert proc.returncode == 1
    assert "local1: no changes" not in proc.stdout
    assert "local1: failed (see below); nothing planned before it" in proc.stdout
    assert "failed local1: Gather GPU host facts" in proc.stdout or "local1  failed" in proc.stdout


def test_uninstall_check_runs_in_check_mode_without_asking(tmp_path, state_dir):
    """uninstall --check on this machine (local connection): no question, no change, the plan
    in the JSON document; --check with k8s is refused before anything runs."""
    proc = run_cli("uninstall", "--local", "--check", "--components", "k8s")
    assert proc.returncode == 2 and "Error: uninstall --check covers the hosts' components" in (
        proc.stdout + proc.stderr
    )
    assert runs_started(state_dir) == []
    inv = tmp_path / "local.ini"
    inv.write_text(
        "[gpu_nodes]\nlocal1 ansible_connection=local ansible_python_interpreter=/usr/bin/python3\n"
    )
    proc = run_cli("uninstall", str(inv), "--check", "--components", "driver,toolkit,runtime",
                   "--output", "json")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["command"] == "uninstall" and doc["check_mode"] is True
    assert set(doc["plan"]["local1"]) >= {"remove", "files", "services"}
    (run,) = runs_started(state_dir)
    command = json.loads(next(run.glob("artifacts/*/command")).read_text())["command"]
    assert "--check" in command and "--diff" in command
    assert "-uninstall-" in run.name, run.name  # the run of playbooks/uninstall.yml
    extravars = json.loads((run / "env/extravars").read_text())
    assert extravars["gpustack_uninstall_components"] == ["driver", "toolkit", "runtime"]


def test_plan_runs_in_check_mode(tmp_path, state_dir):
    inv = tmp_path / "local.ini"
    inv.write_text(
        "[gpu_nodes]\nlocal1 ansible_connection=local ansible_python_interpreter=/usr/bin/python3\n"
    )
    proc = run_cli("plan", str(inv), "--tags", "gpu_preflight")
    assert proc.returncode == 0, proc.stderr
    assert "local1: no changes" in proc.stdout
    (run,) = runs_started(state_dir)
    command = json.loads(next(run.glob("artifacts/*/command")).read_text())["command"]
    assert "--check" in command and "--diff" in command


@pytest.mark.parametrize("delay", [2, 0], ids=["ansible-playbook-waiting", "runner-starting"])
def test_ctrl_c_cancels_the_run(tmp_path, state_dir, delay):
    """SSH to a port that accepts but never speaks hangs; SIGINT must cancel cleanly, also while
    ansible-runner is still starting (a loaded CI machine once sent it there: the run went on
    until the SSH timeout)."""
    import signal
    import socket
    import subprocess
    import time

    from tests.conftest import GPUSTACK, ROOT

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    port = server.getsockname()[1]
    inv = tmp_path / "hang.ini"
    inv.write_text(f"[gpu_nodes]\nsilent ansible_host=127.0.0.1 ansible_port={port}\n")
    proc = subprocess.Popen(
        [*GPUSTACK, "install", str(inv)], cwd=ROOT, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while not runs_started(state_dir) and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(delay)  # 2: ansible-playbook is now waiting on the silent SSH server
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=20)
        assert proc.returncode == 130, out + err
        assert "Traceback" not in err
        assert "Artifacts of this run:" in err
        assert time.monotonic() - started < 15, "cancel must not wait for the SSH timeout"
    finally:
        proc.kill()
        server.close()
