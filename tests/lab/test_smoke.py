"""The offline path for GPU hosts, for real: a wheelhouse built here, installed with networking
denied (`unshare -n`, a fresh network namespace with only a loopback), and `gpu-smoke.sh`
(gpustack smoke --local) run inside a lab node that way, before and after `gpustack install`.

Lab nodes have no GPU: the suite must say "no NVIDIA device" and never pass what is absent.
After the install the node carries Debian's real NVIDIA driver packages (nvidia-smi included)
and the lab's toolkit (tests/fixtures/lab_fixtures.py): NVIDIA's nvidia-container-runtime and
nvidia-ctk built from their Go module, libnvidia-container's nvidia-container-cli a stand-in.
Nothing may change on the node while the smoke suite runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, lab_nodes, run_cli
from tests.fixtures import lab_fixtures
from tests.lab.test_lab import ssh

pytestmark = pytest.mark.lab

LAB = f"i14smoke{os.getpid()}"
NODE = f"{LAB}-node1"
CONTAINER = f"gpustack-{NODE}"
WHEELHOUSE_IN_NODE = "/root/wheelhouse"
# Everything a read-only run must leave as it was: packages, /etc, containerd's state, CDI specs.
SNAPSHOT = (
    "dpkg-query -W -f='${Package} ${Version} ${db:Status-Abbrev}\\n'; "
    "find /etc -xdev -type f -print0 | sort -z | xargs -0 md5sum; ls -la /etc/cdi /var/run/cdi 2>&1; "
    "systemctl is-active containerd 2>&1; "
    "(ctr namespaces ls -q 2>/dev/null | while read ns; do ctr -n $ns containers ls -q; done) 2>&1"
)
LEFTOVERS = "ls -d /tmp/gpustack-smoke-* /root/gpustack-smoke-* 2>/dev/null | wc -l"


def podman(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    """Built once with the real script (the only step that uses the network: PyPI)."""
    dest = tmp_path_factory.mktemp("wh") / "wheelhouse"
    proc = subprocess.run([str(ROOT / "scripts/wheelhouse.sh"), "--dest", str(dest)],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHON": sys.executable})  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = {p.name for p in dest.iterdir()}
    assert {"gpu-smoke.sh", "requirements.txt", "SHA256SUMS", "README.txt"} <= names
    assert any(n.startswith("gpu_node_stack-") for n in names) and any(
        n.startswith("pip-") for n in names
    )
    # pinned by the constraints CI tested for this Python (constraints/pyX.Y.txt)
    pins = (ROOT / f"constraints/py{sys.version_info[0]}.{sys.version_info[1]}.txt").read_text()
    core = next(line for line in pins.splitlines() if line.startswith("ansible-core=="))
    assert core.replace("-", "_") in (dest / "requirements.txt").read_text().splitlines()
    return dest


def offline(*argv: str, cwd=None) -> subprocess.CompletedProcess:
    """Run argv in a new network namespace, without the machine's pip configuration."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "HOME": str(cwd), "PIP_CONFIG_FILE": "/dev/null",
           "GPUSTACK_STATE_DIR": str(cwd / "state")}  # fmt: skip
    return subprocess.run(["unshare", "-n", *argv], capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=600)  # fmt: skip


