"""The gpu_smoke module's own decisions (loaded from the role as Ansible ships it): which image
the container check uses and why it is skipped. Its commands run for real in
tests/unit/test_smoke_local.py (this machine) and tests/lab/test_smoke.py (lab nodes)."""

import pytest

from tests.unit.host_modules import load

mod = load("plugins/modules/gpustack_smoke_probe.py", "gpustack_smoke_probe")

IMAGES = {
    "k8s.io": ["registry.k8s.io/pause:3.9", "nvcr.io/nvidia/k8s-device-plugin:v0.20.0",
               "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04"],
    "default": ["docker.io/library/ubuntu:24.04"],
}  # fmt: skip


def test_given_image_is_used_only_when_it_is_local():
    assert mod.choose_image("docker.io/library/ubuntu:24.04", IMAGES) == (
        "default", "docker.io/library/ubuntu:24.04", "given")  # fmt: skip
    assert mod.choose_image("library/ubuntu:24.04", IMAGES)[1] == "docker.io/library/ubuntu:24.04"
    assert mod.choose_image("ubuntu:22.04", IMAGES) == (None, None, "given")
    assert mod.choose_image("buntu:24.04", IMAGES) == (None, None, "given"), "no partial names"


def test_without_a_given_image_only_a_cuda_image_is_picked():
    assert mod.choose_image("", IMAGES) == (
        "k8s.io", "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04", "picked: a local CUDA image")  # fmt: skip
    no_cuda = {"k8s.io": ["registry.k8s.io/pause:3.9"]}
    assert mod.choose_image("", no_cuda) == (None, None, "none"), "pause has no shell: never picked"


class FakeModule:
    """Just enough of AnsibleModule for Probe: no tool is installed, nothing is run."""

    def __init__(self, **params):
        self.params = {"runtime_kind": "", "nvidia_binary": "/nonexistent/nvidia-container-runtime",
                       "nvidia_name": "nvidia", "image": "", "snapshotter": "", "ctr_args": [],
                       "timeout": 5, "cdi": True, **params}  # fmt: skip

    def get_bin_path(self, name, opt_dirs=None):
        return None

    def run_command(self, *args, **kwargs):
        raise AssertionError("nothing may run when no tool exists")


@pytest.mark.parametrize(
    ("kind", "image", "reason"),
    [
        ("", "", "no container runtime"),
        ("containerd", "", "containerd runs but ctr is not installed"),
        ("docker", "", "dockerd runs but the docker CLI is not installed"),
        ("crio", "", "no standalone container check for crio"),
        ("k3s", "", "no standalone container check for k3s"),
        ("containerd", "none", "disabled (image none)"),
    ],
)
def test_container_check_skip_reasons(kind, image, reason):
    probe = mod.Probe(FakeModule(runtime_kind=kind, image=image))
    assert mod.container(probe, kind)["skipped"].startswith(reason)


def test_absent_tools_give_none_not_empty_results():
    probe = mod.Probe(FakeModule())
    assert mod.nvidia_smi(probe) is None and mod.lspci(probe) is None
    assert mod.cdi(probe) is None and mod.fabric_manager(probe) is None
    assert mod.toolkit(probe) == dict.fromkeys(
        [
            "nvidia-ctk",
            "nvidia-container-runtime",
            "nvidia-container-cli",
            "nvidia-container-cli info",
        ]
    )
