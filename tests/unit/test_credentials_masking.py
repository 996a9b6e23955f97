"""Credentials stay out of everything gpustack prints or stores (issue 17): the masking helper,
the controller's hand-over of secret variables, the stamps' digests and the roles' URL helpers."""

from __future__ import annotations

import json
import os
import stat

import pytest

from gpustack import credentials
from gpustack.ansible import runner
from gpustack.errors import BadInput
from gpustack.fleet import converged
from gpustack.terminal import output
from tests.unit.host_modules import utils
from tests.unit.test_driver_filters import load

repo_filters = load("plugins/filter/apt_signed_repo.py", "asr_filters")
keyfetch = utils("gpustack_keyfetch")
stamp_filters = load("plugins/filter/gpu_converged.py", "gc_filters")
toolkit_filters = load("plugins/filter/nvidia_container_toolkit.py", "nct_filters")
driver_filters = load("plugins/filter/nvidia_driver.py", "nd_filters_sec")


@pytest.fixture(autouse=True)
def clean_registry():
    credentials.forget_all()
    yield
    credentials.forget_all()


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://alice:S3cret@mirror:8080/a", "http://alice:***@mirror:8080/a"),
        ("see https://tok3n@host/x and http://h/p@v", "see https://***@host/x and http://h/p@v"),
        ("http://u:p%40ss@h/ and file:///srv/x", "http://u:***@h/ and file:///srv/x"),
        ("'http://a:b@c'", "'http://a:***@c'"),
        ("no url here: user@example.com", "no url here: user@example.com"),
    ],
)
def test_mask_url(text, shown):
    assert credentials.mask_url(text) == shown


def test_scrub_masks_registered_secrets_and_url_credentials_everywhere():
    credentials.register("S3cretPW")
    doc = {"msg": "login failed for S3cretPW", "nvidia_driver_mirror_password": "x",
           "items": ["http://u:other@h/", {"k": "S3cretPW"}], "n": 3}  # fmt: skip
    clean = credentials.scrub_data(doc)
    text = json.dumps(clean)
    assert "S3cretPW" not in text and "other" not in text
    assert clean["n"] == 3 and clean["nvidia_driver_mirror_password"] == credentials.MASK


def test_split_extravars_keeps_secrets_out_of_the_plain_part():
    plain, secret = credentials.split_extravars({
        "nvidia_driver_version": "535.261.03-1",
        "nvidia_container_toolkit_mirror_password": "pw",
        "nvidia_driver_mirror_url": "http://u:p@mirror/cuda",
        "nested": {"x": ["https://t@h/"]},
        "nvidia_driver_mirror_password": "",
    })  # fmt: skip
    assert set(plain) == {"nvidia_driver_version", "nvidia_driver_mirror_password"}
    assert set(secret) == {"nvidia_container_toolkit_mirror_password",
                           "nvidia_driver_mirror_url", "nested"}  # fmt: skip


def test_environment_inputs_are_taken_out_of_the_environment(monkeypatch):
    monkeypatch.setattr(credentials, "_from_env", None)
    monkeypatch.setenv("GPUSTACK_NVIDIA_CONTAINER_TOOLKIT_MIRROR_PASSWORD", "envPW-123")
    monkeypatch.setenv("GPUSTACK_NVIDIA_DRIVER_MIRROR_USERNAME", "bob")
    got = credentials.environment_inputs()
    assert got == {"nvidia_container_toolkit_mirror_password": "envPW-123",
                   "nvidia_driver_mirror_username": "bob"}  # fmt: skip
    assert "GPUSTACK_NVIDIA_CONTAINER_TOOLKIT_MIRROR_PASSWORD" not in os.environ
    assert credentials.environment_inputs() == got  # read once, kept
    assert credentials.scrub("x envPW-123 y") == "x ******** y"


