"""The rolling upgrade loop: fill the free slots (planner), walk each node through its states.

A slot is refilled the moment its node finishes, and the fleet is read again on every pass
while a slot is free (as the GPU Operator's upgrade controller recomputes its free slots on
every reconcile), so one slow node never holds the others back: there are no batches to wait
for. Every transition is written to the durable record at once (and to the backend, e.g. a
node label), so a run stopped at any point can be resumed where it stopped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from gpustack.ansible.input_specs import is_true
from gpustack.errors import GpustackError
from gpustack.upgrade.backend import (
    HostOutcome,
    HostUpgrader,
    NodeBackend,
    NodeCondition,
    StepFailed,
    StepOptions,
)
from gpustack.upgrade.executors import Clock
from gpustack.upgrade.planner import (
    Limits,
    NodeView,
    blocked_reason,
    is_candidate,
    select_batch,
)
from gpustack.upgrade.state import (
    IN_PROGRESS,
    MemoryStateStore,
    NodeRecord,
    Target,
    Transition,
    UpgradeRun,
    UpgradeState,
)

S = UpgradeState
NEXT = {
    S.CORDON: S.WAIT_FOR_JOBS,
    S.WAIT_FOR_JOBS: S.POD_DELETION,
    S.POD_DELETION: S.DRAIN,
    S.DRAIN: S.POD_RESTART,
    S.POD_RESTART: S.VALIDATION,
    S.VALIDATION: S.UNCORDON,
    S.UNCORDON: S.DONE,
}


class Interrupted(Exception):
    """The run is being aborted: the node keeps its current state for --resume."""


@dataclass
class RolloutPolicy:
    limits: Limits
    max_failures: int = 0
    canary: int = 0
    canary_pause: float = 0
    assume_yes: bool = False
    retry_failed: bool = False
    steps: StepOptions = field(default_factory=StepOptions)
    # While a slot is free, read the fleet again this often (seconds) even if no node finished:
    # a node the admin uncordoned, or one Ready again, gives its capacity back to the rollout.
    refill_every: float = 30.0


@dataclass
class RolloutResult:
    status: str  # done, failed, interrupted, paused, blocked
    message: str = ""
    failed_now: list[str] = field(default_factory=list)


def check_host(target: Target, outcome: HostOutcome) -> str:
    """Pure: why the host's driver does not pass validation ("" when it does)."""
    driver = outcome.driver or {}
    installed = driver.get("installed_version")
    if not driver:
        return "the driver role published no gpustack_driver fact"
    if not target.matches(installed):
        return (
            f"driver {installed or 'not installed'} after the upgrade, wanted {target.describe()}"
        )
    if not driver.get("held"):
        return f"driver {installed} is installed but not held"
    state = str(driver.get("state", ""))
    if is_true(driver.get("reboot_required")):  # the role's boolean
        return (
            f"driver {installed} installed but not loaded ({state}); allow a reboot with "
            "-e nvidia_driver_reboot=if_needed, or reboot the node and --resume --retry-failed"
        )
    return ""


class _AbortableClock:
    """The node's clock; sleeping raises Interrupted once the run is being aborted."""

    def __init__(self, clock: Clock, abort: threading.Event):
        self._clock, self._abort = clock, abort

    def now(self) -> float:
        return self._clock.now()

    def sleep(self, seconds: float) -> None:
        if self._abort.is_set():
            raise Interrupted()
        self._clock.sleep(seconds)


