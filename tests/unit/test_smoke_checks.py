"""The smoke suite's checks and verdicts (gpustack/smoke/checks.py), from facts shaped like the
ones gpu_preflight and gpu_smoke publish. The nvidia-smi XML is a hand-written sample
(tests/fixtures/real-gpu/public/, not captured from a GPU); everything else here is constructed
test input."""

import copy

import pytest

from gpustack.errors import ExitCode
from gpustack.smoke import checks
from tests.conftest import ROOT

PUBLIC = ROOT / "tests/fixtures/real-gpu/public"
A100_XML = (PUBLIC / "handwritten-v11-a100-sxm4-40gb-mig/nvidia-smi-q-x.xml").read_text()
A100_UUID = "GPU-1b6ebc9c-aea7-43c3-a9be-5a0657b7731b"
# `nvidia-smi -L` lines for the sample's four MIG devices (constructed: the XML has no MIG UUIDs)
A100_MIG_LIST = (
    "  MIG 3g.20gb     Device  0: (UUID: MIG-ea307284-f162-4b46-bf74-41c0c3068dc4)\n"
    "  MIG 2g.10gb     Device  1: (UUID: MIG-d38a6df1-cc2e-4b92-b69d-a25e5163f690)\n"
    "  MIG 1g.5gb      Device  2: (UUID: MIG-65f958f3-4868-4ee3-8b8c-30cf7c7d2608)\n"
    "  MIG 1g.5gb      Device  3: (UUID: MIG-7a816fdd-1a9b-4636-816f-7f92530142d3)\n"
)
H100X2_XML = (PUBLIC / "handwritten-v12-h100-pending-x2/nvidia-smi-q-x.xml").read_text()


def cmd(argv, rc=0, stdout="", stderr=""):
    return {"argv": argv, "rc": rc, "stdout": stdout, "stderr": stderr}


def bare_host() -> dict:
    """A machine with nothing NVIDIA on it (what this build machine and lab nodes are)."""
    return {
        "gpustack_preflight": {
            "os": {"id": "debian", "family": "Debian"},
            "kernel": "6.1.0-28-amd64",
            "gpus": {"count": 0, "devices": []},
            "nvswitch": {"present": False, "count": 0},
            "secure_boot": "unsupported",
            "nouveau_loaded": False,
            "kernel_headers": {"package": "linux-headers-6.1.0-28-amd64", "installed": False},
            "driver": {"installed": {"package": None, "version": None}, "loaded_version": None},
            "runtimes": [],
            "runtime": None,
        },
        "gpustack_status": {
            "driver": {"packages": {}},
            "toolkit": {"installed_version": None, "packages": {}},
            "runtime": {"kind": None, "wired": None, "binary_present": False, "detail": "no container runtime"},
        },
        "gpustack_smoke": {
            "hostname": "bare", "fqdn": "bare",
            "tools": {"nvidia-smi": None, "nvidia-ctk": None},
            "nvidia_smi": None, "proc_driver_version": None, "lspci": cmd(["lspci"]),
            "fabric_manager": cmd(["systemctl"], stdout="LoadState=not-found\nActiveState=inactive\n"),
            "toolkit": {"nvidia-ctk": None, "nvidia-container-runtime": None,
                        "nvidia-container-cli": None, "nvidia-container-cli info": None},
            "cdi": None,
            "container": {"runtime": None, "skipped": "no container runtime"},
        },
    }  # fmt: skip


