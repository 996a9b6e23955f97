"""FileStateStore: the upgrade's record as a snapshot plus a journal of transitions.

What has to hold: a load gives back exactly the run that was saved; a kill at any instant leaves
a record that loads as a prefix of the run's transitions (a real SIGKILL of a writing process
below); a line left by an earlier snapshot is never replayed; the journal stays bounded by its
compaction; a broken record is one Error with a Hint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from gpustack.errors import BadInput
from gpustack.upgrade.state import FileStateStore, NodeRecord, Target, Transition, UpgradeRun
from tests.conftest import ROOT

STATES = ["cordon-required", "wait-for-jobs-required", "drain-required", "upgrade-done"]


def new_run(n: int) -> UpgradeRun:
    run = UpgradeRun(inventory="/inv.ini", target=Target(version="535.1"), mode="host-only")
    run.nodes = {f"node{i}": NodeRecord(f"node{i}") for i in range(n)}
    return run


def walk(run: UpgradeRun, store: FileStateStore, name: str, to: str) -> None:
    """One transition as the orchestrator makes it: history, record, then a journalled save."""
    record = run.nodes[name]
    run.history.append(Transition(name, record.state, to, time.time()))
    record.state, record.attempts = to, record.attempts + 1
    store.save(run, nodes=[name])


def journalled(tmp_path, *moves: tuple[str, str]):
    """A 2-node run saved as a snapshot, then `moves` (node, state) journalled after it."""
    path = tmp_path / "state.json"
    store, run = FileStateStore(path), new_run(2)
    store.save(run)
    for name, to in moves:
        walk(run, store, name, to)
    return path, store, run


def consistent(run: UpgradeRun) -> None:
    """Every node's state is the last transition the history records for it."""
    last = {t.node: t.to_state for t in run.history}
    for name, record in run.nodes.items():
        assert record.state == last.get(name, "upgrade-required"), name


def test_snapshot_then_journal_loads_as_the_same_run(tmp_path):
    path = tmp_path / "state.json"
    store, run = FileStateStore(path), new_run(4)
    store.save(run)
    run.batches.append(["node0", "node1"])
    store.save(run, nodes=["node0", "node1"])
    for to in STATES:
        walk(run, store, "node0", to)
    run.canary_done = True
    store.save(run, nodes=[])
    assert json.loads(path.read_text())["history"] == []  # the snapshot was written once
    assert len(store.journal.read_text().splitlines()) == 6
    assert store.journal.stat().st_mode & 0o777 == path.stat().st_mode & 0o777 == 0o600
    loaded = FileStateStore(path).load()
    assert loaded.to_dict() == run.to_dict()


def test_a_loaded_store_goes_on_journalling_after_what_it_read(tmp_path):
    path, _, _ = journalled(tmp_path, ("node0", STATES[0]))
    resumed_store = FileStateStore(path)
    resumed = resumed_store.load()
    walk(resumed, resumed_store, "node1", STATES[0])
    assert len(resumed_store.journal.read_text().splitlines()) == 2
    again = FileStateStore(path).load()
    assert [t.node for t in again.history] == ["node0", "node1"]
    consistent(again)


def test_a_torn_last_line_is_dropped_and_a_broken_one_inside_is_an_error(tmp_path):
    path, store, _ = journalled(tmp_path, ("node0", STATES[0]), ("node1", STATES[0]))
    whole = store.journal.read_text()
    store.journal.write_text(whole[:-10])  # killed while writing the second line
    loaded = FileStateStore(path).load()
    assert [t.node for t in loaded.history] == ["node0"] and loaded.nodes["node1"].attempts == 0
    first, second = whole.splitlines(keepends=True)
    store.journal.write_text("{not json\n" + second)
    with pytest.raises(BadInput) as err:
        FileStateStore(path).load()
    assert "is not readable" in err.value.message and "move it aside" in err.value.hint
    store.journal.write_text(second + first)  # out of order
    with pytest.raises(BadInput, match="sequence 2"):
        FileStateStore(path).load()
    store.journal.write_text(whole[:-10])
    # a store that read it goes on with a snapshot, not a line glued to the torn one
    resumed_store = FileStateStore(path)
    resumed = resumed_store.load()
    walk(resumed, resumed_store, "node1", STATES[1])
    assert not store.journal.exists() and FileStateStore(path).load().to_dict() == resumed.to_dict()


