"""What the smoke checks share: the statuses, one check, one host's result, the host's facts."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

from gpustack.smoke import parse

PASS, WARN, FAIL, ABSENT, SKIPPED, INFO = "pass", "warn", "fail", "absent", "skipped", "info"
ESSENTIAL = ("gpu_pci", "driver_loaded", "nvidia_smi")
NO_DEVICE = "no NVIDIA device"


@dataclass
class Check:
    name: str
    status: str
    summary: str
    detail: dict[str, Any] = field(default_factory=dict)


@dataclass
class HostSmoke:
    host: str
    verdict: str  # pass | fail | no NVIDIA device | not run
    summary: str
    checks: list[Check] = field(default_factory=list)
    gpus: list[dict[str, Any]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.verdict == PASS

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def first_line(*texts: str | None, width: int = 240) -> str:
    for text in texts:
        for line in (text or "").splitlines():
            if line.strip():
                line = " ".join(line.split())
                return line if len(line) <= width else line[: width - 1] + "…"
    return ""


# NVIDIA's Go tools (nvidia-ctk, the runtime) log with logrus: `time=... level=error msg="..."`.
_LOGRUS_ERROR = re.compile(r'level=(?:error|fatal) msg="((?:[^"\\]|\\.)*)"')


def ran(result: dict | None) -> str:
    """'exit N: why' for a command result: a failed command's first logrus error message (the
    real nvidia-ctk prints warnings before it), else the first line of its output."""
    if not result:
        return ""
    message = ""
    if result.get("rc") not in (0, None):
        for text in (result.get("stderr"), result.get("stdout")):
            found = _LOGRUS_ERROR.search(text or "")
            if found:
                message = first_line(found.group(1).replace('\\"', '"').replace("\\n", " "))
                break
    message = message or first_line(result.get("stderr"), result.get("stdout"))
    return f"exit {result.get('rc')}" + (f": {message}" if message else "")


class HostFacts:
    """The facts of one host and what every check needs from them."""

    def __init__(self, facts: dict[str, Any]):
        self.pf = facts.get("gpustack_preflight") or {}
        self.status = facts.get("gpustack_status") or {}
        self.smoke = facts.get("gpustack_smoke") or {}
        self.has_gpu = bool((self.pf.get("gpus") or {}).get("count"))
        driver = self.pf.get("driver") or {}
        self.installed = (driver.get("installed") or {}).get("version")
        self.package = (driver.get("installed") or {}).get("package")
        self.loaded = driver.get("loaded_version")
        self.smi: parse.SmiLog | None = None  # nvidia-smi -q -x, when it answered and parsed
        self.smi_error = ""
        result = self.smoke.get("nvidia_smi") or {}
        if result.get("rc") == 0:
            try:
                self.smi = parse.parse_xml(result.get("stdout") or "")
            except parse.NvsmiParseError as exc:
                self.smi_error = str(exc)

    def gpu_dependent(self, status: str) -> str:
        """Without an NVIDIA device a failing GPU check says 'absent', not 'fail'."""
        return status if self.has_gpu or status != FAIL else ABSENT
