"""Upgrade states (the GPU Operator's names) and the durable record of one rolling upgrade.

The record is plain data. `FileStateStore` keeps it durable after every transition, so a run killed
at any instant leaves a readable record that `--resume` continues: a snapshot written atomically
(tmp file + rename), and after it a journal of the transitions, one fsynced JSON line each, folded
into a new snapshot once the journal is as large as the snapshot. Rewriting the whole record
after every transition had cost O(N) per transition, O(N^2) per upgrade (about 0.1 s per
transition at 1,000 nodes, 1 s at 10,000, under the orchestrator's lock;
benchmarks/upgrade_state.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any

from gpustack.driver_version import on_branch, same_version
from gpustack.errors import BadInput
from gpustack.paths import state_root

STATE_LABEL = "nvidia.com/gpu-driver-upgrade-state"
SKIP_LABEL = "nvidia.com/gpu-driver-upgrade.skip"
FORMAT_VERSION = 1


class UpgradeState(StrEnum):
    """Per-node states, in the order a node walks through them."""

    REQUIRED = "upgrade-required"
    CORDON = "cordon-required"
    WAIT_FOR_JOBS = "wait-for-jobs-required"
    POD_DELETION = "pod-deletion-required"
    DRAIN = "drain-required"
    POD_RESTART = "pod-restart-required"
    VALIDATION = "validation-required"
    UNCORDON = "uncordon-required"
    DONE = "upgrade-done"
    FAILED = "upgrade-failed"


# A node in one of these states has been taken out of service by this upgrade.
IN_PROGRESS = frozenset(
    {
        UpgradeState.CORDON,
        UpgradeState.WAIT_FOR_JOBS,
        UpgradeState.POD_DELETION,
        UpgradeState.DRAIN,
        UpgradeState.POD_RESTART,
        UpgradeState.VALIDATION,
        UpgradeState.UNCORDON,
    }
)
FINAL = frozenset({UpgradeState.DONE, UpgradeState.FAILED})
# "skipped" is not a GPU Operator state: it marks nodes carrying the skip label.
SKIPPED = "skipped"


@dataclass(frozen=True)
class Target:
    """What the fleet is upgraded to: an exact package version, or the newest of a branch."""

    version: str = ""
    branch: str = ""

    def describe(self) -> str:
        return self.version or f"newest of branch {self.branch}"

    def matches(self, installed: str | None) -> bool:
        if not installed:
            return False
        if self.version:  # an epoch on one side only is the same version, as `status` says
            return same_version(installed, self.version)
        return on_branch(installed, self.branch)


@dataclass
class NodeRecord:
    name: str
    state: str = UpgradeState.REQUIRED.value
    reason: str = ""
    admin_cordoned: bool = False
    batch: int | None = None
    attempts: int = 0
    started_at: float | None = None
    finished_at: float | None = None
    driver: dict[str, Any] = field(default_factory=dict)  # installed_version, held, state
    artifacts: str = ""


@dataclass
class Transition:
    node: str
    from_state: str
    to_state: str
    at: float
    note: str = ""


@dataclass
class UpgradeRun:
    """Everything about one rolling upgrade of one inventory; serialised as JSON."""

    inventory: str
    target: Target
    mode: str  # "host-only" or "kubernetes"
    created_at: float = field(default_factory=time.time)
    updated_at: float = field(default_factory=time.time)
    canary_done: bool = False
    batches: list[list[str]] = field(default_factory=list)
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    history: list[Transition] = field(default_factory=list)
    # Seconds each node was out of service the last time an upgrade of this inventory
    # completed it (carried from run to run): the planner starts the longest first.
    durations: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["format"] = FORMAT_VERSION
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> UpgradeRun:
        return cls(
            inventory=data["inventory"],
            target=Target(**data["target"]),
            mode=data.get("mode", "host-only"),
            created_at=data.get("created_at", 0.0),
            updated_at=data.get("updated_at", 0.0),
            canary_done=data.get("canary_done", False),
            batches=[list(b) for b in data.get("batches", [])],
            nodes={k: NodeRecord(**v) for k, v in data.get("nodes", {}).items()},
            history=[Transition(**t) for t in data.get("history", [])],
            durations={k: float(v) for k, v in data.get("durations", {}).items()},
        )

    def measured_durations(self) -> dict[str, float]:
        """The durations known after this run: for each node it completed, the time from the
        start of its last attempt to upgrade-done, averaged with the earlier figure (one
        upgrade's time is noisy: mirror speed, pods to evict); other nodes keep theirs."""
        known = dict(self.durations)
        for name, record in self.nodes.items():
            if (
                record.state == UpgradeState.DONE
                and record.started_at is not None
                and record.finished_at is not None
                and record.finished_at >= record.started_at
            ):
                measured = record.finished_at - record.started_at
                earlier = known.get(name)
                known[name] = measured if earlier is None else (earlier + measured) / 2
        return known


def state_path_for(inventory: Path) -> Path:
    """A stable location per inventory file, so `--resume` finds the run it continues."""
    resolved = Path(inventory).expanduser().resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9_.-]", "_", resolved.stem)[:40]
    return state_root() / "upgrades" / f"{slug}-{digest}.json"


LOAD_ATTEMPTS = 50  # reads of a snapshot replaced under the reader before it settles for one


def _same_file(fd: int, path: Path) -> bool:
    """`path` still names the open file `fd` (it was not replaced since it was opened)."""
    try:
        now, held = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)


