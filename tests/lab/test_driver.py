"""nvidia_driver on real lab nodes: real apt, real Debian non-free packages, no GPU.

Debian 12 offers 535.261.03-1 (bookworm) and 535.309.01-0+deb12u1 (bookworm-updates/security),
which give a real upgrade and downgrade path. DKMS builds nothing here (no headers for the
build machine's kernel) and nvidia-smi cannot reach a driver: the role must say so.
"""

from __future__ import annotations

import base64
import json
import os

import pytest

from tests.conftest import ROOT, lab_nodes, run_cli
from tests.lab.test_lab import PACKAGES_AND_SOURCES as SNAPSHOT
from tests.lab.test_lab import ssh

pytestmark = pytest.mark.lab

LAB = f"drv{os.getpid()}"
OLD, NEW = "535.261.03-1", "535.309.01-0+deb12u1"
# Only the driver role (preflight always runs): the toolkit and runtime have their own suite.
DISTRO = ("-e", "nvidia_driver_source=distro", "--tags", "nvidia_driver")
RECORDED: dict[str, str] = {}  # state handed from the install test to the uninstall test


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("drv") / "drv.ini"
    with lab_nodes(LAB, 2, inventory):
        yield inventory


def nodes():
    return [f"{LAB}-node1", f"{LAB}-node2"]


def install(inventory, *args) -> dict:
    proc = run_cli("install", str(inventory), *DISTRO, *args, "--output", "json")
    doc = json.loads(proc.stdout)
    doc["rc"] = proc.returncode
    return doc


def driver(doc, host):
    return doc["hosts"][host]["facts"]["gpustack_driver"]


