"""Mirror credentials and unusable sources on real lab nodes (issue 17), and a SIGKILL between
writing a package source and refreshing the lists (issue 16, item 1).

Each node serves its /srv over HTTP with basic auth on its own loopback
(lab_fixtures.serve_with_auth): the stand-in toolkit repository and the stand-in CUDA-layout
driver mirror of tests/fixtures/lab_fixtures.py (TEST FIXTURES: they prove source, key and
credential handling with real apt, nothing about NVIDIA's packages). Real apt, real systemd,
Debian's containerd.

* install with credentialed driver and toolkit mirrors (password file, environment variable),
  then every place gpustack writes is searched for the password: controller stdout/stderr, the
  report, every file of the run state directory (ansible-runner's env/, job_events, stdout,
  command), and on the nodes /etc, /var, /root, /tmp, /run and the keyrings. The only hits
  allowed are apt's credential files, mode 0600.
* a rotated password given in the URL: the fast path notices, the old password is gone.
* unusable mirrors (401, connection refused, DNS, 404, bad driver credentials, a fresh node):
  the host fails with apt's reason and a hint, /etc/apt is byte-identical, apt-get update is
  clean afterwards.
* SIGKILL of `gpustack install` (the whole process tree) right after `Enable the archive
  components that carry the NVIDIA driver` and after/during `apt_signed_repo : Write the
  repository source`; the re-run converges, a further run changes nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import GPUSTACK, ROOT, lab_nodes, run_cli
from tests.fixtures import lab_fixtures
from tests.lab.test_lab import ssh

pytestmark = pytest.mark.lab

LAB = os.environ.get("GPUSTACK_I17_LAB") or f"i17c{os.getpid()}"
N1, N2 = f"{LAB}-node1", f"{LAB}-node2"
PORT, SLOW_PORT = 8089, 8091
USER = "gpustack-mirror"
PASSWORD = "i17-" + secrets.token_hex(12)
NEW_PASSWORD = "i17-new-" + secrets.token_hex(12)
DRIVER_BASE = f"http://127.0.0.1:{PORT}/gpustack-fixture-driver-mirror"
TOOLKIT_BASE = f"http://127.0.0.1:{PORT}/gpustack-fixture-repo"
AUTH_FILES = {"/etc/apt/auth.conf.d/gpustack-nvidia-cuda.conf",
              "/etc/apt/auth.conf.d/gpustack-nvidia-container-toolkit.conf"}  # fmt: skip
# Where gpustack (or apt, or ansible on its behalf) writes on a node. /srv holds the fixture
# server and its own password file; /var/cache/apt/archives is the shared package cache.
NODE_PLACES = "/etc /var/lib /var/log /var/backups /var/tmp /root /tmp /run /usr/share/keyrings"
APT_SNAPSHOT = "find /etc/apt -type f | sort | xargs -r stat -c '%n %a %U' ; " \
               "find /etc/apt -type f | sort | xargs -r sha256sum"  # fmt: skip
TIMINGS: dict[str, float] = {}
RECORD: dict[str, object] = {}


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    work = tmp_path_factory.mktemp("i17")
    inventory = work / "lab.ini"
    start = time.monotonic()
    # GPUSTACK_I17_KEEP: keep the nodes to look at them (then: lab down)
    with lab_nodes(LAB, 2, inventory, keep=bool(os.environ.get("GPUSTACK_I17_KEEP"))):
        containers = [f"gpustack-{n}" for n in (N1, N2)]
        fixture_vars = json.loads(
            lab_fixtures.prepare(containers, work / "fixture.json").read_text()
        )
        driver = lab_fixtures.publish_driver_mirror(containers)
        for container in containers:
            lab_fixtures.serve_with_auth(container, PORT, USER, PASSWORD)
        TIMINGS["lab up + fixtures"] = round(time.monotonic() - start, 1)
        password_file = work / "driver-password"
        password_file.write_text(PASSWORD + "\n")
        password_file.chmod(0o600)
        variables = {
            **fixture_vars,
            "nvidia_driver_source": "mirror",
            "nvidia_driver_mirror_url": DRIVER_BASE,
            "nvidia_driver_mirror_key_url": f"{DRIVER_BASE}/gpgkey",
            "nvidia_driver_mirror_key_fingerprint": driver["fingerprint"],
            "nvidia_driver_mirror_username": USER,
            "nvidia_driver_mirror_password_file": str(password_file),
            "nvidia_driver_persistenced": False,  # the stand-in mirror has no nvidia-persistenced
            "nvidia_container_toolkit_mirror_url": f"{TOOLKIT_BASE}/stable/deb",
            "nvidia_container_toolkit_mirror_key_url": f"{TOOLKIT_BASE}/gpgkey",
            "nvidia_container_toolkit_mirror_username": USER,
        }
        varsfile = work / "vars.json"
        varsfile.write_text(json.dumps(variables))
        yield {"inventory": inventory, "vars": varsfile, "work": work, "variables": variables,
               "password_file": password_file, "driver": driver}  # fmt: skip
        print("\ni17 lab timings (s):", json.dumps(TIMINGS, indent=2))
        print("i17 outcomes:", json.dumps(RECORD, indent=2))


def gpustack(lab, name: str, *args: str, env: dict | None = None, state: Path | None = None):
    """One gpustack command; its stdout/stderr are kept for the secret search."""
    state = state or lab["work"] / "state"
    start = time.monotonic()
    proc = run_cli(*args, env={"GPUSTACK_STATE_DIR": str(state), **(env or {})}, timeout=1800)
    TIMINGS[name] = round(time.monotonic() - start, 1)
    (lab["work"] / "outputs").mkdir(exist_ok=True)
    (lab["work"] / "outputs" / f"{name}.out").write_text(proc.stdout)
    (lab["work"] / "outputs" / f"{name}.err").write_text(proc.stderr)
    return proc


def toolkit_env(password=PASSWORD) -> dict:
    return {"GPUSTACK_NVIDIA_CONTAINER_TOOLKIT_MIRROR_PASSWORD": password}


def controller_hits(lab, *words: str) -> list[str]:
    """Files on the controller written by gpustack (outputs, reports, run state) holding a word."""
    hits = []
    for path in sorted(lab["work"].rglob("*")):
        if not path.is_file() or path in (lab["vars"], lab["password_file"]):
            continue  # the user's own inputs
        if path.name in ("vars-rotated.json",):
            continue
        data = path.read_bytes()
        hits += [f"{path}: {w}" for w in words if w.encode() in data]
    return hits


def node_hits(lab, host: str, word: str) -> set[str]:
    proc = ssh(lab["inventory"], host,
               f"grep -rl --binary-files=text -F -e '{word}' {NODE_PLACES} 2>/dev/null; true")  # fmt: skip
    return set(proc.stdout.split())


def apt_update_complaints(lab, host: str) -> list[str]:
    proc = ssh(lab["inventory"], host, "LANG=C apt-get update 2>&1")
    return [line for line in proc.stdout.splitlines() if line.startswith(("W:", "E:", "Err:"))]


def installed(lab) -> None:
    """Precondition of the later tests: the first test's install is on the nodes."""
    for host in (N1, N2):
        proc = ssh(lab["inventory"], host, "test -s /etc/apt/auth.conf.d/gpustack-nvidia-cuda.conf")
        assert proc.returncode == 0, f"{host}: needs the credentialed install of the first test"


