"""TEST DOUBLES for upgrade tests: they stand in for running the driver role over SSH.

Nothing here touches a host. `FakeHostUpgrader` answers as the nvidia_driver role's
`gpustack_driver` fact would after an install; the lab tests (tests/lab/test_upgrade.py) run
the real role on real nodes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from gpustack.upgrade.backend import HostOutcome
from gpustack.upgrade.state import FINAL, IN_PROGRESS, Transition, UpgradeState

NEW = "535.309.01-0+deb12u1"


class FakeHostUpgrader:
    """Test double: 'upgrades' a host in `duration` seconds; some hosts fail or misbehave."""

    def __init__(
        self,
        version: str = NEW,
        fail: dict[str, str] | None = None,
        not_held: set[str] | None = None,
        wrong_version: dict[str, str] | None = None,
        duration: float = 0.0,
        durations: dict[str, float] | None = None,
        before: Callable[[str], None] | None = None,
        gpus: dict[str, list[str]] | None = None,
    ):
        self.version = version
        self.fail = fail or {}
        self.not_held = not_held or set()
        self.wrong_version = wrong_version or {}
        self.duration = duration
        self.durations = durations or {}
        self.before = before
        self.gpus = gpus or {}  # host -> the GPU UUIDs the role's nvidia-smi reads there
        self.calls: list[str] = []
        self.active: set[str] = set()
        self.max_active = 0
        self._lock = threading.Lock()

    def __call__(self, host: str, cancel: Callable[[], bool], clock=None) -> HostOutcome:
        with self._lock:
            self.calls.append(host)
            self.active.add(host)
            self.max_active = max(self.max_active, len(self.active))
        try:
            if self.before:
                self.before(host)
            deadline = time.monotonic() + self.durations.get(host, self.duration)
            while time.monotonic() < deadline:
                if cancel():
                    return HostOutcome(ok=False, reason="canceled", canceled=True)
                time.sleep(0.01)
            if cancel():
                return HostOutcome(ok=False, reason="canceled", canceled=True)
            if host in self.fail:
                return HostOutcome(ok=False, reason=self.fail[host])
            version = self.wrong_version.get(host, self.version)
            driver = {
                "installed_version": version,
                "held": host not in self.not_held,
                "state": "installed, not loaded: no NVIDIA device",
            }
            if host in self.gpus:  # the gpustack_driver fact's GPUs, as the role reads them
                driver["state"] = f"loaded {version}"
                driver["nvidia_smi"] = {"rc": "0", "message": "ok"}
                driver["gpus"] = [
                    {"name": "NVIDIA A100-SXM4-80GB", "uuid": u, "memory_mib": 81920}
                    for u in self.gpus[host]
                ]
            return HostOutcome(ok=True, driver=driver)
        finally:
            with self._lock:
                self.active.discard(host)


def in_progress_intervals(history: list[Transition]) -> dict[str, list[tuple[float, float]]]:
    """Per node, the [start, end] spans between leaving upgrade-required and a final state."""
    spans: dict[str, list[tuple[float, float]]] = {}
    opened: dict[str, float] = {}
    for t in history:
        if t.to_state in IN_PROGRESS and t.node not in opened:
            opened[t.node] = t.at
        elif (t.to_state in FINAL or t.to_state == UpgradeState.REQUIRED) and t.node in opened:
            spans.setdefault(t.node, []).append((opened.pop(t.node), t.at))
    for node, start in opened.items():  # interrupted: still open
        spans.setdefault(node, []).append((start, float("inf")))
    return spans