def test_check_mode_on_fresh_nodes_changes_nothing(lab):
    before = {n: ssh(lab, n, SNAPSHOT).stdout for n in nodes()}
    proc = run_cli("plan", str(lab), *DISTRO, "-e", f"nvidia_driver_version={OLD}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the archive components the refresh call would enable, as the file they change
    assert "/etc/apt/sources.list.d/debian.sources" in proc.stdout, proc.stdout
    assert {n: ssh(lab, n, SNAPSHOT).stdout for n in nodes()} == before


# The loaded driver of the H100 lent on 2026-11-23 (machine image, no package), as its
# /proc/driver/nvidia/version read. A tmpfs over the node's /proc/driver stands in for the module:
# it proves the role's decision on what the probe reads, nothing about a loaded driver.
REAL_NVRM = (
    ROOT / "tests/fixtures/real-gpu/2026-11-23-h100-80gb-hbm3/proc-driver-nvidia-version.txt"
)
FAKE_LOADED = (
    "mount -t tmpfs gpustack-test-nvrm /proc/driver && mkdir /proc/driver/nvidia && "
    "cat > /proc/driver/nvidia/version"
)


STATE_DIR = "; test -d /var/lib/gpustack && echo state-dir || echo no-state-dir"


def full_install(inventory, host, *args) -> dict:
    """The whole play, as `gpustack install` runs it without --tags."""
    proc = run_cli("install", str(inventory), "--limit", host, "-e", "nvidia_driver_source=distro",
                   *args, "--output", "json")  # fmt: skip
    doc = json.loads(proc.stdout)
    doc["rc"] = proc.returncode
    return doc


def test_a_preinstalled_driver_stops_install_or_is_kept(lab):
    host = nodes()[0]
    text = REAL_NVRM.read_text()
    assert "'" not in text
    assert ssh(lab, host, f"{FAKE_LOADED} <<'EOF'\n{text}EOF").returncode == 0
    try:
        before = ssh(lab, host, SNAPSHOT + STATE_DIR).stdout
        assert before.endswith("no-state-dir\n")  # fresh node: the removal below is exercised
        doc = install(lab, "--limit", host)
        assert doc["rc"] != 0
        message = doc["hosts"][host]["failures"][-1]["message"]
        assert "580.159.04 is loaded" in message and "no driver package provides it" in message
        assert "Hint: set nvidia_driver_preinstalled=keep" in message
        assert ssh(lab, host, SNAPSHOT + STATE_DIR).stdout == before  # nothing changed

        # Without --tags the refusal still comes first. On a real H100 with an unpackaged driver
        # (2026-11-27) the toolkit's resolve ran before it and created gpustack's state directory
        # (with network it would have written the toolkit's repository source too).
        doc = full_install(lab, host)
        assert doc["rc"] != 0
        failures = doc["hosts"][host]["failures"]
        assert "no driver package provides it" in failures[-1]["message"], failures
        assert doc["hosts"][host]["changed"] == 0
        assert ssh(lab, host, SNAPSHOT + STATE_DIR).stdout == before

        # Driver kept, the toolkit's key out of reach: the state directory that the fetch
        # needed is removed again, so "Nothing was changed" holds (it stayed behind before).
        doc = full_install(lab, host, "-e", "nvidia_driver_preinstalled=keep",
                           "-e", "nvidia_container_toolkit_key_url=http://127.0.0.1:9/gpgkey")  # fmt: skip
        assert doc["rc"] == 1
        message = doc["hosts"][host]["failures"][-1]["message"]
        assert "cannot fetch the signing key from http://127.0.0.1:9/gpgkey" in message, message
        assert "Nothing was changed" in message
        assert ssh(lab, host, SNAPSHOT + STATE_DIR).stdout == before
        status = json.loads(run_cli("status", str(lab), "--limit", host, "-o", "json").stdout)
        assert any("loaded without a driver package" in d for d in status["drift"][host])

        kept = install(lab, "--limit", host, "-e", "nvidia_driver_preinstalled=keep")
        assert kept["rc"] == 0, kept["hosts"][host].get("failures")
        state = driver(kept, host)["state"]
        assert state == "loaded 580.159.04 (preinstalled: no driver package, left alone)", state
        assert ssh(lab, host, SNAPSHOT + STATE_DIR).stdout == before  # no source, package, pin
        status = json.loads(run_cli("status", str(lab), "--limit", host, "-o", "json",
                                    "-e", "nvidia_driver_preinstalled=keep").stdout)  # fmt: skip
        # no GPU here and none required: what is not installed is a note, the kept driver no drift
        assert not [d for d in status["drift"].get(host, []) if d.startswith("driver")]
    finally:
        ssh(lab, host, "umount /proc/driver")


def test_unknown_version_fails_and_rolls_sources_back(lab):
    before = ssh(lab, nodes()[0], SNAPSHOT).stdout
    doc = install(lab, "-e", "nvidia_driver_version=535.999.99-1", "--limit", nodes()[0])
    assert doc["rc"] == 1
    message = doc["hosts"][nodes()[0]]["failures"][-1]["message"]
    assert (
        "Resolve the exact version to install: NVIDIA driver version 535.999.99-1 is not available from source 'distro'"
        in message
    )
    assert f"available: {NEW}, {OLD}" in message
    assert ssh(lab, nodes()[0], SNAPSHOT).stdout == before


def test_install_pins_holds_and_is_idempotent(lab):
    packages_before = ssh(lab, nodes()[0], "dpkg-query -W -f='${Package}\\n' | sort").stdout
    doc = install(lab, "-e", f"nvidia_driver_version={OLD}")
    assert doc["rc"] == 0, doc
    for host in nodes():
        facts = driver(doc, host)
        assert facts["installed_version"] == OLD
        assert facts["held"] is True
        assert facts["state"] == "installed, not loaded: no NVIDIA device"
        # the default auto: no GPU here, so nvidia-installer's choice, proprietary
        assert facts["kernel_modules"] == "proprietary", facts["kernel_modules_reason"]
        assert facts["kernel_modules_reason"].startswith("auto: no NVIDIA GPU found")
        assert facts["nvidia_smi"]["rc"] != 0 and facts["gpus"] == []
        holds = ssh(lab, host, "apt-mark showhold").stdout.split()
        assert {"nvidia-kernel-dkms", "nvidia-smi", "libcuda1"} <= set(holds)
        pin = ssh(lab, host, "cat /etc/apt/preferences.d/gpustack-nvidia-driver.pref").stdout
        assert f"Pin: version {OLD}" in pin and "Pin-Priority: 1001" in pin
        assert (
            "blacklist nouveau"
            in ssh(lab, host, "cat /etc/modprobe.d/gpustack-blacklist-nouveau.conf").stdout
        )
        # nvidia-persistenced is enabled, and nothing tried to start it: not its package scripts
        # (a runtime mask covered the transaction; their start without a GPU can hang 90 s) and
        # not the role (no GPU here). The mask is gone.
        unit = "nvidia-persistenced.service"
        assert ssh(lab, host, f"systemctl is-enabled {unit}").stdout.strip() == "enabled"
        starts = ssh(lab, host, f"journalctl --no-pager -q -o cat -u {unit}").stdout
        assert "Starting" not in starts, starts
        # systemd itself no longer runs it as masked: the mask (set without systemd's reload on
        # a first install) was lifted and systemd reloaded once, in the enable step
        state = ssh(lab, host, f"systemctl show --property=LoadState --value {unit}").stdout
        assert state.strip() == "loaded", state
    again = install(lab, "-e", f"nvidia_driver_version={OLD}")
    assert again["rc"] == 0
    assert {h: v["changed"] for h, v in again["hosts"].items()} == dict.fromkeys(nodes(), 0)
    RECORDED["packages_before"] = packages_before


def test_apt_upgrade_does_not_move_the_driver(lab):
    host = nodes()[0]
    proc = ssh(lab, host, "DEBIAN_FRONTEND=noninteractive apt-get -y -q upgrade >/dev/null; "
                          "dpkg-query -W -f='${Version}' nvidia-smi libnvidia-ml1")  # fmt: skip
    assert proc.stdout == OLD + OLD, proc.stdout + proc.stderr


def test_status_and_doctor_show_no_device(lab):
    # This lab installs the driver role only, on nodes without a GPU where none is required
    # (gpustack_require_gpu=false): doctor calls that expected, and status agrees: the missing
    # toolkit is a note, not drift (exit 0); the installed driver is checked as on any host.
    proc = run_cli("status", str(lab))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "No drift on 2 node(s)." in proc.stdout
    doctor = run_cli("doctor", str(lab))
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "driver installed, not loaded: no NVIDIA device" in doctor.stdout, doctor.stdout
    assert "expected on lab or CPU nodes" in doctor.stdout
    doc = json.loads(run_cli("status", str(lab), "--output", "json").stdout)
    assert doc["drift"] == {}
    for host in nodes():
        node = doc["nodes"][host]
        assert node["driver"]["state"] == f"installed {OLD}, not loaded: no NVIDIA device"
        assert node["notes"][0].endswith("toolkit not installed"), node["notes"]
    # A GPU required: the same nodes drift (the toolkit) and doctor fails (no device).
    required = ("-e", "gpustack_require_gpu=true")
    assert run_cli("status", str(lab), *required).returncode == 5
    assert run_cli("doctor", str(lab), *required).returncode == 3


def test_a_mask_left_by_a_stopped_run_is_drift_and_install_lifts_it(lab):
    # what a run killed inside the driver's apt transaction leaves (benchmarks/kill_rerun.py)
    host = nodes()[0]
    ssh(lab, host, "systemctl mask --runtime nvidia-persistenced.service")
    doc = json.loads(run_cli("status", str(lab), "--output", "json").stdout)
    assert (
        "nvidia-persistenced masked-runtime: install enables it"
        " (left by a run stopped in the driver's apt transaction)"
    ) in doc["drift"][host], doc["drift"][host]
    assert install(lab, "-e", f"nvidia_driver_version={OLD}")["rc"] == 0  # fast path sees it too
    unit = "nvidia-persistenced.service"
    assert ssh(lab, host, f"systemctl is-enabled {unit}").stdout.strip() == "enabled"
    # Disabled by hand: drift against the driver's stamp (its unit states), so install runs the
    # full play on the host and its enable task enables the unit again.
    ssh(lab, host, f"systemctl disable {unit}")
    doc = install(lab, "-e", f"nvidia_driver_version={OLD}")
    assert doc["rc"] == 0 and doc["hosts"][host]["changed"] > 0, doc
    assert ssh(lab, host, f"systemctl is-enabled {unit}").stdout.strip() == "enabled"


def test_required_gpu_fails_the_host(lab):
    doc = install(lab, "-e", f"nvidia_driver_version={OLD}", "-e", "gpustack_require_gpu=true",
                  "--limit", nodes()[0])  # fmt: skip
    assert doc["rc"] == 1
    message = doc["hosts"][nodes()[0]]["failures"][-1]["message"]
    # Lab nodes have no headers for their kernel, so the role stops there, before installing.
    assert "No kernel headers for the running kernel" in message, message


def test_cuda_repo_is_tried_and_fails_cleanly_at_the_network_boundary(lab):
    """NVIDIA's repository is unreachable here: the role must fail on the key fetch, clearly,
    and leave no repository file behind."""
    host = nodes()[1]
    doc = json.loads(run_cli("install", str(lab), "--limit", host, "--tags", "nvidia_driver", "-e", "nvidia_driver_source=mirror",
                             "-e", "nvidia_driver_mirror_url=http://127.0.0.1:9/cuda", "--output", "json").stdout)  # fmt: skip
    failure = doc["hosts"][host]["failures"][-1]
    assert "127.0.0.1:9/cuda/debian12/x86_64/3bf863cc.pub" in failure["message"]
    assert (
        ssh(lab, host, "test -e /etc/apt/sources.list.d/gpustack-nvidia-cuda.sources").returncode
        == 1
    )


def user_package(name: str, depends: str = "") -> str:
    """Shell that builds and installs (dpkg -i: marked manual) a package of a user's own, a TEST
    FIXTURE: installed by hand after gpustack's driver install."""
    control = (f"Package: {name}\nVersion: 1.0\nArchitecture: all\nMaintainer: t@invalid\n"
               + (f"Depends: {depends}\n" if depends else "")
               + "Description: TEST FIXTURE, a user's own package\n")  # fmt: skip
    encoded = base64.b64encode(control.encode()).decode()
    return (f"mkdir -p /tmp/{name}/DEBIAN && echo {encoded} | base64 -d > /tmp/{name}/DEBIAN/control"
            f" && dpkg-deb -b /tmp/{name} /tmp/{name}.deb >/dev/null && dpkg -i /tmp/{name}.deb >/dev/null")  # fmt: skip


def test_uninstall_leaves_what_the_user_installed_since(lab):
    """Packages installed by hand after gpustack's driver install are in "now - before" too: one
    that depends on the driver stops the driver's removal before any package goes (apt would
    have purged it with the driver); one that does not is kept, and said so. uninstall --check
    shows the same."""
    first = nodes()[0]
    cmd = (
        user_package("gpustack-user-app", "nvidia-smi")
        + " && "
        + user_package("gpustack-user-tool")
    )
    assert ssh(lab, first, cmd).returncode == 0
    proc = run_cli("uninstall", str(lab), "--components", "driver", "--limit", first, "--yes",
                   "--output", "json")  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    message = json.loads(proc.stdout)["hosts"][first]["failures"][-1]["message"]
    assert "would also remove gpustack-user-app," in message, message
    assert "The driver packages were left installed. Hint: " in message
    assert ssh(lab, first, "dpkg -s nvidia-smi gpustack-user-app >/dev/null").returncode == 0
    assert ssh(lab, first, "dpkg -P gpustack-user-app").returncode == 0
    check = run_cli("uninstall", str(lab), "--components", "driver", "--limit", first, "--check",
                    "--output", "json")  # fmt: skip
    assert check.returncode == 0, check.stdout[-3000:] + check.stderr[-2000:]
    doc = json.loads(check.stdout)
    removed = {item.split()[0] for item in doc["plan"][first]["remove"]}
    assert "nvidia-smi" in removed and "gpustack-user-tool" not in removed, removed
    assert "kept gpustack-user-tool: installed by hand" in " ".join(
        doc["hosts"][first]["facts"]["gpustack_notes"]
    )


def test_uninstall_restores_the_package_set(lab):
    # node2's driver "stays loaded" after its packages go, as a real module does until a reboot:
    # the uninstall records it, and the next install must not take it for a preinstalled driver.
    loaded = nodes()[1]
    text = REAL_NVRM.read_text()
    assert ssh(lab, loaded, f"{FAKE_LOADED} <<'EOF'\n{text}EOF").returncode == 0
    # node2 as an older gpustack left it: the pin and no record of the packages before; only the
    # packages built from the driver's sources go (the pattern once matched nothing at all)
    assert ssh(lab, loaded, "rm /var/lib/gpustack/nvidia_driver.packages-before").returncode == 0
    try:
        proc = run_cli("uninstall", str(lab), "--components", "driver", "--yes")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"{nodes()[0]}: kept gpustack-user-tool: installed by hand" in proc.stdout
        marker = "/var/lib/gpustack/nvidia_driver.removed-loaded"
        assert ssh(lab, loaded, f"cat {marker}").stdout == "580.159.04\n"
        assert ssh(lab, nodes()[0], f"test -e {marker}").returncode == 1  # nothing was loaded
        plan = run_cli("plan", str(lab), *DISTRO, "--limit", loaded)
        assert plan.returncode == 0, plan.stdout + plan.stderr
        assert "no driver package provides it" not in plan.stdout
    finally:
        ssh(lab, loaded, "umount /proc/driver")
    for host in nodes():
        after = ssh(
            lab,
            host,
            "dpkg-query -W -f='${Package} ${db:Status-Abbrev}\\n' | awk '$2 ~ /^[ih]i/ {print $1}' | sort",
        ).stdout
        if host == nodes()[0]:
            wanted = set(RECORDED["packages_before"].split()) | {"gpustack-user-tool"}
            assert set(after.split()) == wanted, set(after.split()) ^ wanted
            assert "nvidia" not in after, (host, after)
        else:  # the fallback: the packages built from the driver's sources go (not their deps)
            sources = ssh(lab, host, "dpkg-query -W -f='${source:Package} ${db:Status-Abbrev}\\n'")
            driver_sources = {"nvidia-graphics-drivers", "nvidia-persistenced", "nvidia-modprobe"}
            left = {line.split()[0] for line in sources.stdout.splitlines()
                    if line.split()[-1].endswith("i") and line.split()[0] in driver_sources}  # fmt: skip
            assert not left and "nvidia-smi" not in after, left
        assert ssh(lab, host, "apt-mark showhold").stdout.strip() == ""
        assert (
            ssh(
                lab, host, "grep -h ^Components /etc/apt/sources.list.d/debian.sources"
            ).stdout.split()
            == ["Components:", "main"] * 2
        )
        listed = ssh(lab, host, "ls /etc/apt/preferences.d /etc/modprobe.d").stdout
        assert "gpustack" not in listed, listed
        if host != nodes()[0]:  # the fallback leaves the driver's dependencies (dkms's file)
            continue
        assert ssh(lab, host, "ls /etc/apt/preferences.d /etc/modprobe.d").stdout.strip() in (
            "",
            "/etc/apt/preferences.d:\n\n/etc/modprobe.d:",
        )


def test_debian13_installs_the_550_branch(tmp_path):
    name = f"{LAB}t"
    inventory = tmp_path / "d13.ini"
    with lab_nodes(name, 1, inventory, "debian13"):
        doc = install(inventory, "-e", "nvidia_driver_branch=550")  # DISTRO limits it to the driver
        assert doc["rc"] == 0, doc
        facts = driver(doc, f"{name}-node1")
        assert facts["installed_version"].startswith("550.")
        assert facts["held"] is True


def test_open_kernel_modules_from_debians_archive(tmp_path):
    """nvidia_driver_open_kernel_modules=true on Debian 13: the open modules' DKMS package,
    pinned and held like the proprietary one (DKMS builds nothing: no headers, no GPU)."""
    name = f"{LAB}o"
    inventory = tmp_path / "open.ini"
    with lab_nodes(name, 1, inventory, "debian13"):
        doc = install(inventory, "-e", "nvidia_driver_open_kernel_modules=true")
        assert doc["rc"] == 0, doc
        host = f"{name}-node1"
        facts = driver(doc, host)
        assert facts["kernel_modules"] == "open"
        assert facts["kernel_modules_reason"] == "nvidia_driver_open_kernel_modules=true"
        assert facts["installed_version"].startswith("550.") and facts["held"] is True
        held = ssh(inventory, host, "apt-mark showhold").stdout.split()
        assert "nvidia-open-kernel-dkms" in held and "nvidia-kernel-dkms" not in held
        # the default auto on the same host keeps the installed kind: nothing changes
        again = install(inventory)
        assert again["rc"] == 0 and again["hosts"][host]["changed"] == 0, again
        assert driver(again, host)["kernel_modules_reason"].startswith(
            "auto: keeps the installed driver's open modules"
        )


def test_a_host_without_systemd_gets_the_driver_and_no_systemd_marker(tmp_path):
    """A host that systemd did not boot (the lent H100 VMs; this project's build machine): there,
    `systemctl mask --runtime` works offline and creates /run/systemd/system, the very marker of
    a systemd boot (seen on the build machine, 2026-11-27), and unmask and enable fail without
    systemd's bus. The role leaves nvidia-persistenced alone there and says so.

    Emulated on a lab node: /run/systemd/system moved aside (what gpustack's probe and the
    package scripts look at), and a policy-rc.d that denies init scripts, as container images
    ship it (without systemd the package's postinst would start the daemon's init script)."""
    name = f"{LAB}n"
    inventory = tmp_path / "nosd.ini"
    host = f"{name}-node1"
    hide = "mv /run/systemd/system /run/systemd/system.gpustack-test"
    deny = "printf '#!/bin/sh\\nexit 101\\n' > /usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d"
    with lab_nodes(name, 1, inventory):
        assert ssh(inventory, host, f"{deny} && {hide}").returncode == 0
        doc = install(inventory)
        assert doc["rc"] == 0, doc["hosts"][host].get("failures")
        facts = doc["hosts"][host]["facts"]
        assert facts["gpustack_driver"]["installed_version"] == NEW
        assert facts["gpustack_preflight"]["systemd"] is False
        # No systemd marker made by gpustack, no mask left behind.
        assert ssh(inventory, host, "test -e /run/systemd/system").returncode == 1
        masked = "test -e /run/systemd/system.gpustack-test/nvidia-persistenced.service"
        assert ssh(inventory, host, masked).returncode == 1
        assert facts["gpustack_notes"] == [
            "nvidia-persistenced not enabled or started by gpustack: the host does not run "
            "systemd (no /run/systemd/system); start it with the host's own init"
        ]
        proc = run_cli("install", str(inventory), *DISTRO, "--full")  # the text output says it too
        assert proc.returncode == 0, proc.stdout[-3000:]
        text = " ".join(proc.stdout.split())
        assert f"{host}: nvidia-persistenced not enabled or started" in text
        assert "1 ok, 0 failed, 0 unreachable, 0 changes" in text  # idempotent there too
