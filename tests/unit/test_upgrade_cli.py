"""`gpustack upgrade`: input checks (nothing runs), dry run, resume rules, reports.

Full rollouts here use the FakeHostUpgrader test double (tests/upgrade_doubles.py) injected
into run_upgrade; nothing is run on any host. tests/lab/test_upgrade.py runs the real role.
"""

from __future__ import annotations

import json

import pytest

from gpustack.errors import BadInput, ExitCode, GpustackError
from gpustack.upgrade.command import UpgradeOptions, run_upgrade
from gpustack.upgrade.state import FileStateStore, state_path_for
from tests.conftest import run_cli, runs_started
from tests.upgrade_doubles import NEW, FakeHostUpgrader

OLD = "535.261.03-1"


@pytest.fixture
def inv(tmp_path):
    path = tmp_path / "fleet.ini"
    path.write_text("[gpu_nodes]\n" + "".join(f"gpu{i} ansible_host=10.0.0.{i}\n" for i in range(1, 6)))  # fmt: skip
    return path


def upgrade(inv, *args):
    return run_cli("upgrade", str(inv), *args)


def fake(upgrader):
    return lambda inventory, extravars: upgrader


def options(inv, **kw) -> UpgradeOptions:
    kw.setdefault("driver_version", NEW)
    kw.setdefault("yes", True)
    return UpgradeOptions(inventory=str(inv), **kw)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "upgrade needs a target driver"),
        (["--driver-version", "new"], "--driver-version: 'new' is not a package version"),
        (["--driver-branch", "r535"], "--driver-branch: 'r535' is not a driver branch"),
        (["--driver-version", NEW, "--max-unavailable", "0"], "would never let a node upgrade"),
        (["--driver-version", NEW, "--max-unavailable", "lots"], "not a count or a percentage"),
        (["--driver-version", NEW, "--retry-failed"], "--retry-failed only applies with --resume"),
        (["--driver-version", NEW, "--resume"], "no upgrade of"),
        (["--driver-version", NEW, "-e", f"nvidia_driver_version={OLD}"], "disagrees with the upgrade target"),
        (["--driver-version", NEW, "--max-parallel", "0"], "--max-parallel"),
        (["--driver-version", NEW, "--kubeconfig", "/nonexistent"], "kubeconfig /nonexistent does not exist"),
        (["--driver-version", NEW, "--output", "yaml"], "unknown --output"),
        (["--driver-version", NEW, "--limit", "cpu*"], "matches no host"),
    ],
)  # fmt: skip
def test_bad_input_is_one_error_with_hint_and_runs_nothing(inv, state_dir, args, message):
    proc = upgrade(inv, *args)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("Error: ") and message in lines[0], proc.stderr
    assert lines[1].startswith("Hint: ")
    assert "Traceback" not in proc.stderr
    assert runs_started(state_dir) == []
    assert not (state_dir / "upgrades").exists()


def test_dry_run_prints_batches_and_writes_nothing(inv, state_dir):
    proc = upgrade(inv, "--driver-version", NEW, "--dry-run", "--max-unavailable", "40%",
                   "--max-parallel", "2", "--canary", "1")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "max-unavailable 2, max-parallel 2, canary 1" in proc.stdout
    assert "batch 1: gpu1\n  batch 2: gpu2, gpu3\n  batch 3: gpu4, gpu5" in proc.stdout
    assert "Dry run: nothing was changed." in proc.stdout
    assert not state_dir.exists() or not list(state_dir.rglob("*.json"))
    doc = json.loads(upgrade(inv, "--driver-version", NEW, "--dry-run", "-o", "json").stdout)
    assert doc["plan"] == [[f"gpu{i}"] for i in range(1, 6)] and doc["dry_run"] is True


