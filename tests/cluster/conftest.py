"""Fixtures: a Kubernetes API emulator (tests/cluster/emulator/, see README.md) per test, over real HTTP."""

from __future__ import annotations

import pytest

from tests.cluster.emulator import EmulatorThread


class FakeClock:
    """Time that moves only when waited on: timeouts cost no wall time.

    `on_sleep(now)` lets a test act as a controller while gpustack waits.
    """

    def __init__(self):
        self.t = 0.0
        self.on_sleep = None

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += seconds
        if self.on_sleep:
            self.on_sleep(self.t)


@pytest.fixture
def cluster():
    """A running emulator; fails the test if the emulator itself raised (an emulator bug)."""
    thread = EmulatorThread().start()
    yield thread
    thread.stop()
    assert not thread.emulator.server_errors, thread.emulator.server_errors


@pytest.fixture
def kubeconfig(cluster, tmp_path):
    return cluster.write_kubeconfig(tmp_path / "kubeconfig")


@pytest.fixture
def clock():
    return FakeClock()
