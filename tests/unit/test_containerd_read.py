"""gpustack_containerd_read (plugins/modules, used by roles/container_runtime): containerd's
version, files and loaded configuration in one module call.

Runs the module as a script against a TEST DOUBLE of the containerd binary (`--version`, and
`config dump` printing the file it was given; a file containing BROKEN fails as containerd does on
a TOML error). On lab nodes the module runs against Debian's real containerd 1.6 / 1.7 / 2.1
(tests/lab: every install on containerd, the broken-config refusal, the lost-restart kill test).
"""

from __future__ import annotations

import base64
import shutil

from tests.conftest import ROOT
from tests.unit.host_modules import run_module

MODULE = ROOT / "plugins/modules/gpustack_containerd_read.py"
FAKE_CONTAINERD = r"""#!/bin/sh
# TEST DOUBLE (gpustack unit tests): containerd --version / --config FILE config dump.
if [ "$1" = --version ]; then
  [ -e "$FAKE_CONTAINERD_DIR/version-fails" ] && { echo "containerd: broken install" >&2; exit 1; }
  echo "containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1"; exit 0
fi
[ "$1" = --config ] && [ "$3" = config ] && [ "$4" = dump ] || exit 2
echo "$2" >> "$FAKE_CONTAINERD_DIR/dumps"
if grep -q BROKEN "$2"; then
  echo "failed to load TOML: $2: (1, 1): unexpected token" >&2; exit 1
fi
echo "version = 2"; cat "$2"
"""


def run(tmp_path, **paths) -> dict:
    module_args = {
        "config": str(tmp_path / "etc/config.toml"),
        "dropin": str(tmp_path / "etc/conf.d/99-nvidia.toml"),
        "record": str(tmp_path / "state/container_runtime.json"),
        "marker": str(tmp_path / "state/containerd.restart-pending"),
        "socket": str(tmp_path / "containerd.sock"),  # no daemon: CRI cannot be asked
        **paths,
    }
    return run_module(MODULE, module_args, tmp_path, {"containerd": FAKE_CONTAINERD},
                      {"FAKE_CONTAINERD_DIR": str(tmp_path)})  # fmt: skip


def dumps(tmp_path) -> list[str]:
    return (tmp_path / "dumps").read_text().splitlines()


def test_fresh_host_dumps_the_built_in_defaults_once(tmp_path):
    result = run(tmp_path)
    assert not result.get("failed"), result
    assert result["version"].split()[2] == "1.6.20~ds1"
    assert result["main"] == {"exists": False, "content": ""}
    assert result["dump"] == {"rc": 0, "stdout": "version = 2\n", "stderr": ""}
    assert result["record_exists"] is False and result["dropin_dir_exists"] is False
    assert result["dropin"] == {"exists": False, "content": ""}
    assert result["restart_needed"] is False and result["loaded"]["available"] is False
    # the loaded-state check reuses the dump (one `config dump` per module run)
    assert dumps(tmp_path) == ["/dev/null"]


def test_existing_files_record_and_marker(tmp_path):
    (tmp_path / "etc/conf.d").mkdir(parents=True)
    (tmp_path / "state").mkdir()
    main = 'imports = ["/etc/containerd/conf.d/*.toml"]\n# the user\'s comment\n'
    (tmp_path / "etc/config.toml").write_text(main)
    (tmp_path / "etc/conf.d/99-nvidia.toml").write_text("# gpustack\n")
    (tmp_path / "state/container_runtime.json").write_text("{}")
    (tmp_path / "state/containerd.restart-pending").write_text("pending\n")
    result = run(tmp_path)
    assert base64.b64decode(result["main"]["content"]).decode() == main
    assert result["main"]["exists"] is True
    assert result["dump"]["stdout"] == "version = 2\n" + main
    assert result["record_exists"] is True and result["dropin_dir_exists"] is True
    assert base64.b64decode(result["dropin"]["content"]) == b"# gpustack\n"
    assert result["restart_pending"] is True and result["restart_needed"] is True
    assert dumps(tmp_path) == [str(tmp_path / "etc/config.toml")]