def gpu_host() -> dict:
    """One A100 with MIG, driver loaded at the installed version, toolkit, CDI, containerd wired,
    and a container that sees the GPU: every check that applies passes."""
    facts = bare_host()
    pf, status, smoke = (
        facts["gpustack_preflight"],
        facts["gpustack_status"],
        facts["gpustack_smoke"],
    )
    pf["gpus"] = {
        "count": 1,
        "devices": [{"pci_address": "0000:00:05.0", "model": "GA100 [A100 SXM4 40GB]"}],
    }
    pf["kernel_headers"]["installed"] = True
    pf["driver"] = {
        "installed": {"package": "nvidia-driver-515-server", "version": "515.105.01-0ubuntu1"},
        "loaded_version": "515.105.01",
    }
    pf["runtime"] = "containerd"
    status["toolkit"]["installed_version"] = "1.17.8-1"
    status["runtime"] = {
        "kind": "containerd",
        "wired": True,
        "binary_present": True,
        "detail": "effective configuration (containerd config dump)",
    }
    smoke["tools"] = {"nvidia-smi": "/usr/bin/nvidia-smi", "nvidia-ctk": "/usr/bin/nvidia-ctk"}
    smoke["nvidia_smi"] = cmd(["nvidia-smi", "-q", "-x"], stdout=A100_XML)
    smoke["proc_driver_version"] = "NVRM version: NVIDIA UNIX x86_64 Kernel Module  515.105.01\n"
    smoke["toolkit"] = {
        "nvidia-ctk": cmd(
            ["nvidia-ctk", "--version"],
            stdout="NVIDIA Container Toolkit CLI version 1.17.8\ncommit: 1\n",
        ),
        "nvidia-container-runtime": cmd(
            ["nvidia-container-runtime", "--version"],
            stdout="NVIDIA Container Runtime version 1.17.8\n",
        ),
        "nvidia-container-cli": cmd(
            ["nvidia-container-cli", "--version"], stdout="cli-version: 1.17.8\n"
        ),
        "nvidia-container-cli info": cmd(
            ["nvidia-container-cli", "info"],
            stdout=f"NVRM version:   515.105.01\n\nDevice Index:   0\nGPU UUID:       {A100_UUID}\n",
        ),
    }
    spec = (
        'cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: "0"\n'
        f"- name: {A100_UUID}\n- name: all\ncontainerEdits: {{}}\n"
    )
    smoke["cdi"] = {
        "dir": "/tmp/gpustack-smoke-cdi-abc",
        "generate": cmd(
            ["nvidia-ctk", "cdi", "generate", "--output=/tmp/gpustack-smoke-cdi-abc/nvidia.yaml"],
            stderr='level=info msg="Generated CDI spec with version 0.5.0"\n',
        ),
        "list": cmd(
            ["nvidia-ctk", "cdi", "list", "--spec-dir=/tmp/gpustack-smoke-cdi-abc"],
            stdout=f"nvidia.com/gpu=0\nnvidia.com/gpu={A100_UUID}\nnvidia.com/gpu=all\n",
        ),
        "specs": {"nvidia.yaml": spec},
    }
    smoke["container"] = {
        "runtime": "containerd",
        "skipped": None,
        "image": "docker.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
        "namespace": "default",
        "image_choice": "given",
        "marker": "gpustack-smoke-ok",
        "run": cmd(
            ["ctr", "run"],
            stdout=f"gpustack-smoke-ok\nGPU 0: NVIDIA A100-SXM4-40GB (UUID: {A100_UUID})\n"
            + A100_MIG_LIST,
        ),
    }
    return facts  # fmt: skip


def statuses(report) -> dict:
    return {c.name: c.status for c in report.checks}


def test_bare_host_is_no_nvidia_device_and_nothing_absent_passes():
    report = checks.host_smoke("bare", bare_host())
    assert report.verdict == "no NVIDIA device"
    assert report.summary == "no NVIDIA device; no NVIDIA driver installed"
    got = statuses(report)
    for name in (
        "gpu_pci",
        "driver_package",
        "driver_loaded",
        "nvidia_smi",
        "toolkit",
        "container_cli",
        "cdi",
        "runtime_config",
    ):
        assert got[name] == "absent", name
    assert got["container"] == "skipped"
    passed = {n for n, s in got.items() if s == "pass"}
    assert passed == {"nouveau"}, (
        "only the nouveau precondition may pass on a machine without NVIDIA"
    )
    assert checks.exit_code(0, [report]) == ExitCode.VERIFY_FAILED


def test_driver_installed_without_device_says_so():
    facts = bare_host()
    facts["gpustack_preflight"]["driver"]["installed"] = {
        "package": "nvidia-driver",
        "version": "535.261.03-1",
    }
    facts["gpustack_smoke"]["nvidia_smi"] = cmd(
        ["nvidia-smi", "-q", "-x"], rc=9,
        stdout="NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
               "Make sure that the latest NVIDIA driver is installed and running.\n")  # fmt: skip
    report = checks.host_smoke("lab", facts)
    assert report.verdict == "no NVIDIA device"
    assert report.summary == "driver installed, not loaded: no NVIDIA device (package 535.261.03-1)"
    smi = report.check("nvidia_smi")
    assert smi.status == "absent" and smi.summary.startswith("exit 9: NVIDIA-SMI has failed")
    assert report.check("driver_loaded").summary == "driver installed, not loaded: no NVIDIA device"
    assert report.check("driver_package").status == "pass"