def test_install_with_credentialed_mirrors_leaves_the_password_nowhere(lab):
    inv, varsfile = str(lab["inventory"]), f"@{lab['vars']}"
    report = lab["work"] / "report.json"
    proc = gpustack(lab, "install", "install", inv, "-e", varsfile, "--output", "json",
                    "--report", str(report), "-v", env=toolkit_env())  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    for host in (N1, N2):
        facts = doc["hosts"][host]["facts"]
        assert facts["gpustack_driver"]["installed_version"] == lab["driver"]["versions"][-1]
        assert facts["gpustack_driver"]["state"] == "installed, not loaded: no NVIDIA device"
        assert facts["gpustack_toolkit"]["installed_version"] == lab_fixtures.BUILT_VERSION
    # the same again: the fast path (stamps with secret digests) skips both hosts
    again = gpustack(lab, "install again", "install", inv, "-e", varsfile, "--output", "json",
                     env=toolkit_env())  # fmt: skip
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    assert {h: v["converged"] for h, v in json.loads(again.stdout)["hosts"].items()} == {
        N1: True, N2: True}  # fmt: skip
    status = gpustack(lab, "status", "status", inv, "-e", varsfile, "--output", "json",
                      env=toolkit_env())  # fmt: skip
    assert status.returncode in (0, 5), status.stderr

    hits = controller_hits(lab, PASSWORD)
    assert hits == [], hits
    state = lab["work"] / "state" / "runs"
    assert list(state.rglob("gpustack-masked.json")) == [], "a task let a secret through"
    assert list(state.rglob("secret-vars.json")) == [], "the 0600 hand-over file is gone"
    searched = [p for p in state.rglob("*") if p.is_file()]
    assert any(p.name == "extravars" for p in searched) and any(
        p.name == "command" for p in searched
    )
    assert sum(1 for p in searched if p.parent.name == "job_events") > 100
    for host in (N1, N2):
        assert node_hits(lab, host, PASSWORD) == AUTH_FILES, host
        for path in AUTH_FILES:
            mode = ssh(lab["inventory"], host, f"stat -c '%a %U %G' {path}").stdout.split()
            assert mode == ["600", "root", "root"], (host, path, mode)
        text = ssh(
            lab["inventory"], host, "cat /etc/apt/auth.conf.d/gpustack-nvidia-cuda.conf"
        ).stdout
        # the protocol always (else apt uses it for https only), the repository's own path
        assert text == f"machine {DRIVER_BASE}/debian12/x86_64 login {USER} password {PASSWORD}\n"
        sources = ssh(
            lab["inventory"], host, "cat /etc/apt/sources.list.d/gpustack-*.sources"
        ).stdout
        assert f"URIs: {DRIVER_BASE}/debian12/x86_64/" in sources and "@" not in sources
        stamps = ssh(
            lab["inventory"], host, "stat -c '%a' /var/lib/gpustack/converged/*.json"
        ).stdout
        assert set(stamps.split()) == {"600"}
        assert apt_update_complaints(lab, host) == [], host


