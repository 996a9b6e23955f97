"""Clocks and executors: how node upgrades run, for real (threads) or simulated (virtual time).

The orchestrator never calls `time` directly. With `ThreadExecutor` node upgrades run in
threads against the wall clock; with `SimulatedExecutor` each node's upgrade runs to its end at
once against its own virtual clock and the executor reports it finished when the simulation's
time reaches that end — a discrete-event simulation that drives the real orchestrator loop.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Protocol


class Clock(Protocol):
    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class RealClock:
    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class VirtualClock:
    def __init__(self, start: float = 0.0):
        self.t = start

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(0.0, seconds)


NodeJob = Callable[[Clock], None]


class ThreadExecutor:
    """Node upgrades in worker threads; `wait_any` returns as soon as one finishes."""

    def __init__(self, max_workers: int, poll: float = 0.5):
        self.clock = RealClock()
        self.poll = poll
        self._pool = ThreadPoolExecutor(max_workers=max(1, max_workers), thread_name_prefix="node")
        self._futures: dict[str, Future] = {}

    def submit(self, name: str, job: NodeJob) -> None:
        self._futures[name] = self._pool.submit(job, RealClock())

    def wait_any(self) -> list[str]:
        """Names of finished jobs (possibly none after `poll` seconds)."""
        if not self._futures:
            return []
        done, _ = wait(list(self._futures.values()), timeout=self.poll, return_when=FIRST_COMPLETED)
        finished = [name for name, fut in self._futures.items() if fut in done]
        for name in finished:
            self._futures.pop(name).result()  # a bug in a job must not vanish silently
        return finished

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=True)


class SimulatedExecutor:
    """Discrete-event execution: jobs consume virtual time; nothing really waits."""

    def __init__(self):
        self.clock = VirtualClock()
        self._events: list[tuple[float, int, str]] = []
        self._seq = 0

    def submit(self, name: str, job: NodeJob) -> None:
        clock = VirtualClock(self.clock.now())
        job(clock)
        self._seq += 1
        heapq.heappush(self._events, (clock.now(), self._seq, name))

    def wait_any(self) -> list[str]:
        if not self._events:
            return []
        at, _, name = heapq.heappop(self._events)
        self.clock.t = max(self.clock.t, at)
        finished = [name]
        while self._events and self._events[0][0] <= at:
            finished.append(heapq.heappop(self._events)[2])
        return finished

    def sleep(self, seconds: float) -> None:
        self.clock.sleep(seconds)

    def shutdown(self) -> None:
        pass