def test_rollout_report_and_resume_rules(inv, state_dir, tmp_path, capsys):
    upgrader = FakeHostUpgrader(fail={"gpu3": "Install the driver packages: E: broken"})
    report = tmp_path / "r.json"
    code = run_upgrade(options(inv, report=str(report), output="json"), fake(upgrader))
    assert code == 1
    doc = json.loads(report.read_text())
    assert json.loads(capsys.readouterr().out) == doc
    assert doc["status"] == "failed" and doc["exit_code"] == 1
    assert doc["nodes"]["gpu3"]["state"] == "upgrade-failed"
    assert doc["nodes"]["gpu3"]["reason"] == "driver role: Install the driver packages: E: broken"
    assert doc["summary"] == {"nodes": 5, "done": 2, "failed": 1, "in_progress": 0,
                              "pending": 2, "skipped": 0}  # fmt: skip
    assert doc["limits"]["max_unavailable"] == 2  # 25% of 5, rounded up
    state_file = state_path_for(inv)
    assert doc["state_file"] == str(state_file) and state_file.is_file()

    # A new run over the unfinished one is refused; so is resuming to another version.
    with pytest.raises(BadInput, match=r"an unfinished upgrade to 535\.309\.01-0\+deb12u1"):
        run_upgrade(options(inv), fake(upgrader))
    with pytest.raises(BadInput, match="recorded upgrade of this inventory is to") as err:
        run_upgrade(options(inv, driver_version=OLD, resume=True), fake(upgrader))
    assert f"--driver-version {NEW}" in err.value.hint
    proc = upgrade(inv, "--driver-version", OLD, "--resume")
    assert proc.returncode == 2 and "Hint: resume it with --driver-version" in proc.stderr

    # --resume continues without the failed node (it stays failed: exit 1) ...
    upgrader.fail = {}
    upgrader.calls.clear()
    assert run_upgrade(options(inv, resume=True), fake(upgrader)) == 1
    assert upgrader.calls == ["gpu4", "gpu5"]
    # ... and --retry-failed retries it.
    assert run_upgrade(options(inv, resume=True, retry_failed=True), fake(upgrader)) == 0
    assert upgrader.calls == ["gpu4", "gpu5", "gpu3"]
    run = FileStateStore(state_file).load()
    assert {n.state for n in run.nodes.values()} == {"upgrade-done"}
    # Finished: a new upgrade (here a downgrade) may start.
    upgrader = FakeHostUpgrader(version=OLD)
    assert run_upgrade(options(inv, driver_version=OLD), fake(upgrader)) == 0
    assert len(upgrader.calls) == 5


def test_a_target_some_node_cannot_have_is_refused_before_any_node_is_touched(inv, state_dir):
    """The target is checked on the nodes the rollout would upgrade before the first cordon (a
    version no source offers was found only on the first node, cordoned and drained by then)."""
    upgrader, checked = FakeHostUpgrader(), []
    missing = ("Resolve the exact version to install: NVIDIA driver version 999.1 is not available"
               " from source 'distro'; available: 535.261.03-1 Hint: see apt-cache madison")  # fmt: skip

    def check(inventory, hosts, extravars, verbose):
        checked.append(list(hosts))
        return {"gpu2": missing, "gpu4": missing}

    with pytest.raises(GpustackError) as err:
        run_upgrade(options(inv), fake(upgrader), target_check=check)
    assert err.value.exit_code == ExitCode.BAD_INPUT
    assert err.value.message.startswith("gpu2: Resolve the exact version to install: NVIDIA")
    assert "(and 1 more node(s)). No node was taken out of service" in err.value.message
    assert err.value.hint == "see apt-cache madison"
    assert checked == [[f"gpu{i}" for i in range(1, 6)]] and upgrader.calls == []
    assert not state_path_for(inv).exists()

    # Another failure (an unreachable node) is a host failure, with a generic hint; the
    # reason's own full stop is not doubled, nor its lines kept (one Error: line).
    with pytest.raises(GpustackError) as err:
        run_upgrade(options(inv), fake(upgrader),
                    target_check=lambda *a: {"gpu1": "unreachable: ssh:\n  no route."})  # fmt: skip
    assert err.value.exit_code == ExitCode.HOST_FAILED and "gpustack doctor" in err.value.hint
    assert err.value.message == "gpu1: unreachable: ssh: no route. No node was taken out of service"

    # A resume checks only the nodes still to do.
    assert run_upgrade(options(inv), fake(FakeHostUpgrader(fail={"gpu3": "E: boom"}))) == 1
    checked.clear()
    assert run_upgrade(options(inv, resume=True), fake(upgrader), target_check=lambda i, h, e, v: checked.append(h) or {}) == 1  # fmt: skip
    assert checked == [["gpu4", "gpu5"]] and upgrader.calls == ["gpu4", "gpu5"]