class MemoryStateStore:
    """The run held in memory only (simulations and tests that need no file)."""

    def __init__(self, run: UpgradeRun | None = None):
        self.run = run
        self.lock = threading.RLock()
        self.path: Path | None = None

    def load(self) -> UpgradeRun | None:
        return self.run

    def save(self, run: UpgradeRun, nodes: list[str] | None = None) -> None:
        """Keep `run`; `nodes`: the records that changed (a file store journals only those)."""
        self.run = run


class FileStateStore(MemoryStateStore):
    """The run as a JSON snapshot plus a journal of what changed since (`<path>.journal`).

    `save(run)` writes a snapshot (and drops the journal); `save(run, nodes=[...])` appends the
    named nodes' records, the transitions and batches added since the last save and the run's
    scalar fields as one line, and folds the journal into a new snapshot once it has grown to the
    snapshot's size (at least `compact_bytes`): amortised, each transition costs its own size.
    Each snapshot has a new id; journal lines carry it with a sequence number, so a line left by
    an earlier snapshot (a kill between the rename and the journal's removal) is never replayed,
    and a torn last line (a kill mid-write) is dropped as a kill just before it would be.
    """

    def __init__(self, path: Path, compact_bytes: int = 256 * 1024):
        super().__init__()
        self.path = Path(path)
        self.journal = self.path.with_name(self.path.name + ".journal")
        self.compact_bytes = compact_bytes
        self._id = ""
        self._seq = 0
        self._snapshot_bytes = 0
        self._journal_bytes = 0
        self._history = 0  # transitions and batches already on disk
        self._batches = 0
        self._torn = False  # the journal ends in a torn line: the next save is a snapshot

    def load(self) -> UpgradeRun | None:
        # A live run may replace the snapshot (and drop the journal) while it is read: then the
        # journal read belongs to a newer snapshot and is skipped, so read again. The snapshot
        # stays open until the check, so its inode cannot be reused by the newer one's file.
        for _ in range(LOAD_ATTEMPTS):
            try:
                fh = self.path.open("rb")
            except FileNotFoundError:
                return None
            with fh:
                try:
                    text = fh.read().decode("utf-8")
                    data = json.loads(text)
                    run = UpgradeRun.from_dict(data)
                    self._replay(run, data.get("journal_id", ""))
                except (ValueError, KeyError, TypeError, AttributeError) as exc:
                    reason = f"missing {exc}" if isinstance(exc, KeyError) else str(exc)
                    raise BadInput(
                        f"upgrade state file {self.path} is not readable ({reason})",
                        "move it aside to start a new upgrade (nodes it marked cordoned stay "
                        "cordoned)",
                    ) from None
                if _same_file(fh.fileno(), self.path):
                    break
        self._id = data.get("journal_id", "")
        self._snapshot_bytes = len(text)
        self._written(run)
        self.run = run
        return run

    def _replay(self, run: UpgradeRun, snapshot_id: str) -> None:
        """Apply the journal's lines written after this snapshot, in order."""
        self._seq = self._journal_bytes = 0
        self._torn = False
        try:
            lines = self.journal.read_text(encoding="utf-8").splitlines(keepends=True)
        except FileNotFoundError:
            return
        for number, line in enumerate(lines, 1):
            try:
                entry = json.loads(line)
            except ValueError:
                if number == len(lines) and not line.endswith("\n"):
                    self._torn = True  # a kill mid-write: that save never completed
                    break
                raise ValueError(f"{self.journal} line {number} is not JSON") from None
            if not snapshot_id or entry["id"] != snapshot_id:
                continue  # written after an earlier snapshot
            if entry["seq"] != self._seq + 1:
                raise ValueError(f"{self.journal} line {number}: sequence {entry['seq']}")
            self._seq = entry["seq"]
            self._journal_bytes += len(line)
            run.updated_at = entry["updated_at"]
            run.canary_done = entry["canary_done"]
            run.batches.extend(list(b) for b in entry["batches"])
            run.history.extend(Transition(**t) for t in entry["history"])
            run.nodes.update({k: NodeRecord(**v) for k, v in entry["nodes"].items()})

    def save(self, run: UpgradeRun, nodes: list[str] | None = None) -> None:
        with self.lock:
            run.updated_at = time.time()
            journal = nodes is not None and run is self.run and self._id and not self._torn
            if journal and self._journal_bytes < max(self.compact_bytes, self._snapshot_bytes):
                self._append(run, nodes)
            else:
                self._snapshot(run)
            self.run = run

    def _append(self, run: UpgradeRun, nodes: list[str]) -> None:
        entry = {
            "id": self._id,
            "seq": self._seq + 1,
            "updated_at": run.updated_at,
            "canary_done": run.canary_done,
            "batches": run.batches[self._batches :],
            "history": [asdict(t) for t in run.history[self._history :]],
            "nodes": {name: asdict(run.nodes[name]) for name in nodes},
        }
        line = json.dumps(entry, sort_keys=True) + "\n"
        fd = os.open(self.journal, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)  # as mkstemp's
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.write(line)
            fh.flush()
            os.fsync(fh.fileno())
        self._seq += 1
        self._journal_bytes += len(line)
        self._written(run)

    def _snapshot(self, run: UpgradeRun) -> None:
        data = run.to_dict()
        data["journal_id"] = uuid.uuid4().hex
        text = json.dumps(data, indent=1, sort_keys=True) + "\n"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=self.path.name + ".", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.journal.unlink(missing_ok=True)
        self._id, self._seq, self._torn = data["journal_id"], 0, False
        self._snapshot_bytes, self._journal_bytes = len(text), 0
        self._written(run)

    def _written(self, run: UpgradeRun) -> None:
        """The transitions and batches of `run` are on disk: the next line starts after them."""
        self._history, self._batches = len(run.history), len(run.batches)