def test_lines_of_an_earlier_snapshot_are_never_replayed(tmp_path):
    """A kill between the new snapshot's rename and the journal's removal leaves old lines."""
    path, store, run = journalled(tmp_path, ("node0", STATES[0]), ("node0", STATES[1]))
    old = store.journal.read_text()
    store.save(run)  # compaction: a new snapshot with both transitions
    assert not store.journal.exists()
    store.journal.write_text(old)  # as if the removal had not happened
    loaded = FileStateStore(path).load()
    assert loaded.to_dict()["history"] == run.to_dict()["history"]  # not four transitions
    # and a new run's snapshot over an old run's journal starts clean
    fresh = new_run(2)
    FileStateStore(path).save(fresh)
    store.journal.write_text(old)
    assert FileStateStore(path).load().history == []


def test_the_journal_is_folded_into_a_snapshot_once_it_is_as_large(tmp_path):
    path = tmp_path / "state.json"
    store, run = FileStateStore(path, compact_bytes=4096), new_run(20)
    store.save(run)
    largest = 0
    for i in range(400):
        walk(run, store, f"node{i % 20}", STATES[i // 20 % 4])
        journal = store.journal.stat().st_size if store.journal.exists() else 0
        assert journal < max(4096, path.stat().st_size) + 1024  # one line past the bound at most
        largest = max(largest, journal)
    assert largest >= 4096  # it did grow to the bound, and was folded in
    assert FileStateStore(path).load().to_dict() == run.to_dict()


def test_a_reader_during_writes_sees_a_consistent_prefix(tmp_path):
    """`status` reads the record while an upgrade writes it (compaction included)."""
    path = tmp_path / "state.json"
    store, run = FileStateStore(path, compact_bytes=2048), new_run(10)
    store.save(run)
    done = threading.Event()

    def writer():
        for i in range(300):
            walk(run, store, f"node{i % 10}", STATES[i // 10 % 4])
        done.set()

    thread = threading.Thread(target=writer)
    thread.start()
    seen = 0
    while not done.is_set():
        loaded = FileStateStore(path).load()
        assert len(loaded.history) >= seen
        seen = len(loaded.history)
        consistent(loaded)
    thread.join()
    assert FileStateStore(path).load().to_dict() == run.to_dict()


def test_a_snapshot_replaced_during_each_of_several_reads_is_read_again(tmp_path, monkeypatch):
    """The writer folds its journal between the reader's snapshot and journal reads, five times.

    Each such read skips the journal (its lines belong to the newer snapshot) and is older than
    the record: the reader has to read again. It gave up after three tries, and a CI run under
    load saw the record shrink from 15 transitions to 7.
    """
    path = tmp_path / "state.json"
    store, run = FileStateStore(path), new_run(6)
    store.save(run)
    replay, races = FileStateStore._replay, iter(range(5))

    def racing_replay(self, loaded, snapshot_id):
        race = next(races, None)
        if race is not None:  # a new snapshot, then a line journalled after it
            walk(run, store, f"node{race}", "cordon-required")
            store.save(run)
            walk(run, store, f"node{race}", "wait-for-jobs-required")
        return replay(self, loaded, snapshot_id)

    monkeypatch.setattr(FileStateStore, "_replay", racing_replay)
    loaded = FileStateStore(path).load()
    assert next(races, None) is None and len(loaded.history) == 10
    assert loaded.to_dict() == run.to_dict()


WRITER = """
import sys, time
sys.path.insert(0, {root!r})
from tests.unit.test_upgrade_state_journal import new_run, walk, STATES
from gpustack.upgrade.state import FileStateStore
store, run = FileStateStore({path!r}, compact_bytes=8192), new_run(10)
store.save(run)
print("ready", flush=True)
for i in range(100000):
    walk(run, store, f"node{{i % 10}}", STATES[i // 10 % 4])
"""


@pytest.mark.parametrize("delay", [0.05, 0.2, 0.5])
def test_a_sigkill_while_writing_leaves_a_record_that_loads(tmp_path, delay):
    path = tmp_path / "state.json"
    code = WRITER.format(root=str(ROOT), path=str(path))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    loaded = FileStateStore(path).load()
    assert len(loaded.history) > 0
    consistent(loaded)
    # the order of the transitions is the writer's: node0, node1, ... round after round
    assert [t.node for t in loaded.history] == [f"node{i % 10}" for i in range(len(loaded.history))]
