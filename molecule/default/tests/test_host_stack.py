"""The host stack after `molecule converge` (playbooks/site.yml) on debian12, debian13, forky.

Lab nodes have no GPU: the driver is installed, pinned and held but cannot load. The toolkit
packages are the TEST FIXTURE stand-ins of tests/fixtures/lab_fixtures.py.
"""

from __future__ import annotations

import re
import shlex
import shutil
import time

from conftest import (
    DRIVER_PACKAGES,
    NVIDIA_BINARY,
    TOOLKIT_PACKAGES,
    USER_MARK,
    containerd_dump,
    cri_sections,
    lab_fixtures,
    run_ok,
)


def installed_version(host, package: str) -> str:
    pkg = host.package(package)
    assert pkg.is_installed, f"{package} is not installed"
    return pkg.version


def available_versions(host, package: str) -> list[str]:
    """Versions the archive offers (apt-cache madison), newest first."""
    out = run_ok(host, f"apt-cache madison {package}")
    return [line.split("|")[1].strip() for line in out.splitlines() if "|" in line]


def test_driver_packages_at_the_version_the_scenario_asked_for(host, hostvars):
    versions = {pkg: installed_version(host, pkg) for pkg in DRIVER_PACKAGES}
    assert len(set(versions.values())) == 1, versions  # one driver, not a mix
    version = versions["nvidia-smi"]
    if hostvars.get("nvidia_driver_version"):
        assert version == hostvars["nvidia_driver_version"]
        # ... which is not simply the newest: bookworm-updates carries a newer 535.
        assert available_versions(host, "nvidia-smi")[0] != version
    else:
        branch = hostvars["nvidia_driver_branch"]
        offered = [v for v in available_versions(host, "nvidia-smi") if v.startswith(branch + ".")]
        assert offered, f"the archive offers no {branch} driver"
        assert version == offered[0], f"newest of branch {branch} is {offered[0]}"


def test_driver_is_pinned_and_held(host):
    version = installed_version(host, "nvidia-smi")
    pin = host.file("/etc/apt/preferences.d/gpustack-nvidia-driver.pref")
    assert f"Pin: version {version}" in pin.content_string
    assert "Pin-Priority: 1001" in pin.content_string
    holds = set(run_ok(host, "apt-mark showhold").split())
    assert set(DRIVER_PACKAGES) <= holds, holds
    # apt's own view: the pinned version is the candidate, and an upgrade moves no driver package.
    policy = run_ok(host, "apt-cache policy nvidia-smi")
    assert re.search(rf"Candidate: {re.escape(version)}$", policy, re.M), policy
    simulated = run_ok(host, "apt-get -s -o Debug::NoLocking=1 dist-upgrade")
    upgraded = {line.split()[1] for line in simulated.splitlines() if line.startswith("Inst ")}
    assert not upgraded & set(DRIVER_PACKAGES + TOOLKIT_PACKAGES), upgraded


def test_toolkit_packages_newest_version_pinned_and_held(host):
    # prepare publishes the toolkit built from NVIDIA's Go module (the newest) where Go is here,
    # the stand-ins only where it is not (tests/fixtures/lab_fixtures.py main)
    newest = lab_fixtures.BUILT_VERSION if shutil.which("go") else lab_fixtures.VERSIONS[-1]
    for pkg in TOOLKIT_PACKAGES:
        assert installed_version(host, pkg) == newest, pkg
    holds = set(run_ok(host, "apt-mark showhold").split())
    assert set(TOOLKIT_PACKAGES) <= holds, holds
    pin = host.file("/etc/apt/preferences.d/gpustack-nvidia-container-toolkit.pref")
    assert f"Pin: version {newest}" in pin.content_string
    assert host.file(NVIDIA_BINARY).mode & 0o111


def test_nouveau_is_blacklisted(host):
    conf = host.file("/etc/modprobe.d/gpustack-blacklist-nouveau.conf")
    assert conf.exists and conf.mode == 0o644
    assert "blacklist nouveau" in conf.content_string.splitlines()
    assert "options nouveau modeset=0" in conf.content_string.splitlines()
    # kmod's effective configuration, not just the file.
    config = run_ok(host, "modprobe --showconfig").splitlines()
    assert "blacklist nouveau" in config
    assert "options nouveau modeset=0" in config


def test_containerd_effective_config_has_nvidia_and_keeps_user_settings(host):
    dump = containerd_dump(host)
    runtime_plugin, images = cri_sections(dump)
    runtimes = runtime_plugin["containerd"]["runtimes"]
    nvidia = runtimes["nvidia"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"]["BinaryName"] == NVIDIA_BINARY
    assert nvidia["options"]["SystemdCgroup"] is True  # copied from the user's runc entry
    # The user's settings from prepare survive, runc included.
    assert runtimes["runc"]["runtime_type"] == "io.containerd.runc.v2"
    assert runtimes["runc"]["options"]["SystemdCgroup"] is True
    assert images["max_concurrent_downloads"] == 7
    if dump["version"] >= 3:
        assert images["pinned_images"]["sandbox"] == "registry.k8s.io/pause:3.9"
    else:
        assert runtime_plugin["sandbox_image"] == "registry.k8s.io/pause:3.9"
    # The nvidia runtime is not made the default (pods opt in with RuntimeClass nvidia).
    assert runtime_plugin["containerd"].get("default_runtime_name", "runc") == "runc"


def test_user_config_file_kept_and_drop_in_imported(host):
    config = host.file("/etc/containerd/config.toml").content_string
    assert config.splitlines()[0] == USER_MARK
    assert re.search(r"""^imports = \[.*["']/etc/containerd/conf\.d/\*\.toml["']""", config, re.M)
    dropin = host.file("/etc/containerd/conf.d/99-nvidia.toml")
    assert dropin.exists and NVIDIA_BINARY in dropin.content_string


def test_container_runs_through_the_nvidia_runtime(host, fixture_vars):
    """As the container_runtime role's verify does: ctr run with the NVIDIA runtime binary.
    The runtime logs each call (its debug setting), so the log proves it was really invoked."""
    name = f"molecule-verify-{host.backend.get_hostname()}-{time.monotonic_ns()}"
    log = lab_fixtures.RUNTIME_LOG
    command = [
        "ctr", "--namespace", "gpustack", "run", "--rm",
        "--snapshotter", fixture_vars["container_runtime_verify_snapshotter"],
        "--runc-binary", NVIDIA_BINARY,
        *fixture_vars["container_runtime_verify_ctr_args"],
        fixture_vars["container_runtime_verify_image"], name,
        "/bin/sh", "-c", "echo molecule-runtime-ok",
    ]  # fmt: skip
    result = host.run(shlex.join(command))
    assert result.rc == 0, result.stderr
    assert result.stdout.strip() == "molecule-runtime-ok"
    calls = host.file(log).content_string
    assert re.search(rf" create .*{re.escape(name)}", calls), calls[-2000:]


def test_services(host):
    assert host.service("containerd").is_running
    assert host.service("containerd").is_enabled
    # nvidia-persistenced is enabled (it starts at boot where a GPU is present), but it cannot
    # run here: lab nodes have no NVIDIA device, so the daemon exits at start.
    persistenced = host.service("nvidia-persistenced")
    assert persistenced.is_enabled
    assert not persistenced.is_running
    assert not host.file("/dev/nvidiactl").exists


def test_no_gpu_reported_honestly(host):
    # nvidia-smi is installed but cannot reach a driver (exit 9 on Debian's build).
    result = host.run("nvidia-smi")
    assert result.rc != 0
    assert not host.file("/proc/driver/nvidia/version").exists