def test_the_next_upgrade_starts_the_nodes_that_took_longest(inv, state_dir, capsys):
    upgrader = FakeHostUpgrader(durations={"gpu4": 0.4, "gpu2": 0.2}, duration=0.01)
    assert run_upgrade(options(inv, max_unavailable="1"), fake(upgrader)) == 0
    assert upgrader.calls == ["gpu1", "gpu2", "gpu3", "gpu4", "gpu5"]
    recorded = FileStateStore(state_path_for(inv)).load()
    assert recorded.durations == {}  # the first upgrade knew nothing
    capsys.readouterr()
    proc = upgrade(inv, "--driver-version", OLD, "--dry-run", "--max-unavailable", "1")
    assert "order: longest first, as measured in the last upgrade (5 of 5 node(s)" in proc.stdout
    assert "batch 1: gpu4\n  batch 2: gpu2\n" in proc.stdout
    upgrader = FakeHostUpgrader(version=OLD)
    assert run_upgrade(options(inv, driver_version=OLD, max_unavailable="1"), fake(upgrader)) == 0
    assert upgrader.calls[:2] == ["gpu4", "gpu2"]
    durations = FileStateStore(state_path_for(inv)).load().durations
    assert durations["gpu4"] >= 0.4 and max(durations, key=durations.get) == "gpu4"
    # A host new to the inventory has no figure yet: it goes first (it might be slow).
    inv.write_text(inv.read_text() + "gpu6 ansible_host=10.0.0.6\n")
    proc = upgrade(inv, "--driver-version", NEW, "--dry-run", "--max-unavailable", "1")
    assert "(5 of 6 node(s) measured; the others go first)" in proc.stdout, proc.stdout
    assert "batch 1: gpu6\n  batch 2: gpu4\n" in proc.stdout


def test_canary_without_yes_pauses_and_exits_0(inv, state_dir, capsys):
    upgrader = FakeHostUpgrader()
    code = run_upgrade(options(inv, canary=1, yes=False), fake(upgrader))
    assert code == 0 and upgrader.calls == ["gpu1"]
    out = capsys.readouterr()
    assert "paused after the canary batch; continue with --resume" in out.out
    assert run_upgrade(options(inv, canary=1, resume=True, yes=False), fake(upgrader)) == 0
    assert upgrader.calls == ["gpu1", "gpu2", "gpu3", "gpu4", "gpu5"]


def test_text_summary(inv, state_dir, capsys):
    assert run_upgrade(options(inv, max_unavailable="2", max_parallel=2), fake(FakeHostUpgrader())) == 0  # fmt: skip
    out = capsys.readouterr().out
    # Rolling: a node starts whenever a slot frees, so the number of batches depends on timing.
    assert "5 nodes: 5 done, 0 failed, 0 pending, 0 in progress, 0 skipped (" in out
    assert NEW in out


def test_branch_target_passes_the_branch_to_the_role(inv, state_dir):
    seen = {}

    def factory(inventory, extravars):
        seen.update(extravars)
        return FakeHostUpgrader(version="535.261.03-1")

    assert run_upgrade(options(inv, driver_version="", driver_branch="535"), factory) == 0
    assert seen["nvidia_driver_branch"] == "535"
    assert "nvidia_driver_version" not in seen
    assert seen["nvidia_driver_reboot"] == "if_needed"
    seen.clear()
    opts = options(inv, driver_version=OLD, extra_vars=["nvidia_driver_reboot=never"])
    assert run_upgrade(opts, factory) == 0
    assert seen["nvidia_driver_reboot"] == "never" and seen["nvidia_driver_version"] == OLD


def test_state_path_is_stable_per_inventory(inv, state_dir, tmp_path):
    assert state_path_for(inv) == state_path_for(str(inv))
    assert state_path_for(inv).parent == state_dir / "upgrades"
    other = tmp_path / "x" / "fleet.ini"
    assert state_path_for(other) != state_path_for(inv)


def test_live_view_renders_batches_and_nodes(inv, state_dir):
    from rich.console import Console

    from gpustack.terminal.upgrade_view import UpgradeLive
    from gpustack.upgrade.backend import HostOnlyBackend
    from gpustack.upgrade.executors import ThreadExecutor
    from gpustack.upgrade.orchestrator import Orchestrator, RolloutPolicy
    from gpustack.upgrade.planner import Limits
    from gpustack.upgrade.state import MemoryStateStore, NodeRecord, Target, UpgradeRun

    run = UpgradeRun("inv", Target(version=NEW), "host-only")
    run.nodes = {n: NodeRecord(n) for n in ("a", "b", "c")}
    run.nodes["a"].state, run.nodes["b"].state = "upgrade-done", "pod-restart-required"
    run.nodes["b"].batch, run.batches = 2, [["a"], ["b"]]
    orch = Orchestrator(run, ["a", "b", "c"], MemoryStateStore(run), HostOnlyBackend(),
                        FakeHostUpgrader(), RolloutPolicy(Limits(1)), ThreadExecutor(1))  # fmt: skip
    orch.activity["b"] = "nvidia_driver : Install the driver packages at exactly that version"
    console = Console(width=160, record=True)
    console.print(UpgradeLive(orch, "gpustack upgrade → X")._render())
    text = console.export_text()
    assert "batch 2  1 done, 1 in progress, 0 failed, 1 pending, 0 skipped of 3" in text
    assert "b     2      pod-restart-required  nvidia_driver : Install the driver packages" in text
