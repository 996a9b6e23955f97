"""The nvidia runtime wired into a real Docker engine on a lab node, and taken out again.

Real: Debian's docker.io (dockerd 20.10 on Debian 12, vfs storage inside the nested node),
its containerd and runc, systemd, apt. TEST FIXTURE: the NVIDIA container toolkit is the
stand-in package of tests/fixtures/lab_fixtures.py, whose `nvidia-container-runtime` logs each
call and runs runc. What this proves: daemon.json merged with the user's keys kept, the running
dockerd reloaded (not restarted) with the runtime loaded, a `docker run --runtime nvidia` handed
to that binary, a lost reload found and finished, and uninstall giving the user's daemon.json
back byte for byte. Nothing about NVIDIA's own runtime or a GPU.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import lab_nodes, run_cli
from tests.fixtures import lab_fixtures
from tests.lab.test_lab import ssh

pytestmark = pytest.mark.lab

LAB = f"{os.environ.get('GPUSTACK_LAB_PREFIX', 'de')}{os.getpid()}"
NODE = f"{LAB}-node1"
BINARY = "/usr/bin/nvidia-container-runtime"
# The user's own daemon.json: two-space indent, a runtime of their own.
USER_DAEMON = '{\n  "log-level": "info",\n  "runtimes": {"crun-x": {"path": "/usr/bin/crun"}}\n}\n'
INFO = "docker info --format '{{json .Runtimes}}|{{.DefaultRuntime}}'"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    work = tmp_path_factory.mktemp("docker-engine")
    inventory = work / "docker.ini"
    with lab_nodes(LAB, 1, inventory):
        setup = ssh(inventory, NODE, "apt-get update -qq && DEBIAN_FRONTEND=noninteractive "
                    "apt-get install -y -qq --no-install-recommends docker.io >/dev/null")  # fmt: skip
        assert setup.returncode == 0, setup.stdout + setup.stderr
        varsfile = lab_fixtures.prepare([f"gpustack-{NODE}"], work / "fixture.json",
                                        with_containerd=False)  # fmt: skip
        image = ssh(inventory, NODE, f"docker load -i {lab_fixtures.IMAGE_IN_NODE}")
        assert image.returncode == 0, image.stderr
        yield inventory, varsfile


# The test's own restarts stand for a user's: with the lab's restart on docker.io's install they
# use up docker.service's 3 starts a minute (StartLimitBurst) before uninstall restarts Docker,
# which must still work (the role resets the count before its one deliberate restart).
RESTART = "systemctl restart docker"


def sh(inventory, command: str) -> str:
    proc = ssh(inventory, NODE, command)
    assert proc.returncode == 0, f"{command}: {proc.stdout}{proc.stderr}"
    return proc.stdout


def loaded(inventory) -> tuple[dict, str]:
    runtimes, default = sh(inventory, INFO).strip().split("|")
    return json.loads(runtimes), default


def install(inventory, varsfile, *extra: str) -> dict:
    proc = run_cli("install", str(inventory), "-e", f"@{varsfile}", "--full", "--output", "json",
                   "-t", "nvidia_container_toolkit,container_runtime", *extra, timeout=1200)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout)


def uninstall(inventory) -> None:
    proc = run_cli("uninstall", str(inventory), "--components", "runtime", "--yes", timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_docker_is_the_detected_runtime(lab):
    inventory, _ = lab
    proc = run_cli("doctor", str(inventory), "--output", "json")
    pf = json.loads(proc.stdout)["hosts"][NODE]["facts"]["gpustack_preflight"]
    # docker.io brings its own containerd; without a kubelet, Docker is the runtime to wire
    assert {r["kind"] for r in pf["runtimes"]} == {"containerd", "docker"}
    assert pf["runtime"] == "docker"


def test_a_broken_daemon_json_is_refused_before_any_change(lab):
    inventory, varsfile = lab
    sh(inventory, "printf '{\"log-level\": ' > /etc/docker/daemon.json")
    files = "md5sum /etc/docker/daemon.json; ls -A /var/lib/gpustack 2>&1 || true"
    before = sh(inventory, files)
    proc = run_cli("install", str(inventory), "-e", f"@{varsfile}", "--full", "--output", "json",
                   "-t", "container_runtime", timeout=1200)  # fmt: skip
    assert proc.returncode != 0
    host = json.loads(proc.stdout)["hosts"][NODE]
    message = " ".join(f["message"] for f in host["failures"])
    assert "/etc/docker/daemon.json is not valid JSON" in message and "Hint: fix" in message
    assert "gpustack changed nothing" in message and host["changed"] == 0, host
    assert sh(inventory, files) == before


def test_install_reloads_docker_and_uninstall_gives_the_file_back(lab):
    inventory, varsfile = lab
    sh(
        inventory,
        f"printf '%s' '{USER_DAEMON}' > /etc/docker/daemon.json && {RESTART}",
    )
    pid = sh(inventory, "systemctl show -p MainPID --value docker").strip()

    doc = install(inventory, varsfile)
    runtime = doc["hosts"][NODE]["facts"]["gpustack_runtime"]
    assert runtime["kind"] == "docker" and runtime["wired"] is True, runtime
    daemon = json.loads(sh(inventory, "cat /etc/docker/daemon.json"))
    assert daemon["log-level"] == "info" and daemon["runtimes"]["crun-x"] == {
        "path": "/usr/bin/crun"
    }
    assert daemon["runtimes"]["nvidia"]["path"] == BINARY and "default-runtime" not in daemon
    runtimes, default = loaded(inventory)
    assert runtimes["nvidia"]["path"] == BINARY and default == "runc"
    # a reload (SIGHUP), not a restart: the same dockerd process, running containers untouched
    assert sh(inventory, "systemctl show -p MainPID --value docker").strip() == pid

    # dockerd hands a container started with --runtime nvidia to that binary (the stand-in logs
    # the OCI `create`; whether the container then runs depends on the nested node's cgroups)
    sh(inventory, f": > {lab_fixtures.RUNTIME_LOG}")
    ssh(inventory, NODE, f"docker run --rm --runtime nvidia {lab_fixtures.IMAGE_REF} true")
    assert " create --bundle " in sh(inventory, f"cat {lab_fixtures.RUNTIME_LOG}")

    assert install(inventory, varsfile)["summary"]["changed"] == 0  # idempotent

    # a lost reload: daemon.json wired, the running dockerd started on a file without it
    sh(inventory, "cp /etc/docker/daemon.json /root/wired && "
       f"printf '%s' '{USER_DAEMON}' > /etc/docker/daemon.json && {RESTART} && "
       "cp /root/wired /etc/docker/daemon.json")  # fmt: skip
    assert "nvidia" not in loaded(inventory)[0]
    plan = run_cli("plan", str(inventory), "-e", f"@{varsfile}", "--output", "json")
    assert "docker: would reload" in plan.stdout, plan.stdout[-3000:]
    status = run_cli("status", str(inventory), "-e", f"@{varsfile}", "--output", "json")
    assert "docker: runtime 'nvidia' in daemon.json, not loaded by the running daemon" in (
        status.stdout
    ), status.stdout[-3000:]
    doc = install(inventory, varsfile)
    assert doc["summary"]["changed"] == 1, doc["hosts"][NODE].get("changes")
    assert loaded(inventory)[0]["nvidia"]["path"] == BINARY

    # daemon.json broken since install: uninstall refuses with a hint and leaves it and the record
    sh(inventory, "cp /etc/docker/daemon.json /root/wired && printf '{\"log-level\": ' > "
       "/etc/docker/daemon.json")  # fmt: skip
    files = "md5sum /etc/docker/daemon.json /var/lib/gpustack/container_runtime.json"
    before = sh(inventory, files)
    proc = run_cli("uninstall", str(inventory), "--components", "runtime", "--yes", "--output",
                   "json", timeout=600)  # fmt: skip
    assert proc.returncode != 0
    host = json.loads(proc.stdout)["hosts"][NODE]
    message = " ".join(f["message"] for f in host["failures"])
    assert "/etc/docker/daemon.json is not valid JSON" in message and "Hint: fix" in message
    assert host["changed"] == 0 and sh(inventory, files) == before
    sh(inventory, "cp /root/wired /etc/docker/daemon.json")

    uninstall(inventory)
    assert sh(inventory, "cat /etc/docker/daemon.json") == USER_DAEMON  # byte for byte
    runtimes, default = loaded(inventory)
    assert "nvidia" not in runtimes and "crun-x" in runtimes and default == "runc"
    assert sh(inventory, "ls /var/lib/gpustack").split().count("container_runtime.json") == 0


def test_default_runtime_on_a_daemon_json_gpustack_created(lab):
    inventory, varsfile = lab
    sh(inventory, f"rm -f /etc/docker/daemon.json && {RESTART}")
    install(inventory, varsfile, "-e", "container_runtime_nvidia_default=true")
    daemon = json.loads(sh(inventory, "cat /etc/docker/daemon.json"))
    assert daemon["default-runtime"] == "nvidia"
    runtimes, default = loaded(inventory)
    assert runtimes["nvidia"]["path"] == BINARY and default == "nvidia"

    # The toolkit alone is refused while nvidia is dockerd's default (tasks/toolkit_guard.yml's
    # Docker branch; until 2026-11-29 only its containerd and k3s branches had run).
    kept = "dpkg-query -W -f='${Version}' nvidia-container-toolkit; md5sum /etc/docker/daemon.json"
    before = sh(inventory, kept)
    proc = run_cli("uninstall", str(inventory), "--components", "toolkit", "--yes",
                   "--output", "json")  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-4000:] + proc.stderr[-2000:]
    message = json.loads(proc.stdout)["hosts"][NODE]["failures"][-1]["message"]
    assert f"nvidia is the default runtime of docker on {NODE}" in message, message
    assert "Nothing was changed" in message and "Hint:" in message
    assert sh(inventory, kept) == before and loaded(inventory)[1] == "nvidia"

    uninstall(inventory)
    assert ssh(inventory, NODE, "test -e /etc/docker/daemon.json").returncode == 1  # gone
    runtimes, default = loaded(inventory)
    assert "nvidia" not in runtimes and default == "runc"