def test_runner_hands_secret_vars_over_in_a_0600_file(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUSTACK_STATE_DIR", str(tmp_path / "state"))
    variables = {"a": 1, "nvidia_driver_mirror_password": "pw-x"}
    plain, path = runner._secret_vars(tmp_path, variables)
    assert plain == {"a": 1}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert json.loads(path.read_text()) == {"nvidia_driver_mirror_password": "pw-x"}
    assert runner._secret_vars(tmp_path, {"a": 1}) == ({"a": 1}, None)


def test_scrub_event_masks_in_place_and_says_so():
    credentials.register("pw-event")
    event = {"event": "runner_on_failed", "event_data": {"res": {"msg": "bad pw-event"}}}
    assert credentials.scrub_event(event) is True
    assert event["event_data"]["res"]["msg"] == "bad ********"
    assert credentials.scrub_event({"event": "runner_on_ok", "event_data": {"task": "x"}}) is False


def test_output_documents_and_errors_are_scrubbed(capsys):
    credentials.register("pw-out")
    output.print_json({"hosts": {"n1": {"failures": [{"message": "pw-out and http://u:v@h/"}]}}})
    output.print_error(BadInput("bad http://u:pw-out@h/x", "hint pw-out"))
    out, err = capsys.readouterr()
    assert "pw-out" not in out + err and ":v@" not in out
    assert "http://u:***@h/x" in err


def test_converged_reasons_never_show_a_secret():
    reason = converged._input_reason("r", "nvidia_driver_mirror_password", "<d1>", "<d2>")
    assert reason == "r: input nvidia_driver_mirror_password changed"
    url_then = "http://h/x (credentials <secret pbkdf2-sha256:aa>)"  # as the stamps record them
    url_now = "http://h/x (credentials <secret pbkdf2-sha256:bb>)"
    assert converged._input_reason("r", "x_url", url_now, url_then) == (
        "r: input x_url changed (credentials)"
    )
    assert "http://h/y" in converged._input_reason("r", "x_url", "http://h/y", "http://h/x")


def test_stamp_inputs_hold_digests_that_change_with_the_secret(tmp_path):
    pw_file = tmp_path / "pw"
    pw_file.write_text("FilePW-1\n")
    inputs = {
        "nvidia_driver_mirror_password": "PlainPW-1",
        "nvidia_driver_mirror_password_file": str(pw_file),
        "nvidia_driver_mirror_url": "http://u:UrlPW-1@h/cuda",
        "nvidia_driver_version": "535.261.03-1",
        "nvidia_driver_packages": ["a"],
        "unset": "__unset__",
    }
    first = stamp_filters.redact_inputs(inputs)
    text = json.dumps(first)
    # the CLI's masking (events, output) must leave the digests alone, or a rotated password
    # would look unchanged to the fast path
    assert credentials.scrub_event({"event_data": {"res": first}}) is False
    assert first["nvidia_driver_mirror_url"].startswith("http://h/cuda (credentials <secret ")
    assert not any(pw in text for pw in ("PlainPW-1", "FilePW-1", "UrlPW-1"))
    assert first["nvidia_driver_version"] == "535.261.03-1" and first["unset"] == "__unset__"
    assert stamp_filters.redact_inputs(inputs) == first  # stable: probe and record compare
    pw_file.write_text("FilePW-2\n")
    second = stamp_filters.redact_inputs({**inputs, "nvidia_driver_mirror_password": "PlainPW-2",
                                          "nvidia_driver_mirror_url": "http://u:UrlPW-2@h/cuda"})  # fmt: skip
    for name in ("nvidia_driver_mirror_password", "nvidia_driver_mirror_password_file",
                 "nvidia_driver_mirror_url"):  # fmt: skip
        assert second[name] != first[name], name


def test_repository_credentials_split():
    got = repo_filters.credentials("http://al%40ice:p%3Ass@mirror:8080/deb/$(ARCH)")
    assert got == {"url": "http://mirror:8080/deb/$(ARCH)", "username": "al@ice",
                   "password": "p:ss", "machine": "http://mirror:8080/deb"}  # fmt: skip
    explicit = repo_filters.credentials("https://u:p@m/x/", "bob", "pw")
    assert (explicit["username"], explicit["password"], explicit["machine"]) == (
        "bob", "pw", "https://m/x")  # fmt: skip
    assert repo_filters.credentials("https://m/x")["machine"] == ""
    assert repo_filters.credentials("file:///srv/m", "u", "p")["username"] == ""


def test_key_gets_the_repository_credentials_only_on_the_same_origin():
    same = repo_filters.credentials("http://m:81/deb", "u", "p", "http://m:81/key.asc")
    other = repo_filters.credentials("http://m:81/deb", "u", "p", "https://keys.example/k")
    own = repo_filters.credentials("http://m:81/deb", "u", "p", "http://k:kp@m:81/key")
    local = repo_filters.credentials("http://m:81/deb", "u", "p", "file:///srv/key")
    assert (same["username"], same["password"]) == ("u", "p")
    assert (other["username"], other["password"]) == ("", "")
    assert (own["url"], own["username"], own["password"]) == ("http://m:81/key", "k", "kp")
    assert local["password"] == ""


@pytest.mark.parametrize(
    ("result", "words"),
    [
        ({"status_code": 401, "response": "HTTP Error 401: Unauthorized", "msg": "Request failed"},
         ["HTTP 401", "refused the credentials", "password (x_username)"]),
        ({"status_code": -1, "msg": "Request failed: <urlopen error [Errno 111] Connection refused>"},
         ["connection", "cannot reach"]),
        ({"status_code": -1, "msg": "Request failed: <urlopen error [Errno -2] Name or service not known>"},
         ["DNS", "cannot resolve"]),
        ({"status_code": 404, "response": "HTTP Error 404: Not Found", "msg": "Request failed"},
         ["HTTP 404", "no key at that URL"]),
        ({"msg": "Request failed: <urlopen error [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed>"},
         ["TLS", "CA certificate"]),
    ],
)  # fmt: skip
def test_key_fetch_failures_name_the_cause(result, words):
    text = keyfetch.fetch_failure(result, "http://m/key", "x_username")
    assert text.startswith("cannot fetch the signing key from http://m/key: ")
    assert "Nothing was changed. Hint: " in text
    assert "failed:" not in text  # the driver role's rescue strips up to a "failed:"
    for word in words:
        assert word in text, text


def test_driver_url_credentials_and_toolkit_madison():
    assert driver_filters.url_credentials("http://a%2Bb:c%40d@h/x") == ["a+b", "c@d"]
    assert driver_filters.url_credentials("http://h/x") == ["", ""]
    madison = (" nvidia-container-toolkit | 1.18.0-1 | http://m/ Packages\n"
               " nvidia-container-toolkit | 1.17.8-1 | http://m/ Packages\n")  # fmt: skip
    assert toolkit_filters.madison_versions(madison) == ["1.18.0-1", "1.17.8-1"]
    assert toolkit_filters.madison_versions("") == []


def test_stamps_are_written_0600_and_rewritten_only_on_change(tmp_path):
    import subprocess
    import sys

    from tests.conftest import ROOT

    def record(content: str) -> dict:
        args = tmp_path / "args.json"
        args.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": {
            "dir": str(tmp_path / "converged"), "role": "nvidia_driver",
            "stamp": {"content": content, "inputs": {}}}}))  # fmt: skip
        module = ROOT / "plugins/modules/gpustack_converged.py"
        proc = subprocess.run([sys.executable, "-m", "tests.unit.host_modules", str(module),
                               str(args)], capture_output=True, text=True, cwd=ROOT)  # fmt: skip
        return json.loads(proc.stdout)

    assert record("a")["changed"] is True
    stamp = tmp_path / "converged/nvidia_driver.json"
    assert stat.S_IMODE(stamp.stat().st_mode) == 0o600
    assert record("a")["changed"] is False
    stamp.chmod(0o644)  # a stamp of an older gpustack: tightened on the next run
    assert record("a")["changed"] is True and stat.S_IMODE(stamp.stat().st_mode) == 0o600


