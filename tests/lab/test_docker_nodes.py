"""Docker nodes behind cri-dockerd on a real podman lab node: preflight reads the kubelet's CRI
endpoint and cri-dockerd's version from the node, doctor reports an old cri-dockerd, and
install refuses the host before any change.

TEST FIXTURES (labelled so on the node): no kubelet, cri-dockerd or Docker engine can be
installed here, so `/usr/local/bin/{kubelet,cri-dockerd,dockerd}` are shell scripts that only
print a version, and the kubelet's flags file is written by the test. What this proves: the
role's probe and refusal on a real systemd node over SSH. Nothing about real cri-dockerd.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import lab_nodes, run_cli
from tests.lab.test_lab import ssh

pytestmark = pytest.mark.lab

LAB = f"{os.environ.get('GPUSTACK_LAB_PREFIX', 'dk')}{os.getpid()}"
NODE = f"{LAB}-node1"
FIXTURE = "# TEST FIXTURE (gpustack tests/lab/test_docker_nodes.py): prints a version, nothing else"
REFUSAL = 'refuses RuntimeClass handler "nvidia"'


def failures(proc) -> str:
    """The failed tasks' messages of a `--output json` run."""
    host = json.loads(proc.stdout)["hosts"][NODE]
    return " | ".join(f"{f['role']}: {f['message']}" for f in host["failures"])


def _script(path: str, output: str) -> str:
    return f"printf '#!/bin/sh\\n{FIXTURE}\\necho \"{output}\"\\n' > {path} && chmod 755 {path}"


def set_cri_dockerd(inventory, version: str) -> None:
    proc = ssh(
        inventory, NODE, _script("/usr/local/bin/cri-dockerd", f"cri-dockerd {version} (fixture)")
    )
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("docker") / "docker.ini"
    with lab_nodes(LAB, 1, inventory):
        setup = " && ".join(
            [
                # Docker's containerd is real (Debian's); kubelet, cri-dockerd and dockerd are fixtures
                "apt-get update -qq",
                "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq containerd >/dev/null",
                _script("/usr/local/bin/kubelet", "Kubernetes v1.33.1"),
                _script("/usr/local/bin/dockerd", "Docker version 27.3.1, build fixture"),
                _script("/usr/local/bin/cri-dockerd", "cri-dockerd 0.3.16 (fixture)"),
                "mkdir -p /var/lib/kubelet",
                "echo 'KUBELET_KUBEADM_ARGS=\"--container-runtime-endpoint=unix:///var/run/cri-dockerd.sock "
                "--pod-infra-container-image=registry.k8s.io/pause:3.10\"' > /var/lib/kubelet/kubeadm-flags.env",
            ]
        )
        proc = ssh(inventory, NODE, setup)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield inventory


def doctor(inventory, *extra: str) -> tuple[int, dict]:
    proc = run_cli("doctor", str(inventory), "--output", "json", *extra)
    return proc.returncode, json.loads(proc.stdout)


def test_preflight_reads_the_kubelet_endpoint_and_cri_dockerd(lab):
    code, doc = doctor(lab)
    pf = doc["hosts"][NODE]["facts"]["gpustack_preflight"]
    assert pf["kubelet"]["present"] is True
    assert pf["kubelet"]["cri"] == "cri-dockerd"
    assert pf["kubelet"]["runtime_endpoint"] == "unix:///var/run/cri-dockerd.sock"
    assert pf["kubelet"]["runtime_endpoint_source"] == "/var/lib/kubelet/kubeadm-flags.env"
    assert {r["kind"] for r in pf["runtimes"]} == {"containerd", "docker"}
    # Docker's containerd next to a kubelet used to be taken for the kubelet's runtime
    assert pf["runtime"] == "docker"
    shim = pf["cri_dockerd"]
    assert shim["version"] == "0.3.16"
    assert shim["serves_kubelet"] is True and shim["runtime_handlers"] is False
    errors = [p for p in doc["problems"] if p["severity"] == "error"]
    assert len(errors) == 1 and "cri-dockerd 0.3.16" in errors[0]["message"], doc["problems"]
    assert "container_runtime_nvidia_default=true" in errors[0]["hint"]
    assert code == 3


def test_install_refuses_the_host_before_any_change(lab):
    before = ssh(
        lab, NODE, "ls -R /etc/apt /etc/modprobe.d /etc/containerd; dpkg -l | md5sum"
    ).stdout
    proc = run_cli("install", str(lab), "--output", "json", timeout=1800)
    assert proc.returncode != 0
    doc = json.loads(proc.stdout)
    host = doc["hosts"][NODE]
    assert host["status"] == "failed" and host["changed"] == 0, host
    assert failures(proc).startswith("gpu_preflight: ") and REFUSAL in failures(proc)
    assert "Nothing was changed" in failures(proc) and "Hint: upgrade cri-dockerd" in failures(proc)
    after = ssh(
        lab, NODE, "ls -R /etc/apt /etc/modprobe.d /etc/containerd; dpkg -l | md5sum"
    ).stdout
    assert after == before


def test_no_runtime_class_lets_an_old_cri_dockerd_through(lab):
    code, doc = doctor(lab, "-e", "gpustack_k8s_runtime_class=")
    assert [p for p in doc["problems"] if p["severity"] == "error"] == []
    assert code == 0
    proc = run_cli("install", str(lab), "--check", "--tags", "gpu_preflight",
                   "-e", "gpustack_k8s_runtime_class=", "--output", "json")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert failures(proc) == ""


def test_cri_dockerd_0_4_runs_runtime_class_handlers(lab):
    proc = run_cli("install", str(lab), "--check", "--tags", "gpu_preflight", "--output", "json")
    assert proc.returncode != 0 and REFUSAL in failures(proc)  # still 0.3.16: refused
    set_cri_dockerd(lab, "0.4.1")
    code, doc = doctor(lab)
    shim = doc["hosts"][NODE]["facts"]["gpustack_preflight"]["cri_dockerd"]
    assert shim["version"] == "0.4.1" and shim["runtime_handlers"] is True
    assert [p for p in doc["problems"] if p["severity"] == "error"] == [] and code == 0
    proc = run_cli("install", str(lab), "--check", "--tags", "gpu_preflight", "--output", "json")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
