"""Run one Molecule lab scenario (docs/molecule.md) from the lab suite: one test file per scenario,
so that pytest-xdist (`--dist loadfile`) schedules each beside the other lab files.

`molecule test` runs the whole sequence (create, prepare, converge, idempotence, verify,
destroy) on real podman lab nodes; the test only starts it and fails with its output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT


def molecule_test(scenario: str) -> None:
    bindir = str(Path(sys.executable).parent)  # Molecule calls ansible-playbook and pytest by name
    env = {**os.environ, "PATH": f"{bindir}:{os.environ.get('PATH', '')}"}
    start = time.monotonic()
    proc = subprocess.run([f"{bindir}/molecule", "test", "-s", scenario], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=2700)  # fmt: skip
    print(f"molecule test -s {scenario}: rc {proc.returncode} in {time.monotonic() - start:.0f} s")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-20000:]
