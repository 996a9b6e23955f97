"""Repository, key and pin files of the cuda_repo and mirror sources, rendered by Ansible.

NVIDIA's repository cannot be reached from here, so these tests stop at the rendered content
(the lab tests show the role failing cleanly at that boundary).
"""

import json

import pytest

from tests.conftest import ROOT, run_playbook

PLAYBOOK = ROOT / "tests/unit/playbooks/render_driver_repo.yml"


def render(tmp_path, os_id, version_id, arch, os_vars, **extra):
    facts = {
        "os": {"id": os_id, "version_id": version_id},
        "arch": arch,
        "kernel": "6.8.0-45-generic",
        "gpus": {"devices": [{"device_id": d} for d in extra.pop("gpus", [])]},
    }
    variables = {"gpustack_preflight": facts, "os_vars": os_vars, "out": str(tmp_path),
                 "__nvidia_driver_target": extra.pop("target", "580.95.05-1"), **extra}  # fmt: skip
    proc = run_playbook(PLAYBOOK, variables)  # filters by their collection names (conftest)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = {p.name: p.read_text() for p in tmp_path.iterdir()}
    return files, json.loads(files["derived.json"])


def test_cuda_repo_ubuntu(tmp_path):
    files, derived = render(tmp_path, "ubuntu", "22.04", "x86_64", "Ubuntu")
    url = "https://developer.download.nvidia.com/compute/cuda/repos/ubuntu2204/x86_64"
    assert f"URIs: {url}/\nSuites: /\n" in files["repo.sources"]
    assert "Signed-By: /usr/share/keyrings/gpustack-nvidia-cuda.gpg" in files["repo.sources"]
    assert derived["key_url"] == f"{url}/3bf863cc.pub"
    assert derived["fingerprint"] == "EB693B3035CD5710E231E123A4B469963BF863CC"
    assert derived["branch"] == "580" and derived["packages"] == ["cuda-drivers-580"]
    assert "Pin: version 580.95.05-1\nPin-Priority: 1001" in files["driver.pref"]
    assert "Package: nvidia-* libnvidia-* libcuda* cuda-drivers*" in files["driver.pref"]


def test_cuda_repo_debian_arm_and_open_modules(tmp_path):
    files, derived = render(tmp_path, "debian", "12", "aarch64", "Debian",
                            nvidia_driver_open_kernel_modules=True, nvidia_driver_branch="570")  # fmt: skip
    assert "/cuda/repos/debian12/sbsa/" in files["repo.sources"]
    assert derived["packages"] == ["nvidia-open-570"]


@pytest.mark.parametrize(("os_vars", "os_id", "version", "gpus", "extra", "packages", "why"), [
    # default auto: open on Hopper with a 560+ branch, proprietary on 535 or without a GPU
    ("Ubuntu", "ubuntu", "22.04", ["0x2330"], {}, ["nvidia-open-580"], "auto: branch 580"),
    ("Ubuntu", "ubuntu", "22.04", [], {}, ["cuda-drivers-580"], "auto: no NVIDIA GPU found"),
    ("Debian", "debian", "12", ["0x2330"], {"nvidia_driver_branch": "535"}, ["cuda-drivers-535"],
     "auto: branch 535"),
    ("Ubuntu", "ubuntu", "24.04", ["0x27b8"], {"nvidia_driver_source": "distro",
     "nvidia_driver_branch": "580"}, ["nvidia-headless-580-server-open", "nvidia-utils-580-server"],
     "auto: branch 580"),
    ("RedHat", "rocky", "9.4", ["0x1db4"], {}, ["cuda-drivers-580"], "auto: GPU 0x1db4"),
    ("Debian", "debian", "12", ["0x2330"], {"nvidia_driver_open_kernel_modules": False},
     ["cuda-drivers-580"], "nvidia_driver_open_kernel_modules=false"),
])  # fmt: skip
def test_open_modules_auto(tmp_path, os_vars, os_id, version, gpus, extra, packages, why):
    _, derived = render(tmp_path, os_id, version, "x86_64", os_vars, gpus=gpus, **extra)
    assert derived["packages"] == packages
    assert derived["kernel_modules"]["reason"].startswith(why)