def test_rotated_password_in_the_url_is_noticed_and_the_old_one_is_gone(lab):
    installed(lab)
    for host in (N1, N2):
        lab_fixtures.serve_with_auth(f"gpustack-{host}", PORT, USER, NEW_PASSWORD)
    lab["password_file"].write_text(NEW_PASSWORD + "\n")
    rotated = {**lab["variables"],
               "nvidia_container_toolkit_mirror_url":
                   f"http://{USER}:{NEW_PASSWORD}@127.0.0.1:{PORT}/gpustack-fixture-repo/stable/deb"}  # fmt: skip
    del rotated["nvidia_container_toolkit_mirror_username"]
    varsfile = lab["work"] / "vars-rotated.json"
    varsfile.write_text(json.dumps(rotated))
    # plan shows the changed credentials as a change of the credential files, never their text
    plan = gpustack(lab, "plan rotated", "plan", str(lab["inventory"]), "-e", f"@{varsfile}", "-v",
                    "--limit", N1)  # fmt: skip
    assert plan.returncode == 0, plan.stdout[-3000:] + plan.stderr[-2000:]
    assert "gpustack-nvidia-container-toolkit.conf" in plan.stdout, plan.stdout[-3000:]
    assert "+(new credentials, not shown)" in plan.stdout, plan.stdout[-3000:]
    proc = gpustack(lab, "install rotated", "install", str(lab["inventory"]), "-e", f"@{varsfile}",
                    "--output", "json", "-v")  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-3000:]
    doc = json.loads(proc.stdout)
    for host in (N1, N2):
        reasons = " | ".join(doc["hosts"][host]["facts"]["gpustack_converged"]["reasons"])
        assert "input nvidia_driver_mirror_password_file changed" in reasons, reasons
        # the URL now carries the credentials: shown masked, and the password input went away
        assert "input nvidia_container_toolkit_mirror_url is 'http://127.0.0.1:" in reasons
        assert "stable/deb (credentials <secret>)', was 'http://127.0.0.1:" in reasons
        assert "input nvidia_container_toolkit_mirror_password changed" in reasons, reasons
        assert node_hits(lab, host, PASSWORD) == set(), "no backup keeps the old password"
        assert node_hits(lab, host, NEW_PASSWORD) == AUTH_FILES
        assert apt_update_complaints(lab, host) == []
    assert controller_hits(lab, PASSWORD, NEW_PASSWORD) == []
    assert list((lab["work"] / "state").rglob("gpustack-masked.json")) == []
    # back to the first password for the tests below
    for host in (N1, N2):
        lab_fixtures.serve_with_auth(f"gpustack-{host}", PORT, USER, PASSWORD)
    lab["password_file"].write_text(PASSWORD + "\n")
    assert gpustack(lab, "install restored", "install", str(lab["inventory"]), "-e",
                    f"@{lab['vars']}", env=toolkit_env()).returncode == 0  # fmt: skip