def test_several_stamps_in_one_call_each_rewritten_only_on_change(tmp_path):
    from tests.conftest import ROOT
    from tests.unit.host_modules import run_module

    module = ROOT / "plugins/modules/gpustack_converged.py"
    where = str(tmp_path / "converged")

    def record(**args) -> dict:
        return run_module(module, {"dir": where, **args}, tmp_path)

    stamps = [{"role": "nvidia_driver", "stamp": {"content": "a"}},
              {"role": "container_runtime", "stamp": {"content": "a"}, "services": ["containerd"]}]  # fmt: skip
    first = record(stamps=stamps)
    assert first["changed"] is True
    assert first["changed_paths"] == [
        f"{where}/nvidia_driver.json",
        f"{where}/container_runtime.json",
    ]
    assert json.loads((tmp_path / "converged/container_runtime.json").read_text())["role"] == (
        "container_runtime"
    )
    assert record(stamps=stamps)["changed"] is False
    stamps[1]["stamp"] = {"content": "b"}
    assert record(stamps=stamps)["changed_paths"] == [f"{where}/container_runtime.json"]
    # The single-stamp form writes the same file as an item of `stamps`.
    assert (
        record(role="container_runtime", stamp={"content": "b"}, services=["containerd"])["changed"]
        is False
    )
    assert "mutually exclusive" in record(role="nvidia_driver", stamps=stamps)["msg"]
    assert record(stamps=[{"role": "x", "colour": "red"}])["failed"] is True
    assert record(stamps=[{"stamp": {}}])["failed"] is True  # a stamp needs its role