class Orchestrator:
    def __init__(
        self,
        run: UpgradeRun,
        targets: Sequence[str],
        store: MemoryStateStore,
        backend: NodeBackend,
        upgrade_host: HostUpgrader,
        policy: RolloutPolicy,
        executor,
        confirm: Callable[[str], bool] | None = None,
        notify: Callable[[str], None] | None = None,
    ):
        self.run = run
        self.targets = list(targets)
        self.store = store
        self.backend = backend
        self.upgrade_host = upgrade_host
        self.policy = policy
        self.executor = executor
        self.confirm = confirm
        self.notify = notify or (lambda message: None)
        self.lock = store.lock
        self.abort = threading.Event()
        self.stop_requested = False
        self.activity: dict[str, str] = {}  # node -> what it is doing now (for the live view)
        self.conditions: dict[str, NodeCondition] = {}
        self.on_transition: Callable[[Transition], None] | None = None
        self._announced = 0

    # -- the loop ---------------------------------------------------------------------------

    def execute(self) -> RolloutResult:
        policy = self.policy
        clock = self.executor.clock
        in_flight: set[str] = set()
        failed_now: list[str] = []
        halted = ""
        canary_phase = policy.canary > 0 and not self.run.canary_done
        canary_started = 0
        replan = True  # the fleet changed since the last plan (a node finished)
        planned_at = clock.now()
        try:
            while True:
                cap = policy.canary - canary_started if canary_phase else None
                may_start = (
                    not halted
                    and not self.stop_requested
                    and len(in_flight) < policy.limits.max_parallel
                    and (cap is None or cap > 0)
                )
                due = clock.now() - planned_at >= policy.refill_every
                if may_start and (replan or due):
                    planned_at = clock.now()
                    batch = select_batch(
                        self.views(),
                        in_flight,
                        policy.limits,
                        retry_failed=policy.retry_failed,
                        cap=cap,
                        longest_first=not canary_phase,  # the canary: the inventory's first
                    )
                    if batch:
                        self._start(batch)
                        in_flight.update(batch)
                        canary_started += len(batch) if canary_phase else 0
                if not in_flight:
                    if halted:
                        return RolloutResult("failed", halted, failed_now)
                    if self.stop_requested:
                        return RolloutResult("interrupted", "stopped on request", failed_now)
                    if canary_phase and canary_started:
                        canary_phase = False
                        with self.lock:
                            self.run.canary_done = True
                            self.store.save(self.run, nodes=[])
                        if not self._after_canary(canary_started):
                            return RolloutResult("paused", "paused after the canary batch")
                        replan = True
                        continue
                    views = self.views()
                    if not any(is_candidate(v, policy.retry_failed) for v in views):
                        return RolloutResult("done", "", failed_now)
                    return RolloutResult(
                        "blocked", blocked_reason(views, policy.limits), failed_now
                    )
                try:
                    finished = self.executor.wait_any()
                except KeyboardInterrupt:  # when no signal handler was installed
                    self.request_stop()
                    finished = []
                self._announce()
                replan = bool(finished)
                for name in finished:
                    in_flight.discard(name)
                    self.activity.pop(name, None)
                    record = self.run.nodes[name]
                    if record.state != S.FAILED:
                        continue
                    failed_now.append(name)
                    if canary_phase:
                        halted = f"canary node {name} failed: {record.reason}"
                    elif len(failed_now) > policy.max_failures:
                        halted = (
                            f"{len(failed_now)} node(s) failed (max-failures {policy.max_failures})"
                            f"; last: {name}: {record.reason}"
                        )
        finally:
            self.executor.shutdown()

    def request_stop(self) -> None:
        """Ctrl-C / SIGTERM (signal-safe: sets flags only). First: start no new node and let
        nodes in progress finish; second: abort them, leaving their state for --resume."""
        if not self.stop_requested:
            self.stop_requested = True
        else:
            self.abort.set()

    def _announce(self) -> None:
        level = 2 if self.abort.is_set() else 1 if self.stop_requested else 0
        if level > self._announced:
            self._announced = level
            self.notify(
                "Aborting nodes in progress; they keep their state for --resume."
                if level == 2
                else "Stopping: no new node starts; nodes in progress finish "
                "(interrupt again to abort them; --resume continues later)."
            )

    def _after_canary(self, count: int) -> bool:
        message = f"Canary batch ({count} node(s)) upgraded."
        if self.policy.canary_pause > 0:
            self.notify(f"{message} Waiting {self.policy.canary_pause:g} s before continuing.")
            left = self.policy.canary_pause
            while left > 0 and not self.stop_requested:  # a stop request ends the wait
                self.executor.sleep(min(1.0, left))
                left -= 1.0
            return not self.stop_requested
        if self.policy.assume_yes:
            return True
        if self.confirm is not None:
            return self.confirm(f"{message} Continue with the rest of the fleet?")
        self.notify(f"{message} Paused: continue with --resume (add --yes to skip this pause).")
        return False

    def views(self) -> list[NodeView]:
        conditions = self.backend.conditions(self.targets)
        self.conditions = conditions
        views = []
        for name in self.targets:
            record = self.run.nodes[name]
            cond = conditions.get(name, NodeCondition())
            views.append(
                NodeView(
                    name,
                    record.state,
                    unavailable=cond.unavailable,
                    skip=cond.skip,
                    expected=self.run.durations.get(name),
                )
            )
        return views

    def _start(self, batch: list[str]) -> None:
        with self.lock:
            self.run.batches.append(list(batch))
            index = len(self.run.batches)
            for name in batch:
                self.run.nodes[name].batch = index
            self.store.save(self.run, nodes=batch)
        for name in batch:
            self.activity[name] = "starting"
            self.executor.submit(name, lambda clock, n=name: self.upgrade_node(n, clock))

    # -- one node ---------------------------------------------------------------------------

    def upgrade_node(self, name: str, clock: Clock) -> None:
        """Walk one node from its current state to upgrade-done or upgrade-failed."""
        clock = _AbortableClock(clock, self.abort)
        record = self.run.nodes[name]
        opts = self.policy.steps
        try:
            with self.lock:
                record.attempts += 1
                record.started_at = clock.now()
                record.finished_at = None
            if record.state == S.REQUIRED:
                cond = self.conditions.get(name) or NodeCondition()
                # An earlier run's record (annotation) wins: that cordon may have been ours.
                admin = cond.admin_cordoned if cond.admin_cordoned is not None else cond.cordoned
                record.admin_cordoned = admin
                note = "cordoned by an admin before the upgrade" if admin else ""
                self._move(name, S.CORDON, clock, note)
            elif record.state == S.FAILED:
                self._move(name, S.CORDON, clock, "retrying a failed node")
            while record.state in IN_PROGRESS:
                if self.abort.is_set():
                    raise Interrupted()
                state = S(record.state)
                self.activity[name] = state.value
                note = self._step(name, state, clock, opts)
                self._move(name, NEXT[state], clock, note)
        except Interrupted:
            self.activity[name] = "interrupted"
        except (StepFailed, GpustackError) as exc:  # GpustackError: an API call failed
            self._move(name, S.FAILED, clock, reason=str(exc))
        except Exception as exc:  # a bug or an unexpected API error: record it, keep going
            self._move(name, S.FAILED, clock, reason=f"{type(exc).__name__}: {exc}")

    def _step(self, name: str, state: UpgradeState, clock: Clock, opts: StepOptions) -> str:
        backend = self.backend
        if state == S.CORDON:
            return backend.cordon(name, clock, opts)
        if state == S.WAIT_FOR_JOBS:
            if not opts.pod_selector:
                return "no job selector"
            return backend.wait_for_jobs(name, clock, opts)
        if state == S.POD_DELETION:
            return backend.evict_gpu_pods(name, clock, opts)
        if state == S.DRAIN:
            return backend.drain(name, clock, opts) if opts.drain else "drain off"
        if state == S.POD_RESTART:
            return self._upgrade_host(name, clock)
        if state == S.VALIDATION:
            record = self.run.nodes[name]
            problem = check_host(
                self.run.target, HostOutcome(ok=True, driver=record.driver, gpus=0)
            )
            if problem:
                raise StepFailed(f"validation: {problem}")
            return f"driver {record.driver.get('installed_version')} held; " + backend.validate(
                name, clock, opts, record.driver
            )
        if state == S.UNCORDON:
            if self.run.nodes[name].admin_cordoned:
                return "left cordoned: it was cordoned by an admin before the upgrade"
            return backend.uncordon(name, clock, opts)
        raise StepFailed(f"no step for state {state}")

    def _upgrade_host(self, name: str, clock: Clock) -> str:
        """The driver role between a pause and a resume of the node's GPU clients (their pods
        hold the GPUs, so the driver could not be reloaded): resumed whatever the role gave, as
        NVIDIA's driver manager does, unless the run is interrupted (a resumed run resumes
        them)."""
        interrupted = False
        try:
            paused = self.backend.pause_gpu_clients(name, clock, self.policy.steps)
            self.activity[name] = "driver role"
            outcome = self.upgrade_host(name, self.abort.is_set, clock)
            if outcome.canceled:
                raise Interrupted()
        except Interrupted:
            interrupted = True
            raise
        finally:
            resumed = "" if interrupted else self.backend.resume_gpu_clients(name)
        with self.lock:
            record = self.run.nodes[name]
            record.artifacts = outcome.artifacts
            if outcome.driver:
                # gpus and nvidia_smi: the GPUs the role read, for validation's UUID check
                record.driver = {
                    k: outcome.driver.get(k) for k in ("installed_version", "held", "state")
                } | {k: outcome.driver[k] for k in ("gpus", "nvidia_smi") if k in outcome.driver}
        if not outcome.ok:
            raise StepFailed(f"driver role: {outcome.reason}")
        return "; ".join(
            part for part in (paused, f"driver role ran; {record.driver.get('state', '')}",
                              resumed) if part
        )  # fmt: skip

    def _move(
        self, name: str, to: UpgradeState, clock: Clock, note: str = "", reason: str = ""
    ) -> None:
        # The node's label first, outside the lock: one node's transitions come from one thread,
        # and an API call under the lock would make every node in progress wait for it (with
        # several nodes at a time, their label writes would run one after another).
        self.backend.record_state(name, to.value, reason, self.run.nodes[name].admin_cordoned)
        with self.lock:
            record: NodeRecord = self.run.nodes[name]
            now = clock.now()
            transition = Transition(name, record.state, to.value, now, note or reason)
            self.run.history.append(transition)
            record.state = to.value
            if to == S.FAILED:
                record.reason = reason
                record.finished_at = now
            elif to == S.DONE:
                record.reason = ""
                record.finished_at = now
            self.store.save(self.run, nodes=[name])
            if self.on_transition:
                self.on_transition(transition)
