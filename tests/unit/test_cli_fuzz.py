"""Property-based fuzz of the CLI (hypothesis): whatever the arguments, `gpustack.cli.main`
either reaches the point where a playbook would start (a run is refused here by replacing the
one function that starts runs, gpustack's own `runner.run_playbook`) or ends with one `Error:`
line, one `Hint:` line and exit 2 — never an exception, never a traceback.

No host is contacted: the inventories point at 127.0.0.1 port 9 and no run starts.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpustack import cli
from gpustack.ansible import runner

COMMANDS = ["install", "plan", "doctor", "status", "smoke", "uninstall", "upgrade", "verify"]
ROLE_NAMES = ["nvidia_driver_branch", "nvidia_driver_version", "nvidia_driver_source",
              "nvidia_driver_reboot", "nvidia_driver_reboot_timeout", "nvidia_driver_packages",
              "container_runtime_nvidia_default", "container_runtime_nvidia_runtime_extra",
              "nvidia_driver_mirror_url", "gpustack_require_gpu", "nvidia_driver_rebot",
              "ansible_connection", "ansible_port", "gpustack_k8s_namespace"]  # fmt: skip
FRAGMENTS = ["{", "}", "[", "]", "&a", "*a", "!vault |", "{{ x }}", "{{", "'", '"', "=", "@",
             ":", "\\", "%", "\n", "\x00", "\udcff", "ñ", "1e999", "-1", "9" * 30, "yes", "y",
             "nan", "inf", " ", ",", "!", "~"]  # fmt: skip


class Reached(BaseException):
    """A playbook run would start here (a BaseException: no handler of gpustack catches it)."""


def _stop(*args, **kwargs):
    raise Reached


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fuzz")
    (tmp / "inv.ini").write_text("[gpu_nodes]\nn1 ansible_host=127.0.0.1 ansible_port=9\n")
    (tmp / "vars.yml").write_text("nvidia_driver_branch: '580'\n")
    (tmp / "binary").write_bytes(os.urandom(512))
    (tmp / "retry").write_text("n1\n")
    return tmp


text = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=12), max_size=6).map("".join)


@st.composite
def argv(draw, tmp):
    command = draw(st.sampled_from(COMMANDS))
    inventory = draw(st.sampled_from([f"{tmp}/inv.ini", f"{tmp}/binary", f"{tmp}/none", "",
                                      "/dev/null", draw(text)]))  # fmt: skip
    args = [command, inventory]
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["e", "e-kv", "e-file", "limit", "forks", "output", "tags",
                                     "vault", "junk", "driver"]))  # fmt: skip
        if kind == "e":
            args += ["-e", draw(text)]
        elif kind == "e-kv":
            args += ["-e", f"{draw(st.sampled_from(ROLE_NAMES))}={draw(text)}"]
        elif kind == "e-file":
            args += ["-e", "@" + draw(st.sampled_from([f"{tmp}/vars.yml", f"{tmp}/binary",
                                                       f"{tmp}/none", draw(text)]))]  # fmt: skip
        elif kind == "limit":
            args += ["--limit", draw(st.sampled_from([f"@{tmp}/retry", "n1", draw(text)]))]
        elif kind == "forks":
            args += ["--forks", draw(st.sampled_from(["0", "1", "-3", "1e3", "9" * 30, "x"]))]
        elif kind == "output":
            args += ["-o", draw(st.sampled_from(["json", "text", "wide", draw(text)]))]
        elif kind == "tags":
            args += ["--tags", draw(text)]
        elif kind == "vault":
            args += ["--vault-password-file", draw(st.sampled_from([f"{tmp}/none", "-", ""]))]
        elif kind == "driver":
            args += ["--driver-version", draw(text)]
        else:
            args.append(draw(text))
    return args


@settings(max_examples=150, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])  # fmt: skip
@given(data=st.data())
def test_any_arguments_end_in_a_run_or_one_error(files, monkeypatch, capsys, tmp_path_factory,
                                                 data):  # fmt: skip
    monkeypatch.setattr(runner, "run_playbook", _stop)
    monkeypatch.setenv("GPUSTACK_STATE_DIR", str(tmp_path_factory.mktemp("state")))
    monkeypatch.setenv("KUBECONFIG", "")
    args = data.draw(argv(files))
    try:
        code = cli.main(args)
    except Reached:
        return
    finally:
        out, err = capsys.readouterr()
    assert "Traceback" not in out + err, (args, err)
    if code == 0:
        return  # help, or a command that had nothing to run
    lines = err.strip().splitlines()
    assert code == 2, (args, code, err)
    assert len(lines) == 2, (args, err)
    assert lines[0].startswith("Error: ") and lines[1].startswith("Hint: "), (args, err)