def test_gpu_host_where_everything_works_passes():
    report = checks.host_smoke("gpu1", gpu_host())
    assert report.verdict == "pass", [(c.name, c.status, c.summary) for c in report.checks]
    got = statuses(report)
    for name in (
        "gpu_pci",
        "driver_loaded",
        "nvidia_smi",
        "toolkit",
        "container_cli",
        "cdi",
        "runtime_config",
        "container",
        "kernel_headers",
        "driver_package",
    ):
        assert got[name] == "pass", name
    assert got["persistence"] == "warn"  # the hand-written A100 sample has persistence mode off
    assert "warnings: persistence" in report.summary
    assert report.check("mig").summary == "enabled - GPU 0: 4 MIG device(s)"
    assert (report.check("ecc").status, report.check("ecc").summary) == ("info", "enabled")
    assert report.check("nvidia_smi").summary == "1 GPU(s), driver 515.105.01, CUDA 11.7"
    assert report.check("cdi").detail["devices_from"] == "nvidia-ctk cdi list"
    assert report.gpus[0]["uuid"] == A100_UUID and report.gpus[0]["memory_total_mib"] == 40960
    assert checks.exit_code(0, [report]) == ExitCode.OK


def test_absent_optional_parts_are_listed_not_passed():
    facts = gpu_host()
    smoke = facts["gpustack_smoke"]
    smoke["toolkit"] = {k: None for k in smoke["toolkit"]}
    smoke["cdi"] = None
    smoke["tools"]["nvidia-ctk"] = None
    smoke["container"] = {"runtime": None, "skipped": "no container runtime"}
    facts["gpustack_status"]["runtime"] = {
        "kind": None,
        "wired": None,
        "detail": "no container runtime",
    }
    report = checks.host_smoke("gpu1", facts)
    got = statuses(report)
    assert got["toolkit"] == got["cdi"] == got["container_cli"] == got["runtime_config"] == "absent"
    assert got["container"] == "skipped"
    assert report.verdict == "pass"
    assert "absent: toolkit, container_cli, cdi, runtime_config" in report.summary


@pytest.mark.parametrize(
    ("change", "check", "status", "words"),
    [
        (
            lambda f: f["gpustack_preflight"]["driver"].update(loaded_version="505.1.1"),
            "driver_loaded",
            "fail",
            "reboot required",
        ),
        (
            lambda f: f["gpustack_preflight"]["driver"].update(loaded_version=None),
            "driver_loaded",
            "fail",
            "not loaded",
        ),
        (
            lambda f: f["gpustack_smoke"].update(
                nvidia_smi=cmd(
                    ["nvidia-smi"],
                    rc=18,
                    stdout="Failed to initialize NVML: Driver/library version mismatch\n",
                )
            ),
            "nvidia_smi",
            "fail",
            "exit 18: Failed to initialize NVML",
        ),
        (
            lambda f: f["gpustack_smoke"].update(nvidia_smi=cmd(["nvidia-smi"], stdout="garbage")),
            "nvidia_smi",
            "fail",
            "cannot parse",
        ),
        (
            lambda f: f["gpustack_preflight"]["gpus"].update(count=2),
            "nvidia_smi",
            "fail",
            "sees 1 of the 2",
        ),
        (
            lambda f: f["gpustack_smoke"]["container"]["run"].update(
                stdout="gpustack-smoke-ok\nsh: 1: nvidia-smi: not found\n", rc=127
            ),
            "container",
            "fail",
            "sees 0 of 1",
        ),
        (
            lambda f: f["gpustack_smoke"]["container"]["run"].update(
                stdout="", stderr="ctr: failed to create shim task: OCI runtime create failed", rc=1
            ),
            "container",
            "fail",
            "did not start",
        ),
        (
            lambda f: f["gpustack_smoke"]["cdi"]["generate"].update(
                rc=1, stderr="failed to initialize NVML"
            ),
            "cdi",
            "fail",
            "nvidia-ctk cdi generate: exit 1",
        ),
        (
            lambda f: f["gpustack_smoke"]["cdi"].update(specs={}),
            "cdi",
            "fail",
            "wrote no specification",
        ),
        (
            lambda f: f["gpustack_smoke"]["toolkit"]["nvidia-container-cli info"].update(stdout=""),
            "container_cli",
            "fail",
            "sees 0 GPU(s)",
        ),
        (
            lambda f: f["gpustack_status"]["runtime"].update(
                wired=False, detail="containerd config dump failed: x"
            ),
            "runtime_config",
            "fail",
            "config dump failed",
        ),
        (
            lambda f: f["gpustack_preflight"].update(nouveau_loaded=True),
            "nouveau",
            "fail",
            "nouveau is loaded",
        ),
    ],
)
def test_each_broken_part_fails_the_host(change, check, status, words):
    facts = gpu_host()
    change(facts)
    report = checks.host_smoke("gpu1", facts)
    found = report.check(check)
    assert found.status == status and words in found.summary, (found.status, found.summary)
    assert report.verdict == "fail"
    assert checks.exit_code(0, [report]) == ExitCode.VERIFY_FAILED


