"""One node's verification report: its checks, each passed, failed or skipped."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

PASSED, FAILED, SKIPPED = "passed", "failed", "skipped"


@dataclass
class Check:
    name: str
    status: str
    message: str = ""
    seconds: float = 0.0


@dataclass
class NodeReport:
    host: str
    node: str
    gpus: int = 0
    uuids: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(c.status != FAILED for c in self.checks)

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    def add(self, name: str, status: str, message: str = "", seconds: float = 0.0) -> None:
        self.checks.append(Check(name, status, message, round(seconds, 2)))

    def failed(self) -> bool:
        return any(c.status == FAILED for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["passed"] = self.passed
        return data