FILE_KEY = f"file://{lab_fixtures.REPO_IN_NODE}/gpgkey"  # the key stays reachable: apt fails
FAILING = {
    "401": ({"nvidia_container_toolkit_mirror_key_url": FILE_KEY}, "wrong-password",
            ["401", "Unauthorized", "Hint: the mirror refused the credentials"]),
    "refused": ({"nvidia_container_toolkit_mirror_url": "http://127.0.0.1:8099/stable/deb",
                 "nvidia_container_toolkit_mirror_key_url": FILE_KEY}, PASSWORD,
                ["Could not connect", "Connection refused", "Hint: the node cannot reach"]),
    "dns": ({"nvidia_container_toolkit_mirror_url": "http://gpustack-i17-nosuch.invalid/stable/deb",
             "nvidia_container_toolkit_mirror_key_url": FILE_KEY}, PASSWORD,
            ["resolve", "Hint: the node cannot resolve"]),
    "404": ({"nvidia_container_toolkit_mirror_url": f"http://127.0.0.1:{PORT}/nope/stable/deb",
             "nvidia_container_toolkit_mirror_key_url": FILE_KEY}, PASSWORD,
            ["404", "Hint: no repository at that URL"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(FAILING))
def test_unusable_toolkit_mirror_leaves_the_sources_as_before(lab, case):
    installed(lab)
    overrides, password, words = FAILING[case]
    before = ssh(lab["inventory"], N1, APT_SNAPSHOT).stdout
    varsfile = lab["work"] / f"vars-{case}.json"
    varsfile.write_text(json.dumps({**lab["variables"], **overrides}))
    # plan proves the changed source on copies (apt-get update there): the same cause, no write
    lists = "ls -la --time-style=full-iso /var/lib/apt/lists"
    lists_before = ssh(lab["inventory"], N1, lists).stdout
    plan = gpustack(lab, f"plan failing {case}", "plan", str(lab["inventory"]), "-e", f"@{varsfile}",
                    "--limit", N1, "--tags", "nvidia_container_toolkit", "--output", "json",
                    env=toolkit_env(password))  # fmt: skip
    assert plan.returncode == 1, plan.stdout[-3000:] + plan.stderr[-2000:]
    planned = json.loads(plan.stdout)["hosts"][N1]["failures"][-1]["message"]
    for word in words:
        assert word in planned, planned
    assert "Nothing was written (check mode)" in planned, planned
    assert ssh(lab["inventory"], N1, APT_SNAPSHOT).stdout == before
    assert ssh(lab["inventory"], N1, lists).stdout == lists_before, "the node's lists untouched"
    proc = gpustack(lab, f"failing {case}", "install", str(lab["inventory"]), "-e", f"@{varsfile}",
                    "--limit", N1, "--tags", "nvidia_container_toolkit", "--output", "json",
                    env=toolkit_env(password))  # fmt: skip
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
    message = json.loads(proc.stdout)["hosts"][N1]["failures"][-1]["message"]
    for word in words:
        assert word in message, message
    assert "The source was rolled back (" in message
    assert ssh(lab["inventory"], N1, APT_SNAPSHOT).stdout == before, "byte-identical /etc/apt"
    assert apt_update_complaints(lab, N1) == []
    RECORD.setdefault("failing", {})[case] = message


def test_wrong_driver_credentials_name_the_status_and_change_nothing(lab):
    before = ssh(lab["inventory"], N1, APT_SNAPSHOT).stdout
    lab["password_file"].write_text("i17-wrong-driver-password\n")
    try:
        proc = gpustack(lab, "failing driver 401", "install", str(lab["inventory"]), "-e",
                        f"@{lab['vars']}", "--limit", N1, "--tags", "nvidia_driver",
                        "--output", "json", env=toolkit_env())  # fmt: skip
    finally:
        lab["password_file"].write_text(PASSWORD + "\n")
    assert proc.returncode == 1
    message = json.loads(proc.stdout)["hosts"][N1]["failures"][-1]["message"]
    assert "HTTP 401" in message and "Nothing was changed" in message, message
    assert "nvidia_driver_mirror_username" in message  # the hint names the inputs
    assert "package sources were rolled back" not in message  # nothing was, so no claim
    assert ssh(lab["inventory"], N1, APT_SNAPSHOT).stdout == before
    RECORD.setdefault("failing", {})["driver 401"] = message


def test_unusable_mirror_on_a_fresh_node_leaves_no_source(lab):
    inv = str(lab["inventory"])
    proc = gpustack(lab, "uninstall toolkit", "uninstall", inv, "--components", "toolkit",
                    "--limit", N2, "--yes", "-e", f"@{lab['vars']}", env=toolkit_env())  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    before = ssh(lab["inventory"], N2, APT_SNAPSHOT).stdout
    assert "gpustack-nvidia-container-toolkit" not in before
    overrides = FAILING["401"][0]
    varsfile = lab["work"] / "vars-fresh.json"
    varsfile.write_text(json.dumps({**lab["variables"], **overrides}))
    proc = gpustack(lab, "failing fresh 401", "install", inv, "-e", f"@{varsfile}", "--limit", N2,
                    "--tags", "nvidia_container_toolkit", "--output", "json",
                    env=toolkit_env("wrong-password"))  # fmt: skip
    assert proc.returncode == 1
    message = json.loads(proc.stdout)["hosts"][N2]["failures"][-1]["message"]
    assert "401" in message, message
    assert ssh(lab["inventory"], N2, APT_SNAPSHOT).stdout == before
    assert apt_update_complaints(lab, N2) == []
    assert controller_hits(lab, PASSWORD) == []


def test_the_toolkit_repository_set_up_by_hand_under_another_key_is_named_and_left_alone(lab):
    """A node prepared by NVIDIA's install guide: a .list for the same repository with its own
    keyring. apt refuses one repository under two keys (every apt call on the node would fail),
    so gpustack names that file, with a hint, before writing anything."""
    inv = lab["inventory"]
    theirs = "/etc/apt/sources.list.d/nvidia-container-toolkit.list"
    line = ("deb [signed-by=/usr/share/keyrings/nvidia-container-toolkit-keyring.gpg] "
            f"{TOOLKIT_BASE}/stable/deb/$(ARCH) /")  # fmt: skip
    assert ssh(inv, N2, f"echo '{line}' > {theirs}").returncode == 0
    try:
        before = ssh(inv, N2, APT_SNAPSHOT).stdout
        proc = gpustack(lab, "conflicting source", "install", str(inv), "-e", f"@{lab['vars']}",
                        "--limit", N2, "--tags", "nvidia_container_toolkit", "--output", "json",
                        env=toolkit_env())  # fmt: skip
        assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-2000:]
        messages = [f["message"] for f in json.loads(proc.stdout)["hosts"][N2]["failures"]]
        first = messages[0]
        assert "Conflicting values set for option Signed-By" in first, messages
        assert f"Nothing was changed. Hint: {theirs} already declares this repository" in first
        assert ssh(inv, N2, APT_SNAPSHOT).stdout == before, "byte-identical /etc/apt"
        RECORD.setdefault("failing", {})["conflicting source"] = messages
    finally:
        ssh(inv, N2, f"rm -f {theirs}")
    assert apt_update_complaints(lab, N2) == []


# --- issue 16, item 1: SIGKILL between writing a source and refreshing the lists -------------


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out


def kill_at(lab, args: list[str], trigger, env: dict, timeout: float = 900) -> dict:
    """Start `gpustack ARGS`; when trigger(event) is true for an ansible-runner event, SIGKILL
    gpustack and every process under it (ansible-playbook runs in its own session, so a
    process-group kill would miss it). Returns what happened."""
    state = Path(tempfile.mkdtemp(prefix="kill-state-", dir=lab["work"]))  # only this run's events
    proc = subprocess.Popen([*GPUSTACK, *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "GPUSTACK_STATE_DIR": str(state), **env})  # fmt: skip
    seen: set[Path] = set()
    start = time.monotonic()
    try:
        while time.monotonic() - start < timeout:
            if proc.poll() is not None:
                return {"killed": False, "rc": proc.returncode}
            for path in sorted(state.glob("runs/*/artifacts/*/job_events/*.json")):
                if path in seen or path.name.endswith("-partial.json"):
                    continue  # ansible-runner renames a partial event file when complete
                seen.add(path)
                try:
                    event = json.loads(path.read_text())
                except (OSError, ValueError):
                    seen.discard(path)  # still being written
                    continue
                if trigger(event):
                    victims = [proc.pid, *_descendants(proc.pid)]
                    for pid in victims:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
                    proc.wait()
                    return {"killed": True, "after": event["event_data"].get("task"),
                            "seconds": round(time.monotonic() - start, 1)}  # fmt: skip
            time.sleep(0.05)
        raise AssertionError("the trigger never fired")
    finally:
        if proc.poll() is None:
            proc.kill()


def on_ok(task: str):
    return lambda e: e.get("event") == "runner_on_ok" and e["event_data"].get("task") == task


DISTRO = ("-e", "nvidia_driver_source=distro", "-e", "nvidia_driver_version=535.261.03-1",
          "-e", "nvidia_driver_persistenced=true", "--tags", "nvidia_driver")  # fmt: skip


def test_kill_after_enabling_archive_components_does_not_poison_the_rerun(lab):
    inv = str(lab["inventory"])
    proc = gpustack(lab, "uninstall driver", "uninstall", inv, "--components", "driver",
                    "--limit", N2, "--yes", "-e", f"@{lab['vars']}", env=toolkit_env())  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    # package lists younger than an hour that do not know non-free: the state the bug needs
    assert ssh(lab["inventory"], N2, "apt-get update -qq").returncode == 0
    assert ssh(lab["inventory"], N2, "apt-cache madison nvidia-smi").stdout.strip() == ""
    args = ["install", inv, "--limit", N2, *DISTRO]
    # The components are written at the start of the refresh call, then apt-get update runs: an
    # apt hook that delays the update holds the call there, and the kill lands once the sources
    # file has changed (the call's own update is killed with it, as a reboot would end it).
    slow = "/etc/apt/apt.conf.d/99gpustack-test-slow-update"
    assert (
        ssh(
            lab["inventory"], N2, f"echo 'APT::Update::Pre-Invoke {{ \"sleep 20\"; }};' > {slow}"
        ).returncode
        == 0
    )

    def components_written(event) -> bool:
        if not (event.get("event") == "runner_on_start"
                and event["event_data"].get("task", "").startswith("Refresh the package lists (at most hourly; at once")):  # fmt: skip
            return False
        for _ in range(300):
            if (
                "non-free"
                in ssh(lab["inventory"], N2, "cat /etc/apt/sources.list.d/debian.sources").stdout
            ):
                return True
            time.sleep(0.05)
        raise AssertionError("the refresh call never enabled the archive components")

    outcome = kill_at(lab, args, components_written, {})
    assert outcome["killed"], outcome
    ssh(
        lab["inventory"],
        N2,
        f"rm -f {slow}; pkill -f 'apt-get update'; pkill -f AnsiballZ_gpustack_apt_lists; sleep 1",
    )
    pending = ssh(
        lab["inventory"], N2, "ls /var/lib/gpustack/apt-txn/; apt-cache madison nvidia-smi"
    )
    assert "archive-components.pending" in pending.stdout, pending.stdout
    assert "nvidia-smi |" not in pending.stdout, pending.stdout  # the lists do not know non-free
    assert (
        "non-free" in ssh(lab["inventory"], N2, "cat /etc/apt/sources.list.d/debian.sources").stdout
    )
    rerun = gpustack(lab, "rerun after kill (components)", *args, "--output", "json")
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-2000:]
    facts = json.loads(rerun.stdout)["hosts"][N2]["facts"]["gpustack_driver"]
    assert facts["installed_version"] == "535.261.03-1"
    assert (
        "archive-components.pending"
        not in ssh(lab["inventory"], N2, "ls /var/lib/gpustack/apt-txn/").stdout
    )
    third = gpustack(lab, "third run (components)", *args, "--output", "json")
    assert third.returncode == 0
    assert json.loads(third.stdout)["hosts"][N2]["changed"] == 0
    RECORD.setdefault("kills", []).append({"at": outcome["after"], "converged": True})