def test_cdi_list_without_spec_dir_falls_back_to_the_spec_file():
    facts = gpu_host()
    facts["gpustack_smoke"]["cdi"]["list"] = cmd(
        ["nvidia-ctk"], rc=1, stderr="flag provided but not defined: -spec-dir"
    )
    report = checks.host_smoke("gpu1", facts)
    cdi = report.check("cdi")
    assert cdi.status == "pass" and cdi.detail["devices_from"] == "the generated specification"
    assert f"nvidia.com/gpu={A100_UUID}" in cdi.detail["devices"]


def nvswitch_host(unit: str, packages: dict) -> dict:
    facts = gpu_host()
    facts["gpustack_preflight"]["nvswitch"] = {"present": True, "count": 6}
    facts["gpustack_smoke"]["fabric_manager"] = cmd(["systemctl"], stdout=unit)
    facts["gpustack_status"]["driver"]["packages"] = packages
    return facts


@pytest.mark.parametrize(
    ("unit", "packages", "status", "words"),
    [
        ("LoadState=not-found\nActiveState=inactive\n", {}, "fail", "not installed"),
        (
            "LoadState=loaded\nActiveState=failed\nSubState=failed\n",
            {"nvidia-fabricmanager-515": "515.105.01-1"},
            "fail",
            "failed/failed",
        ),
        (
            "LoadState=loaded\nActiveState=active\nSubState=running\n",
            {"nvidia-fabricmanager-515": "515.65.01-1"},
            "fail",
            "Fabric Manager 515.65.01 but driver 515.105.01",
        ),
        (
            "LoadState=loaded\nActiveState=active\nSubState=running\n",
            {"nvidia-fabricmanager-515": "515.105.01-1"},
            "pass",
            "nvidia-fabricmanager 515.105.01 active",
        ),
    ],
)
def test_fabric_manager_where_nvswitch_exists(unit, packages, status, words):
    report = checks.host_smoke("hgx", nvswitch_host(unit, packages))
    found = report.check("fabric_manager")
    assert found.status == status and words in found.summary, found.summary


def test_fabric_manager_is_skipped_without_nvswitch():
    assert checks.host_smoke("gpu1", gpu_host()).check("fabric_manager").status == "skipped"


@pytest.mark.parametrize(
    ("cli", "status"),
    [("1.15.0~rc.2+g6c8f1df", "warn"), ("1.18.0", "warn"), ("1.17.8-1", "pass")],
)
def test_a_container_cli_not_at_the_toolkits_version_warns(cli, status):
    """The pair NVIDIA ships at one version; apart, the hook's options break legacy mode."""
    facts = gpu_host()
    facts["gpustack_smoke"]["toolkit"]["nvidia-container-cli"]["stdout"] = f"cli-version: {cli}\n"
    report = checks.host_smoke("gpu1", facts)
    check = report.check("toolkit")
    assert check.status == status, check.summary
    assert report.verdict == "pass"
    if status == "warn":
        assert f"nvidia-container-cli {cli[:6]} is not at the toolkit's 1.17.8" in check.summary
        assert "toolkit" in report.summary.split("warnings: ")[1]


def test_pending_mig_and_ecc_changes_warn_but_do_not_fail():
    facts = gpu_host()
    uuids = ["GPU-00000000-0000-0000-0000-000000000002", "GPU-00000000-0000-0000-0000-000000000003"]
    facts["gpustack_preflight"]["gpus"]["count"] = 2
    facts["gpustack_preflight"]["driver"] = {"installed": {"package": "nvidia-driver-580", "version": "580.95.05-1"},
                                             "loaded_version": "580.95.05"}  # fmt: skip
    smoke = facts["gpustack_smoke"]
    smoke["nvidia_smi"]["stdout"] = H100X2_XML
    smoke["toolkit"]["nvidia-container-cli info"]["stdout"] = "".join(
        f"GPU UUID:   {u}\n" for u in uuids
    )
    smoke["cdi"]["list"]["stdout"] = "".join(f"nvidia.com/gpu={u}\n" for u in uuids)
    smoke["container"]["run"]["stdout"] = "gpustack-smoke-ok\n" + "".join(
        f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: {u})\n" for i, u in enumerate(uuids))  # fmt: skip
    report = checks.host_smoke("h100", facts)
    assert report.verdict == "pass", report.summary
    assert report.check("mig").status == "warn" and "GPU 0" in report.check("mig").summary
    assert report.check("ecc").status == "warn" and "GPU 1" in report.check("ecc").summary
    assert report.check("persistence").summary.startswith("disabled on GPU 1")


