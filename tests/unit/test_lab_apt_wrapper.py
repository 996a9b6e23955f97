"""The lab nodes' apt-get wrapper: a turn on the shared archive cache's lock for every command but
`update`, which takes no archive lock (gpustack/lab/images.py). Run with stand-ins for flock and the
diverted apt-get, so the test sees which path each command line takes."""

from __future__ import annotations

import subprocess

import pytest

from gpustack.lab.images import OS_SPECS, configure_script

LOCK = "flock /var/cache/apt/archives/.gpustack-lab.lock"


def wrapper(tmp_path) -> str:
    """The wrapper as the image recipe writes it, its two programs replaced by stand-ins that say
    which one ran."""
    script = configure_script(OS_SPECS["debian12"])
    body = script.split("cat > /usr/bin/apt-get <<'EOS'\n", 1)[1].split("\nEOS\n", 1)[0]
    assert body.count(LOCK) == 1 and body.count("/usr/bin/apt-get.distrib") == 2
    distrib = tmp_path / "apt-get.distrib"
    distrib.write_text('#!/bin/sh\necho "distrib $*"\n')
    distrib.chmod(0o755)
    body = body.replace(LOCK, f"{tmp_path}/flock").replace("/usr/bin/apt-get.distrib", str(distrib))
    flock = tmp_path / "flock"
    flock.write_text('#!/bin/sh\necho "locked"\nexec "$@"\n')
    flock.chmod(0o755)
    path = tmp_path / "apt-get"
    path.write_text(body + "\n")
    path.chmod(0o755)
    return str(path)


@pytest.mark.parametrize(
    ("argv", "locked"),
    [
        (["update"], False),
        (["-qq", "update"], False),
        (["-o", "Acquire::Check-Valid-Until=false", "update"], False),
        (["-c", "/etc/apt/other.conf", "-q", "update"], False),
        (["install", "-y", "hello"], True),
        (["-y", "-qq", "--no-install-recommends", "install", "hello"], True),
        # an option's value is not the command
        (["-o", "update", "install", "hello"], True),
        (["install", "update"], True),
        (["clean"], True),
        (["-s", "upgrade"], True),
    ],
)
def test_only_update_runs_without_the_caches_lock(tmp_path, argv, locked):
    run = subprocess.run([wrapper(tmp_path), *argv], capture_output=True, text=True, check=True)
    out = run.stdout.splitlines()
    assert out == (["locked"] if locked else []) + [f"distrib {' '.join(argv)}"]