def test_kill_after_and_during_writing_the_toolkit_source_does_not_poison_the_rerun(lab):
    """The toolkit source moves to a slow server (every request waits 2 s), so a kill at the
    task's start, once the new source file is on the node, lands while apt-get update of the
    new source is still running; the other kill lands right after the task."""
    inv = str(lab["inventory"])
    lab_fixtures.serve_with_auth(f"gpustack-{N1}", SLOW_PORT, USER, PASSWORD, delay=2)
    ssh(lab["inventory"], N1, "ln -sfn gpustack-fixture-repo /srv/gpustack-fixture-repo-2")
    source = "/etc/apt/sources.list.d/gpustack-nvidia-container-toolkit.sources"

    def during(path: str):
        def trigger(event) -> bool:
            if not (event.get("event") == "runner_on_start"
                    and event["event_data"].get("task") == "Write the repository source"):  # fmt: skip
                return False
            for _ in range(200):  # until the new source file is on the node
                if path in ssh(lab["inventory"], N1, f"cat {source}").stdout:
                    return True
                time.sleep(0.02)
            return True

        return trigger

    results = []
    for label, path, trigger in (
        ("after", "gpustack-fixture-repo", on_ok("Write the repository source")),
        ("during", "gpustack-fixture-repo-2", during("gpustack-fixture-repo-2")),
    ):
        variables = {**lab["variables"], "nvidia_container_toolkit_mirror_key_url": FILE_KEY,
                     "nvidia_container_toolkit_mirror_url":
                         f"http://127.0.0.1:{SLOW_PORT}/{path}/stable/deb"}  # fmt: skip
        varsfile = lab["work"] / f"vars-kill-{label}.json"
        varsfile.write_text(json.dumps(variables))
        args = ["install", inv, "-e", f"@{varsfile}", "--limit", N1]
        outcome = kill_at(lab, args, trigger, toolkit_env())
        assert outcome["killed"], outcome
        time.sleep(6)  # a module that outlived its controller finishes meanwhile
        txn = ssh(lab["inventory"], N1, "ls /var/lib/gpustack/apt-txn/").stdout.split()
        rerun = gpustack(lab, f"rerun after kill ({label})", *args, "--output", "json",
                         env=toolkit_env())  # fmt: skip
        assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-2000:]
        host = json.loads(rerun.stdout)["hosts"][N1]
        assert host["facts"]["gpustack_toolkit"]["installed_version"] == lab_fixtures.BUILT_VERSION
        assert f"/{path}/" in ssh(lab["inventory"], N1, f"cat {source}").stdout
        assert ssh(lab["inventory"], N1, "ls /var/lib/gpustack/apt-txn/").stdout.strip() == ""
        third = gpustack(lab, f"third run ({label})", *args, "--output", "json", env=toolkit_env())
        assert third.returncode == 0 and json.loads(third.stdout)["hosts"][N1]["changed"] == 0
        assert apt_update_complaints(lab, N1) == []
        results.append({"kill": f"{label} Write the repository source", "seconds": outcome["seconds"],
                        "txn_after_kill": txn, "converged": True})  # fmt: skip
    RECORD.setdefault("kills", []).extend(results)
    print("\nkill-rerun:", json.dumps(RECORD.get("kills"), indent=2), file=sys.stderr)