@pytest.mark.parametrize(("madison", "packages"), [
    ("535.261.03-1", ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1"]),
    ("560.35.03-1", ["nvidia-open-kernel-dkms", "nvidia-smi", "libcuda1"]),
])  # fmt: skip
def test_open_modules_auto_on_debians_archive_decides_by_the_newest_branch(tmp_path, madison,
                                                                           packages):  # fmt: skip
    """Debian's distro driver without a requested branch: the archive's newest decides, once the
    package lists were read (both module packages are asked for then)."""
    lists = {"stdout": f"nvidia-kernel-dkms | {madison} | http://deb.debian.org/debian x/non-free\n"
                       f"nvidia-open-kernel-dkms | {madison} | http://deb.debian.org/debian x/non-free\n"}  # fmt: skip
    _, derived = render(tmp_path, "debian", "13", "x86_64", "Debian", gpus=["0x2330"],
                        nvidia_driver_source="distro", nvidia_driver_package_lists=lists)  # fmt: skip
    assert derived["packages"] == packages


def test_cuda_repo_rocky(tmp_path):
    files, derived = render(tmp_path, "rocky", "9.4", "x86_64", "RedHat")
    base = "https://developer.download.nvidia.com/compute/cuda/repos/rhel9/x86_64"
    assert f"baseurl={base}\n" in files["repo.repo"]
    assert f"gpgkey={base}/D42D0685.pub" in files["repo.repo"]
    assert "gpgcheck=1" in files["repo.repo"]
    assert derived["fingerprint"] == "D42D0685"  # key id only: see docs/variables.md


def test_mirror_uses_its_own_url_key_and_fingerprint(tmp_path):
    files, derived = render(
        tmp_path, "ubuntu", "24.04", "x86_64", "Ubuntu", nvidia_driver_source="mirror",
        nvidia_driver_mirror_url="https://mirror.corp.example/cuda/repos/",
        nvidia_driver_mirror_key_url="https://mirror.corp.example/keys/nvidia.asc",
        nvidia_driver_mirror_key_fingerprint="0123456789ABCDEF0123456789ABCDEF01234567",
    )  # fmt: skip
    assert (
        "URIs: https://mirror.corp.example/cuda/repos/ubuntu2404/x86_64/\n" in files["repo.sources"]
    )
    assert derived["key_url"] == "https://mirror.corp.example/keys/nvidia.asc"
    assert derived["fingerprint"] == "0123456789ABCDEF0123456789ABCDEF01234567"


def test_mirror_defaults_to_the_cuda_key_under_the_mirror(tmp_path):
    _, derived = render(tmp_path, "debian", "12", "x86_64", "Debian", nvidia_driver_source="mirror",
                        nvidia_driver_mirror_url="http://10.0.0.5/cuda")  # fmt: skip
    assert derived["key_url"] == "http://10.0.0.5/cuda/debian12/x86_64/3bf863cc.pub"
    assert derived["fingerprint"] == "EB693B3035CD5710E231E123A4B469963BF863CC"


@pytest.mark.parametrize(("os_vars", "os_id", "version", "packages"), [
    ("Debian", "debian", "12", ["nvidia-kernel-dkms", "nvidia-smi", "libcuda1"]),
    ("Ubuntu", "ubuntu", "22.04", ["nvidia-headless-535-server", "nvidia-utils-535-server"]),
])  # fmt: skip
def test_distro_packages(tmp_path, os_vars, os_id, version, packages):
    _, derived = render(tmp_path, os_id, version, "x86_64", os_vars, nvidia_driver_source="distro",
                        nvidia_driver_version="535.261.03-1")  # fmt: skip
    assert derived["packages"] == packages and derived["branch"] == "535"


def test_mirror_credentials_stay_out_of_the_apt_source(tmp_path):
    files, derived = render(tmp_path, "debian", "12", "x86_64", "Debian", nvidia_driver_source="mirror",
                            nvidia_driver_mirror_url="https://robot:Render%2FPW@mirror.corp/cuda/")  # fmt: skip
    assert "URIs: https://mirror.corp/cuda/debian12/x86_64/\n" in files["repo.sources"]
    assert "Render" not in files["repo.sources"] and "robot" not in files["repo.sources"]
    assert "/etc/apt/auth.conf.d/gpustack-nvidia-cuda.conf" in files["repo.sources"]
    assert derived["repo_url"] == "https://mirror.corp/cuda/debian12/x86_64"
    assert derived["key_url"] == "https://mirror.corp/cuda/debian12/x86_64/3bf863cc.pub"
    assert derived["username"] == "robot" and derived["repo_mode"] == "0600"


def test_el_mirror_credentials_go_to_a_0600_repo_file(tmp_path):
    files, derived = render(tmp_path, "rocky", "9.4", "x86_64", "RedHat", nvidia_driver_source="mirror",
                            nvidia_driver_mirror_url="https://mirror.corp/cuda",
                            nvidia_driver_mirror_username="robot", nvidia_driver_mirror_password="ElPW")  # fmt: skip
    assert "baseurl=https://mirror.corp/cuda/rhel9/x86_64\n" in files["repo.repo"]
    assert "username=robot\npassword=ElPW\n" in files["repo.repo"]
    assert derived["repo_mode"] == "0600"


def test_companions_already_at_the_drivers_release_need_no_apt_call(tmp_path):
    """`Put the installed companions at the driver's release` runs only for companions that
    dpkg shows at another version (a first install's transaction put them there already)."""
    release = "535.261.03-1"
    variables = {
        "out": str(tmp_path),
        "__nvidia_driver_companions": {
            name: release
            for name in ("libcuda1", "nvidia-smi", "libnvidia-ml1", "nvidia-suspend-common")
        },
        "__nvidia_driver_companions_installed": {
            "stdout_lines": [  # dpkg-query -f='${Package} ${Version} ${db:Status-Abbrev}\n'
                f"libcuda1 {release} ii ",
                "nvidia-smi 535.216.03-1~bpo12+1 hi ",
                f"libnvidia-ml1 {release} hi ",
                f"nvidia-suspend-common {release} un ",  # known to dpkg, not installed
            ]
        },
    }
    proc = run_playbook(ROOT / "tests/unit/playbooks/driver_companions.yml", variables)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = json.loads((tmp_path / "companions.json").read_text())
    assert found["present"] == ["libcuda1", "nvidia-smi", "libnvidia-ml1"]
    assert found["moves"] == [f"nvidia-smi={release}"]
    variables["__nvidia_driver_companions_installed"]["stdout_lines"][1] = (
        f"nvidia-smi {release} hi "
    )
    proc = run_playbook(ROOT / "tests/unit/playbooks/driver_companions.yml", variables)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "companions.json").read_text())["moves"] == []
