"""Run one Molecule lab scenario (docs/molecule.md) from the lab suite: one test file per scenario,
so that pytest-xdist (`--dist loadfile`) schedules each beside the other lab files.

`molecule test` runs the whole sequence (create, prepare, converge, idempotence, verify,
destroy) on real podman lab nodes; the test only starts it and fails with its output.
"""

from __future__ import annotations

import subprocess
import time

from tests.conftest import ROOT


def molecule_test(scenario: str) -> None:
    # scripts/molecule.sh: Molecule with the virtual environment on PATH (docs/molecule.md)
    start = time.monotonic()
    proc = subprocess.run([str(ROOT / "scripts/molecule.sh"), "test", "-s", scenario], cwd=ROOT,
                          capture_output=True, text=True, timeout=2700)  # fmt: skip
    print(f"molecule test -s {scenario}: rc {proc.returncode} in {time.monotonic() - start:.0f} s")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-20000:]