def test_a_configuration_containerd_rejects_is_reported_not_failed(tmp_path):
    """The role refuses it with containerd's message; the module only reports."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/config.toml").write_text("BROKEN [\n")
    result = run(tmp_path)
    assert not result.get("failed"), result
    assert result["dump"]["rc"] == 1 and "unexpected token" in result["dump"]["stderr"]
    assert result["disk"]["error"] and result["differences"] == []


def test_an_unreadable_main_configuration_fails_instead_of_reading_as_empty(tmp_path):
    (tmp_path / "etc/config.toml").mkdir(parents=True)  # exists, cannot be read as a file
    result = run(tmp_path)
    assert result["failed"] is True
    assert result["msg"].startswith(f"cannot read {tmp_path / 'etc/config.toml'}:")
    assert "gpustack changed nothing" in result["msg"] and "Hint: " in result["msg"]


def test_a_failing_containerd_binary_fails_the_module(tmp_path):
    (tmp_path / "version-fails").write_text("")
    result = run(tmp_path)
    assert result["failed"] is True
    assert result["msg"].startswith(
        "containerd --version failed: containerd: broken install. Hint: "
    )


LOADED = ROOT / "plugins/modules/gpustack_containerd_loaded.py"


def test_the_verify_read_adds_the_binary_and_the_dump_to_the_loaded_check(tmp_path):
    """gpustack_containerd_loaded with `binary` (container_runtime's verify step): one dump."""
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/config.toml").write_text("# wired\n")
    (tmp_path / "nvidia-container-runtime").write_text("")
    args = {"config": str(tmp_path / "etc/config.toml"), "socket": str(tmp_path / "containerd.sock"),
            "binary": str(tmp_path / "nvidia-container-runtime")}  # fmt: skip
    result = run_module(LOADED, args, tmp_path, {"containerd": FAKE_CONTAINERD},
                        {"FAKE_CONTAINERD_DIR": str(tmp_path)})  # fmt: skip
    assert result["binary_exists"] is True
    assert result["dump"] == {"rc": 0, "stdout": "version = 2\n# wired\n", "stderr": ""}
    assert dumps(tmp_path) == [str(tmp_path / "etc/config.toml")]


FAKE_CTR = """#!/bin/sh
# TEST DOUBLE (gpustack unit tests): ctr run logs its arguments; prints the marker from the
# try named in $FAKE_CONTAINERD_DIR/ok-from (ctr losing a short-lived container's output before).
echo "$*" >> "$FAKE_CONTAINERD_DIR/ctr.log"
n=$(wc -l < "$FAKE_CONTAINERD_DIR/ctr.log")
[ "$n" -ge "$(cat "$FAKE_CONTAINERD_DIR/ok-from")" ] && echo gpustack-runtime-ok
exit 0
"""


def loaded_with_container(tmp_path, ok_from=1, ctr=True, **spec) -> dict:
    """gpustack_containerd_loaded with test_container and no CRI socket (the configured binary
    stands in), against the fake containerd and ctr; ctr=False: no ctr anywhere in PATH."""
    (tmp_path / "etc").mkdir(exist_ok=True)
    (tmp_path / "etc/config.toml").write_text("# wired\n")
    (tmp_path / "nvidia-container-runtime").write_text("")
    (tmp_path / "ok-from").write_text(f"{ok_from}\n")
    fakes = {"containerd": FAKE_CONTAINERD}
    if ctr:
        fakes["ctr"] = FAKE_CTR
    else:  # the tools the fakes use, and nothing else (a ctr on this machine must not be found)
        tools = tmp_path / "tools"
        tools.mkdir()
        for tool in ("cat", "grep", "wc"):
            (tools / tool).symlink_to(shutil.which(tool))
    args = {"config": str(tmp_path / "etc/config.toml"), "socket": str(tmp_path / "containerd.sock"),
            "binary": str(tmp_path / "nvidia-container-runtime"),
            "test_container": {"image": "docker.io/library/busybox:1.36",
                               "container": "gpustack-verify-n1",
                               "ctr_args": ["--memory-limit", "67108864"], **spec}}  # fmt: skip
    return run_module(LOADED, args, tmp_path, fakes, {"FAKE_CONTAINERD_DIR": str(tmp_path)},
                      path=None if ctr else str(tmp_path / "tools"))  # fmt: skip


def test_the_test_container_runs_through_the_configured_binary_without_cri(tmp_path):
    result = loaded_with_container(tmp_path)
    assert result["loaded"]["available"] is False
    run = result["run"]
    assert run["rc"] == 0 and "gpustack-runtime-ok" in run["stdout"] and run["attempts"] == 1
    assert (tmp_path / "ctr.log").read_text().split() == [
        "--namespace", "gpustack", "run", "--rm", "--snapshotter", "overlayfs",
        "--runtime", "io.containerd.runc.v2",
        "--runc-binary", str(tmp_path / "nvidia-container-runtime"), "--memory-limit", "67108864",
        "docker.io/library/busybox:1.36", "gpustack-verify-n1", "/bin/sh", "-c",
        "echo", "gpustack-runtime-ok"]  # fmt: skip


def test_the_test_container_is_tried_again_when_ctr_lost_its_output(tmp_path):
    result = loaded_with_container(tmp_path, ok_from=2, snapshotter="native")
    assert result["run"]["attempts"] == 2 and "gpustack-runtime-ok" in result["run"]["stdout"]
    assert "--snapshotter native" in (tmp_path / "ctr.log").read_text()
    never = (
        loaded_with_container(tmp_path / "x", ok_from=9) if (tmp_path / "x").mkdir() is None else {}
    )
    assert never["run"]["attempts"] == 3 and never["run"]["stdout"] == ""


def test_the_test_container_is_skipped_without_an_image_and_fails_without_ctr(tmp_path):
    assert loaded_with_container(tmp_path, image="")["run"] == {"skipped": True}
    assert not (tmp_path / "ctr.log").exists()
    (tmp_path / "y").mkdir()
    missing = loaded_with_container(tmp_path / "y", ctr=False)["run"]
    assert missing["rc"] == 127 and missing["stderr"] == "ctr: not found in PATH"