def test_wheelhouse_round_trip_with_networking_denied(wheelhouse, tmp_path):
    probe = offline(sys.executable, "-c", "import socket; socket.create_connection(('pypi.org', 443), 3)",
                    cwd=tmp_path)  # fmt: skip
    assert probe.returncode != 0, "the namespace must have no network"
    venv = tmp_path / "venv"
    assert (
        offline("python3", "-m", "venv", "--without-pip", str(venv), cwd=tmp_path).returncode == 0
    )
    pip = next(wheelhouse.glob("pip-*.whl"))
    empty = tmp_path / "empty"
    empty.mkdir()
    control = offline(str(venv / "bin/python"), f"{pip}/pip", "install", "--isolated", "--no-index",
                      "--find-links", str(empty), "gpu-node-stack", cwd=tmp_path)  # fmt: skip
    assert control.returncode != 0, "without the wheelhouse nothing may be installable"
    proc = offline(str(venv / "bin/python"), f"{pip}/pip", "install", "--isolated", "--no-index",
                   "--find-links", str(wheelhouse), "gpu-node-stack", cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    version = offline(str(venv / "bin/gpustack"), "--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.startswith("gpustack "), version.stderr
    doctor = offline(str(venv / "bin/gpustack"), "doctor", "--local", "-o", "json", cwd=tmp_path)
    assert doctor.returncode == 0, doctor.stderr
    facts = json.loads(doctor.stdout)["hosts"]["localhost"]["facts"]["gpustack_preflight"]
    assert facts["gpus"]["count"] == 0
    installed = (venv / "lib").glob("python3*/site-packages/gpustack/_content/roles/gpu_smoke")
    assert list(installed), "the wheel carries the roles"


@pytest.fixture(scope="module")
def lab(tmp_path_factory, wheelhouse):
    inventory = tmp_path_factory.mktemp("i14") / "i14.ini"
    with lab_nodes(LAB, 1, inventory):
        podman("exec", CONTAINER, "rm", "-rf", WHEELHOUSE_IN_NODE)
        copied = podman("cp", str(wheelhouse), f"{CONTAINER}:{WHEELHOUSE_IN_NODE}")
        assert copied.returncode == 0, copied.stderr
        yield inventory


def smoke_in_node(inventory, *args: str) -> tuple[int, dict, str]:
    """gpu-smoke.sh in the node, in a network namespace of its own (no network at all)."""
    before = ssh(inventory, NODE, SNAPSHOT).stdout
    proc = podman("exec", CONTAINER, "unshare", "-n", "sh", "-c",
                  "grep -c : /proc/net/dev; "  # interfaces seen by the run: lo only
                  f"{WHEELHOUSE_IN_NODE}/gpu-smoke.sh -o json --report /root/smoke.json "
                  + " ".join(args))  # fmt: skip
    lines = proc.stdout.split("\n", 1)
    assert lines[0].strip() == "1", "the smoke run must see only the loopback interface"
    doc = json.loads(lines[1])
    assert ssh(inventory, NODE, SNAPSHOT).stdout == before, "the smoke suite changed the node"
    assert ssh(inventory, NODE, LEFTOVERS).stdout.strip() == "0", "temporary venv or CDI dir left"
    return proc.returncode, doc, proc.stderr


def statuses(smoke: dict) -> dict:
    return {c["name"]: c for c in smoke["checks"]}


def test_bare_node_offline_says_no_nvidia_device(lab):
    rc, doc, err = smoke_in_node(lab, "--capture", "/root/cap")
    assert rc == 3, err
    assert "Installing gpustack from /root/wheelhouse" in err
    smoke = doc["smoke"]["localhost"]
    assert smoke["verdict"] == "no NVIDIA device"
    assert smoke["summary"] == "no NVIDIA device; no NVIDIA driver installed"
    checks = statuses(smoke)
    for name in (
        "gpu_pci",
        "driver_package",
        "driver_loaded",
        "nvidia_smi",
        "toolkit",
        "cdi",
        "runtime_config",
    ):
        assert checks[name]["status"] == "absent", (name, checks[name])
    assert [n for n, c in checks.items() if c["status"] == "pass"] == ["nouveau"]
    assert checks["container"]["status"] == "skipped"
    assert doc["hosts"]["localhost"]["changed"] == 0
    report = json.loads(podman("exec", CONTAINER, "cat", "/root/smoke.json").stdout)
    assert report["smoke"] == doc["smoke"]
    listing = podman("exec", CONTAINER, "sh", "-c", "ls /root/cap/*/").stdout.split()
    assert "COMMANDS.md" in listing and "smoke-report.json" in listing


def test_after_install_the_real_driver_packages_report_not_loaded(lab):
    """Debian's nvidia-driver and nvidia-smi (real NVIDIA binaries from non-free), NVIDIA's
    toolkit built from source (the stand-in nvidia-container-cli beside it), containerd wired by
    gpustack install."""
    varsfile = lab_fixtures.prepare([CONTAINER], lab.with_suffix(".vars.json"))
    proc = run_cli("install", str(lab), "-e", f"@{varsfile}", "-e", "nvidia_driver_source=distro",
                   "--output", "json", timeout=1800)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    log_before = ssh(lab, NODE, f"cat {lab_fixtures.RUNTIME_LOG}").stdout

    rc, doc, err = smoke_in_node(
        lab, "-e", "gpu_smoke_snapshotter=native", "--image", lab_fixtures.IMAGE_REF
    )
    assert rc == 3, err
    smoke = doc["smoke"]["localhost"]
    assert smoke["verdict"] == "no NVIDIA device"
    assert smoke["summary"].startswith(
        "driver installed, not loaded: no NVIDIA device (package 535."
    )
    checks = statuses(smoke)
    assert checks["driver_package"]["status"] == "pass"
    assert checks["driver_loaded"]["status"] == "absent"
    assert checks["driver_loaded"]["summary"] == "driver installed, not loaded: no NVIDIA device"
    smi = checks["nvidia_smi"]
    assert smi["status"] == "absent" and smi["summary"].startswith("exit 9: "), smi
    assert "couldn't communicate with the NVIDIA driver" in smi["summary"]
    assert checks["runtime_config"]["status"] == "pass", checks["runtime_config"]
    # The smoke container asks for every GPU (NVIDIA_VISIBLE_DEVICES=all). NVIDIA's runtime, in
    # its auto mode (jit-cdi), generates a CDI spec for them, which needs NVML: with the driver
    # not loaded it refuses the container. Never a pass without a GPU.
    container = checks["container"]
    assert container["status"] == "absent" and container["detail"]["started"] is False, container
    assert container["detail"]["image"] == lab_fixtures.IMAGE_REF
    assert "failed to create the automatic CDI modifier" in container["summary"], container
    log_after = ssh(lab, NODE, f"cat {lab_fixtures.RUNTIME_LOG}").stdout[len(log_before) :]
    assert "gpustack-smoke-" in log_after, "ctr must start the container through the nvidia runtime"
    assert "failed to initialize NVML: Driver Not Loaded" in log_after
    # NVIDIA's tools answer with their versions; the stand-in CLI (libnvidia-container is not
    # built here) is flagged; CDI generation fails for want of a loaded driver, and says so.
    toolkit = checks["toolkit"]
    assert toolkit["status"] == "fail", toolkit
    assert "nvidia-container-runtime 1.20.2" in toolkit["summary"], toolkit
    assert "gpustackbuilt" in toolkit["summary"], toolkit
    assert "nvidia-container-cli --version failed" in toolkit["summary"], toolkit
    cdi = checks["cdi"]
    assert cdi["status"] == "absent", cdi
    assert cdi["summary"].startswith("nvidia-ctk cdi generate: exit 1: failed to generate CDI"), cdi
    assert cdi["summary"].endswith("failed to initialize NVML: Driver Not Loaded"), cdi
    probe = doc["hosts"]["localhost"]["facts"]["gpustack_smoke"]
    assert probe["tools"]["nvidia-smi"] == "/usr/bin/nvidia-smi"
    assert probe["container"]["image_choice"] == "given"


def test_wheelhouse_for_another_python_and_architecture(tmp_path):
    """Cross-target: CPython 3.12 on aarch64 from this x86_64 machine; the script's own offline
    check resolves gpustack for that target from the wheelhouse alone."""
    dest = tmp_path / "wh"
    proc = subprocess.run([str(ROOT / "scripts/wheelhouse.sh"), "--dest", str(dest), "--python-version",
                           "3.12", "--arch", "aarch64"], capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHON": sys.executable})  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    binary = [p.name for p in dest.glob("*.whl") if not p.name.endswith("-none-any.whl")]
    assert binary, "some dependencies are platform wheels"
    for name in binary:
        assert "aarch64" in name and ("cp312" in name or "abi3" in name), name