def test_hosts_that_did_not_run_and_run_errors_win():
    missing = checks.host_smoke("down", {})
    assert missing.verdict == "not run" and not missing.checks
    good = checks.host_smoke("gpu1", gpu_host())
    assert checks.exit_code(int(ExitCode.UNREACHABLE), [good, missing]) == ExitCode.UNREACHABLE
    assert checks.exit_code(int(ExitCode.HOST_FAILED), [good]) == ExitCode.HOST_FAILED
    assert checks.exit_code(0, [good, copy.deepcopy(good)]) == ExitCode.OK
    assert checks.exit_code(0, []) == ExitCode.VERIFY_FAILED


def test_gpu_checks_are_absent_not_failed_without_a_device():
    """A stand-in toolkit on a GPU-less lab node: the container starts but sees nothing."""
    facts = bare_host()
    facts["gpustack_status"]["runtime"] = {"kind": "containerd", "wired": True, "binary_present": True,
                                           "detail": "effective configuration (containerd config dump)"}  # fmt: skip
    facts["gpustack_smoke"]["container"] = {
        "runtime": "containerd", "skipped": None, "image": "localhost/busybox:1", "marker": "gpustack-smoke-ok",
        "run": cmd(["ctr"], rc=127, stdout="gpustack-smoke-ok\n", stderr="sh: nvidia-smi: not found\n"),
    }  # fmt: skip
    report = checks.host_smoke("lab", facts)
    container = report.check("container")
    assert container.status == "absent" and container.detail["started"] is True
    assert "no NVIDIA device to expose" in container.summary
    assert report.check("runtime_config").status == "pass"
    assert report.verdict == "no NVIDIA device"


# What NVIDIA's nvidia-ctk 1.20.2, built from its Go module, printed for `cdi generate` on a lab
# node with Debian's driver 535 installed and not loaded (tests/lab/test_smoke.py, 2026-12-04):
# warnings first, the reason last.
CTK_DRIVER_NOT_LOADED = (
    'time="2026-12-04T19:13:26Z" level=warning msg="Ignoring error in locating libnvidia-sandboxutils.so.1: libnvidia-sandboxutils.so.1: not found\\nlibnvidia-sandboxutils.so.1: not found"\n'
    'time="2026-12-04T19:13:26Z" level=warning msg="Failed to init nvsandboxutils: ERROR_LIBRARY_LOAD; ignoring"\n'
    'time="2026-12-04T19:13:26Z" level=info msg="Using /usr/lib/x86_64-linux-gnu/nvidia/current/libnvidia-ml.so.535.309.01"\n'
    'time="2026-12-04T19:13:26Z" level=info msg="Auto-detected mode as \'nvml\'"\n'
    'time="2026-12-04T19:13:26Z" level=warning msg="Could not determine driver version: libnvsandboxutils is not available\\nfailed to initialize nvml: Driver Not Loaded"\n'
    'time="2026-12-04T19:13:26Z" level=error msg="failed to generate CDI spec: failed to create device CDI specs: failed to construct device spec generators: failed to initialize NVML: Driver Not Loaded"\n'
)


def test_a_failed_nvidia_ctk_is_summarised_by_its_error_not_its_first_warning():
    facts = gpu_host()
    facts["gpustack_smoke"]["cdi"]["generate"] = cmd(
        ["nvidia-ctk", "cdi", "generate"], rc=1, stderr=CTK_DRIVER_NOT_LOADED
    )
    cdi = checks.host_smoke("gpu1", facts).check("cdi")
    assert cdi.status == "fail"
    assert cdi.summary == (
        "nvidia-ctk cdi generate: exit 1: failed to generate CDI spec: failed to create device "
        "CDI specs: failed to construct device spec generators: failed to initialize NVML: "
        "Driver Not Loaded"
    )
