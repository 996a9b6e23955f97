"""Run directories: old ones are pruned, ones that may belong to a running play are not."""

from __future__ import annotations

import os
import time
from pathlib import Path

from gpustack.ansible import runner


def test_prune_keeps_the_newest_and_any_recent_run(state_dir):
    root = state_dir / "runs"
    root.mkdir(parents=True)
    day_old = time.time() - 2 * runner.RUN_MIN_AGE_S
    old = []
    for i in range(runner.KEEP_RUNS + 5):
        path = root / f"20200101T0000{i:02d}-1-site-x"
        path.mkdir()
        os.utime(path, (day_old, day_old))
        old.append(path)
    recent = [root / f"20200102T0000{i:02d}-1-site-x" for i in range(3)]
    for path in recent:
        path.mkdir()
    # `recent` sort after `old` but so would the oldest: make some recent ones sort first.
    early_recent = root / "20190101T000000-1-site-busy"
    early_recent.mkdir()
    new = runner._private_data_dir(Path("site.yml"))
    left = set(root.iterdir())
    assert new in left and early_recent in left and set(recent) <= left
    assert not set(old[:5]) & left  # the day-old surplus went
    assert len([p for p in old if p in left]) == runner.KEEP_RUNS - 3
