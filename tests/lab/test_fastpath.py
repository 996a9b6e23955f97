"""install's converged-host fast path on real lab nodes: a no-op re-run skips the hosts, and
every change the fast path could miss sends the host through the full play, which repairs it.

Two Debian 12 nodes with Debian's containerd and the stand-in toolkit repository of
tests/fixtures/lab_fixtures.py. Each round tampers with the nodes (two different tampers at
once where they are independent), then: install -> the tampered node is NOT skipped and is
repaired; install again -> every node is skipped ("converged (fast path)").
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from benchmarks.kill_rerun import DRIVER_TRANSACTION, HOLD_TOOLKIT
from tests.conftest import lab_nodes, run_cli
from tests.fixtures import lab_fixtures
from tests.lab.test_lab import PACKAGES_AND_SOURCES, ssh

pytestmark = pytest.mark.lab

LAB = os.environ.get("GPUSTACK_FASTPATH_LAB") or f"fastpath{os.getpid()}"
N1, N2 = f"{LAB}-node1", f"{LAB}-node2"
# the newest stand-in, and the toolkit built from NVIDIA's module (the newest in the repository)
TK_OLD, TK_NEW = lab_fixtures.VERSIONS[-1], lab_fixtures.BUILT_VERSION
BLACKLIST = "/etc/modprobe.d/gpustack-blacklist-nouveau.conf"
DROPIN = "/etc/containerd/conf.d/99-nvidia.toml"
TOOLKIT_LISTS = "Refresh the package lists (at most hourly) and list the versions the source offers"
DUMP = "containerd --config /etc/containerd/config.toml config dump"
# The driver reconfigured, its packages left alone (the transaction call does not run)
RECONFIGURE = ("--tags", "nvidia_driver", "--skip-tags", "nvidia_driver_install")
TIMINGS: dict[str, list[float]] = {}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("fastpath") / "fastpath.ini"
    with lab_nodes(LAB, 2, inventory):
        containers = [f"gpustack-{n}" for n in (N1, N2)]
        varsfile = lab_fixtures.prepare(containers, inventory.with_suffix(".vars.json"))
        yield inventory, varsfile
        print("\nfast path lab timings (s):", json.dumps(TIMINGS, indent=2))


def install(lab, *extra: str, command: str = "install") -> dict:
    inventory, varsfile = lab
    start = time.monotonic()
    proc = run_cli(command, str(inventory), "-e", f"@{varsfile}", *extra, "--output", "json",
                   timeout=1800)  # fmt: skip
    TIMINGS.setdefault(command + (" ".join(extra) and " " + " ".join(extra)), []).append(
        round(time.monotonic() - start, 1)
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    return json.loads(proc.stdout)


def reasons(doc, host) -> str:
    return " | ".join((doc["hosts"][host]["facts"].get("gpustack_converged") or {}).get("reasons")
                      or [])  # fmt: skip


def assert_skipped(doc, *hosts):
    for host in hosts:
        result = doc["hosts"][host]
        assert result["converged"] is True, f"{host} not skipped: {reasons(doc, host)}"
        assert (result["status"], result["changed"]) == ("ok", 0)


def assert_full(doc, host, why: str):
    result = doc["hosts"][host]
    assert result["converged"] is False, f"{host} skipped although: {why}"
    assert why in reasons(doc, host), reasons(doc, host)
    assert result["ok"] > 40, result  # the whole play ran there


def sh(lab, host, command) -> str:
    proc = ssh(lab[0], host, command)
    assert proc.returncode == 0, f"{command}: {proc.stderr}"
    return proc.stdout


KERNEL = "6.1.0-99-amd64"  # a FIXTURE kernel: an empty image, no modules
INITRD = f"/boot/initrd.img-{KERNEL}"
INITRAMFS_MARKER = "/var/lib/gpustack/nvidia_driver.initramfs-pending"


def initramfs_fixture(lab, host, config: str) -> None:
    """Debian's real initramfs-tools on the host, the fixture kernel to build for (its
    configuration `config`), and the nouveau blacklist edited by hand (the next run rewrites it
    and asks for a regeneration)."""
    sh(lab, host, "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "
                  "initramfs-tools >/dev/null")  # fmt: skip
    sh(lab, host, f"mkdir -p /lib/modules/{KERNEL} && depmod {KERNEL} 2>/dev/null; "
                  f"touch /boot/vmlinuz-{KERNEL} {INITRD}; "
                  f"printf '{config}' > /boot/config-{KERNEL}")  # fmt: skip
    sh(lab, host, f"echo '# edited by hand' > {BLACKLIST}")


def skipped_tasks(doc, events=("runner_on_skipped",)) -> set[tuple[str, str, str]]:
    """(role, task, host) of every task the run's events show skipped (or, with `events`, ended
    so)."""
    found = set()
    for path in Path(doc["artifacts"]).glob("job_events/*.json"):
        event = json.loads(path.read_text())
        if event.get("event") in events:
            data = event["event_data"]
            found.add((data.get("role", ""), data.get("task", ""), data.get("host", "")))
    return found


RAN = ("runner_on_ok", "runner_on_failed", "runner_item_on_ok", "runner_item_on_failed")
TOOLKIT_INSTALL = "Install, pin and hold the toolkit (unless the driver's transaction did)"


def test_an_unknown_toolkit_version_fails_before_any_package_changes(lab):
    # Fresh nodes: site.yml resolves the toolkit's version before the driver role. Until
    # 2026-11-26 this failed after the driver's transaction (17 NVIDIA packages installed, held).
    inventory, varsfile = lab
    before = {h: sh(lab, h, PACKAGES_AND_SOURCES) for h in (N1, N2)}
    proc = run_cli("install", str(inventory), "-e", f"@{varsfile}",
                   "-e", "nvidia_container_toolkit_version=9.9.9-1", "--output", "json")  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-2000:]
    doc = json.loads(proc.stdout)
    for host in (N1, N2):
        message = doc["hosts"][host]["failures"][-1]["message"]
        assert "nvidia-container-toolkit 9.9.9-1 is not available" in message, message
        assert TK_NEW in message and "(package sources were rolled back)" in message, message
        assert "Hint: set nvidia_container_toolkit_version to one of these" in message, message
        assert sh(lab, host, PACKAGES_AND_SOURCES) == before[host]  # no package, source or pin


def test_first_install_then_a_no_op_rerun_skips_every_host(lab):
    doc = install(lab)
    assert doc["summary"]["failed"] == 0
    # No apt call that cannot change anything: the driver role refreshed the lists a moment ago,
    # and its transaction installed the companions at the driver's release and the toolkit's
    # packages at the version resolved before it (one transaction, one hold call).
    # The toolkit role's install part is left out as a whole (one skipped include): its
    # transaction and hold do not run.
    skipped, ran = skipped_tasks(doc), skipped_tasks(doc, RAN)
    for host in (N1, N2):
        for role, task in (
            ("nvidia_container_toolkit", TOOLKIT_LISTS),
            ("nvidia_driver", "Put the installed companions at the driver's release"),
            ("nvidia_container_toolkit", TOOLKIT_INSTALL),
        ):
            assert (role, task, host) in skipped, (role, task, host)
        for task in ("Install the toolkit packages at exactly that version", HOLD_TOOLKIT):
            assert ("nvidia_container_toolkit", task, host) not in skipped | ran, (task, host)
        changes = [c.get("task") for c in doc["hosts"][host]["changes"]]
        assert DRIVER_TRANSACTION in changes, changes
        held = sh(lab, host, "apt-mark showhold").split()
        assert {"nvidia-container-toolkit", "libnvidia-container1", "nvidia-smi"} <= set(held)
        assert sh(lab, host, "dpkg-query -W -f='${Version}' nvidia-container-toolkit") == TK_NEW
    for host in (N1, N2):
        assert "no stamp" in reasons(doc, host)
        stamps = sh(lab, host, "ls /var/lib/gpustack/converged").split()
        assert stamps == [
            "container_runtime.json", "nvidia_container_toolkit.json", "nvidia_driver.json"
        ]  # fmt: skip
    # The whole play right after a first install changes nothing: the stamps it records hold no
    # fact that the install itself moved (the driver installed, the toolkit's holds).
    doc = install(lab, "--full")
    for host in (N1, N2):
        changes = [c.get("task") for c in doc["hosts"][host]["changes"]]
        assert (doc["hosts"][host]["converged"], changes) == (False, []), host
    doc = install(lab)
    assert_skipped(doc, N1, N2)
    assert doc["summary"]["changed"] == 0
    facts = doc["hosts"][N1]["facts"]  # what the Kubernetes phase and JUnit read
    assert facts["gpustack_preflight"]["os"]["codename"] == "bookworm"
    assert facts["gpustack_toolkit"]["installed_version"] == TK_NEW
    assert facts["gpustack_runtime"]["wired"] is True
    assert facts["gpustack_driver"]["held"] is True


def test_edited_blacklist_and_removed_dropin_are_repaired(lab):
    before = sh(lab, N1, f"cat {BLACKLIST}")
    sh(lab, N1, f"echo '# edited by hand' > {BLACKLIST}")
    sh(lab, N2, f"rm {DROPIN}")
    doc = install(lab)
    assert_full(doc, N1, f"nvidia_driver: file {BLACKLIST} changed")
    assert_full(doc, N2, f"container_runtime: file {DROPIN} removed")
    assert sh(lab, N1, f"cat {BLACKLIST}") == before
    assert "runtimes.nvidia" in sh(lab, N2, DUMP)
    assert_skipped(install(lab), N1, N2)


def test_released_hold_and_package_changed_by_hand_are_repaired(lab):
    sh(lab, N1, "apt-mark unhold nvidia-smi")
    packages = " ".join(f"{p}={TK_OLD}" for p in
                        ("nvidia-container-toolkit", "nvidia-container-toolkit-base",
                         "libnvidia-container-tools", "libnvidia-container1"))  # fmt: skip
    sh(lab, N2, "DEBIAN_FRONTEND=noninteractive apt-get install -y -q --allow-downgrades "
                f"--allow-change-held-packages {packages} >/dev/null")  # fmt: skip
    doc = install(lab)
    assert_full(doc, N1, "nvidia_driver: package nvidia-smi not held")
    assert_full(doc, N2, f"nvidia_container_toolkit: package nvidia-container-toolkit {TK_OLD}")
    assert "nvidia-smi" in sh(lab, N1, "apt-mark showhold").split()
    assert sh(lab, N2, "dpkg-query -W -f='${Version}' nvidia-container-toolkit") == TK_NEW
    assert_skipped(install(lab), N1, N2)


def test_config_overwritten_by_another_tool_repairs_only_that_node(lab):
    # "another tool" writes containerd's default configuration: the nvidia runtime is gone
    sh(lab, N1, "containerd config default > /etc/containerd/config.toml")
    assert "runtimes.nvidia" not in sh(lab, N1, DUMP)
    plan = install(lab, command="plan")
    assert plan["hosts"][N2]["converged"] is True and plan["plan"][N2]["files"] == []
    assert plan["hosts"][N1]["converged"] is False and plan["plan"][N1]["files"]
    assert "runtimes.nvidia" not in sh(lab, N1, DUMP)  # plan changed nothing
    doc = install(lab)
    assert_full(doc, N1, "containerd: runtime 'nvidia' not in the effective configuration")
    assert_skipped(doc, N2)  # the full play ran on the tampered node only
    assert "runtimes.nvidia" in sh(lab, N1, DUMP)
    assert_skipped(install(lab), N1, N2)


def test_a_changed_input_runs_the_full_play_everywhere(lab):
    pin = f"nvidia_container_toolkit_version={TK_OLD}"
    doc = install(lab, "-e", pin)
    for host in (N1, N2):
        assert_full(doc, host, f"input nvidia_container_toolkit_version is '{TK_OLD}', was ''")
        assert sh(lab, host, "dpkg-query -W -f='${Version}' nvidia-container-toolkit") == TK_OLD
    assert_skipped(install(lab, "-e", pin), N1, N2)
    # and back to "newest" without -e: another input change, another full run
    doc = install(lab)
    assert_full(doc, N1, "input nvidia_container_toolkit_version is '', was")
    assert sh(lab, N1, "dpkg-query -W -f='${Version}' nvidia-container-toolkit") == TK_NEW
    assert_skipped(install(lab), N1, N2)


def test_stamp_of_another_gpustack_and_full_flag(lab):
    # what a host last installed by another gpustack release (other roles) carries
    sh(lab, N2, "sed -i 's/\"content\": \"[0-9a-f]*\"/\"content\": \"0ld\"/' "
                "/var/lib/gpustack/converged/nvidia_driver.json")  # fmt: skip
    doc = install(lab)
    assert_full(doc, N2, "nvidia_driver: gpustack's roles changed since the last full run")
    assert_skipped(doc, N1)
    assert_skipped(install(lab), N1, N2)
    doc = install(lab, "--full")
    for host in (N1, N2):
        assert doc["hosts"][host]["converged"] is False and doc["hosts"][host]["ok"] > 40
        assert doc["hosts"][host]["changed"] == 0


def test_a_failed_initramfs_regeneration_is_finished_by_the_next_run(lab):
    # Debian's real initramfs-tools on N1, and a kernel to build for whose configuration lacks
    # the initramfs compressor: update-initramfs fails there as it does on a real host ("E: gzip
    # compression (CONFIG_RD_GZIP) not supported by kernel"). The kernel is a FIXTURE (an empty
    # image, no modules); update-initramfs and mkinitramfs are the real ones. Until 2026-11-29 a
    # handler regenerated the initramfs at the play's end, after the converged stamps: the next
    # install skipped the host (fast path) and nouveau stayed in the initramfs.
    kernel, initrd, marker = KERNEL, INITRD, INITRAMFS_MARKER
    initramfs_fixture(lab, N1, "")
    inventory, varsfile = lab
    proc = run_cli("install", str(inventory), "-e", f"@{varsfile}", "--output", "json",
                   timeout=1800)  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    failure = json.loads(proc.stdout)["hosts"][N1]["failures"][-1]
    # the driver's transaction call regenerates it at its end (no transaction needed here: its
    # holds, reads and the blacklist's write), since 2026-12-02
    assert DRIVER_TRANSACTION in json.dumps(failure), failure
    assert "update-initramfs: failed for" in json.dumps(failure), failure
    assert sh(lab, N1, f"test -e {marker} && echo pending").strip() == "pending"
    status = run_cli("status", str(inventory), "-e", f"@{varsfile}", "--output", "json")
    assert status.returncode == 5, status.stdout[-2000:] + status.stderr[-2000:]
    drift = json.loads(status.stdout)["drift"]
    assert any(line.startswith("initramfs not regenerated") for line in drift[N1]), drift
    assert not drift.get(N2), drift
    # the cause fixed (a kernel configuration with the compressors): the next install finishes it
    sh(lab, N1, f"printf 'CONFIG_RD_GZIP=y\\nCONFIG_RD_ZSTD=y\\n' > /boot/config-{kernel}")
    doc = install(lab)
    assert_full(doc, N1, f"nvidia_driver: file {marker} created")
    assert_skipped(doc, N2)
    changes = [c.get("task") for c in doc["hosts"][N1]["changes"]]
    assert DRIVER_TRANSACTION in changes, changes
    assert sh(lab, N1, f"test -e {marker} || echo cleared").strip() == "cleared"
    files = sh(lab, N1, f"lsinitramfs {initrd}").split()
    assert BLACKLIST.lstrip("/") in files, [f for f in files if "modprobe" in f]
    status = run_cli("status", str(inventory), "-e", f"@{varsfile}")
    assert status.returncode == 0, status.stdout[-2000:]
    assert_skipped(install(lab), N1, N2)
    sh(lab, N1, f"rm -rf /boot/*-{kernel} /lib/modules/{kernel}")


def test_the_driver_reconfigured_alone_regenerates_the_initramfs_itself(lab):
    # `install --tags nvidia_driver --skip-tags nvidia_driver_install` (the driver reconfigured,
    # its packages left alone) leaves the driver's transaction call out, so configure.yml's own
    # task regenerates the initramfs where the blacklist changed: the fallback of the call's
    # regeneration, which until 2026-12-02 had met no real update-initramfs. Debian's real
    # initramfs-tools, the FIXTURE kernel with the compressors configured.
    kernel, initrd, marker = KERNEL, INITRD, INITRAMFS_MARKER
    initramfs_fixture(lab, N1, "CONFIG_RD_GZIP=y\\nCONFIG_RD_ZSTD=y\\n")
    try:
        doc = install(lab, *RECONFIGURE, "-l", N1)
        changes = [c["task"] for c in doc["hosts"][N1]["changes"]]
        assert "Regenerate the initramfs without nouveau" in changes, changes
        assert DRIVER_TRANSACTION not in changes, changes
        assert "# edited by hand" not in sh(lab, N1, f"cat {BLACKLIST}")
        assert sh(lab, N1, f"test -e {marker} || echo cleared").strip() == "cleared"
        files = sh(lab, N1, f"lsinitramfs {initrd}").split()
        assert BLACKLIST.lstrip("/") in files, [f for f in files if "modprobe" in f]
        # nothing left to do: the same run again changes nothing
        again = install(lab, *RECONFIGURE, "-l", N1)
        assert again["hosts"][N1]["changed"] == 0, again["hosts"][N1]["changes"]
    finally:
        sh(lab, N1, f"rm -rf /boot/*-{kernel} /lib/modules/{kernel}")
