"""The gpustack_apt_source module against real apt: a signed file:// repository and a real HTTP
server with basic auth on the loopback; apt-get update runs for real with private list and
cache directories (nothing of this machine's apt state is touched).

The repository holds the TEST FIXTURE packages of tests/fixtures/lab_fixtures.py.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.fixtures import lab_fixtures
from tests.unit.host_modules import load

MODULE = ROOT / "plugins/modules/gpustack_apt_source.py"
pytestmark = pytest.mark.skipif(shutil.which("apt-get") is None, reason="needs apt-get")
m = load("plugins/modules/gpustack_apt_source.py", "gpustack_apt_source")
USER, PASSWORD = "mirror-user", "i17-unit-S3cret"


@pytest.fixture(scope="module")
def repo():
    info = lab_fixtures.build_toolkit_repo()
    return Path(info["path"])


class _AuthHandler(http.server.SimpleHTTPRequestHandler):
    want = ""

    def do_GET(self):
        if self.headers.get("Authorization") != self.want:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="fixture"')
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        return super().do_GET()

    do_HEAD = do_GET

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server(repo):
    """The fixture repository over HTTP with basic auth on 127.0.0.1 (a free port)."""
    handler = type("H", (_AuthHandler,), {
        "want": "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()})  # fmt: skip
    httpd = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(handler, directory=str(repo))
    )
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture
def env(tmp_path, repo):
    """A root prefix for /etc/apt etc., private apt state, and the dearmored fixture key."""
    root = tmp_path / "root"
    for sub in ("lists/partial", "cache/archives/partial"):
        (tmp_path / sub).mkdir(parents=True)
    key = tmp_path / "key.gpg"
    subprocess.run(["gpg", "--batch", "--yes", "--dearmor", "-o", str(key), str(repo / "gpgkey")],
                   check=True)  # fmt: skip
    options = [f"Dir::State::Lists={tmp_path}/lists", f"Dir::Cache={tmp_path}/cache",
               "Debug::NoLocking=1", "APT::Sandbox::User=root", "Dir::Etc::netrc=/dev/null",
               f"Dir::Etc::netrcparts={root}/etc/apt/auth.conf.d"]  # fmt: skip
    return {"root": root, "key": key, "options": options, "lists": tmp_path / "lists"}


def source(env, uri):
    keyring = env["root"] / "usr/share/keyrings/gpustack-t1.gpg"
    return f"Types: deb\nURIs: {uri}/stable/deb/$(ARCH)\nSuites: /\nSigned-By: {keyring}\n"


def run(env, tmp_path, **args) -> tuple[int, dict, str]:
    """The module as Ansible runs it (a JSON args file), returning (rc, result, raw output)."""
    params = {"name": "t1", "root": str(env["root"]), "apt_options": env["options"], **args}
    path = tmp_path / "args.json"
    path.write_text(json.dumps({"ANSIBLE_MODULE_ARGS": params}))
    proc = subprocess.run([sys.executable, "-m", "tests.unit.host_modules", str(MODULE), str(path)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    return proc.returncode, json.loads(proc.stdout), proc.stdout + proc.stderr


def tree(root: Path) -> dict[str, tuple[str, int]]:
    """Every file and directory under root: sha256 (files) and mode, what 'byte-identical'
    compares. Directories count: a rollback that leaves an empty /var/lib/gpustack behind has
    changed the host (seen on a real GPU host, 2026-11-27)."""
    out = {}
    for path in sorted(root.rglob("*")):
        digest = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
        out[str(path.relative_to(root))] = (digest, path.stat().st_mode & 0o7777)
    return out


def lists_know(env, marker: str) -> bool:
    return any(marker in p.name for p in env["lists"].iterdir())


def test_credentialed_http_mirror_goes_to_auth_conf_d_0600(env, tmp_path, server):
    rc, res, raw = run(env, tmp_path, content=source(env, server), keyring_src=str(env["key"]),
                       auth_machine=f"{server}/stable/deb", username=USER, password=PASSWORD)  # fmt: skip
    assert rc == 0, raw
    assert res["changed"] and res["refreshed"] and res["pending"]
    auth = env["root"] / "etc/apt/auth.conf.d/gpustack-t1.conf"
    assert auth.stat().st_mode & 0o777 == 0o600
    assert auth.read_text() == f"machine {server}/stable/deb login {USER} password {PASSWORD}\n"
    src = env["root"] / "etc/apt/sources.list.d/gpustack-t1.sources"
    assert src.stat().st_mode & 0o777 == 0o644 and "@" not in src.read_text()
    assert lists_know(env, "127.0.0.1"), "apt-get update fetched the source's lists"
    assert PASSWORD not in raw  # the module's output never carries the password
    txn = env["root"] / "var/lib/gpustack/apt-txn/t1.json"
    assert txn.stat().st_mode & 0o777 == 0o600  # 'before' held until commit
    rc, res, _ = run(env, tmp_path, name="t1", state="commit")
    assert rc == 0 and not txn.exists()
    rc, res, _ = run(env, tmp_path, content=source(env, server), keyring_src=str(env["key"]),
                     auth_machine=f"{server}/stable/deb", username=USER, password=PASSWORD)  # fmt: skip
    assert rc == 0 and res["changed"] is False and res["refreshed"] is False


def test_proving_one_source_does_not_make_every_list_look_fresh(env, tmp_path, repo):
    """apt-get update for the new source alone keeps the lists directory's and the success stamp's
    mtimes (what cache_valid_time reads), so an hourly refresh afterwards still sees old lists."""
    stamp = env["root"] / "var/lib/apt/periodic/update-success-stamp"
    stamp.parent.mkdir(parents=True)
    stamp.touch()
    old = 1_700_000_000  # 2023: lists far older than an hour
    for path in (env["lists"], stamp):
        os.utime(path, (old, old))
    rc, res, raw = run(env, tmp_path, content=source(env, f"file://{repo}"),
                       keyring_src=str(env["key"]))  # fmt: skip
    assert rc == 0, raw
    assert res["refreshed"] and lists_know(env, "stable"), "the source's own lists were fetched"
    assert env["lists"].stat().st_mtime == old
    assert stamp.stat().st_mtime == old


def test_wrong_password_fails_with_401_and_leaves_every_file_as_before(env, tmp_path, server):
    good = {"content": source(env, server), "keyring_src": str(env["key"]),
            "auth_machine": f"{server}/stable/deb", "username": USER, "password": PASSWORD}  # fmt: skip
    assert run(env, tmp_path, **good)[0] == 0
    assert run(env, tmp_path, state="commit")[0] == 0
    before = tree(env["root"])
    rc, res, raw = run(env, tmp_path, **{**good, "password": "wrong-one"})
    assert rc == 1
    assert "401" in res["msg"] and "Unauthorized" in res["msg"], res["msg"]
    assert res["cause"] == "auth" and "Hint: the mirror refused the credentials" in res["msg"]
    assert "rolled back" in res["msg"] and res["rolled_back"] is True
    assert tree(env["root"]) == before, "the good source and credentials are back, byte for byte"
    assert "wrong-one" not in raw and PASSWORD not in raw


@pytest.mark.parametrize(
    ("uri", "cause", "words"),
    [
        ("http://127.0.0.1:9", "connect", "Could not connect"),
        ("http://gpustack-no-such-host.invalid", "dns", "resolve"),
        ("file:///nonexistent/mirror", "not_found", "Release"),
    ],
)
def test_unusable_source_on_a_fresh_node_leaves_nothing_behind(env, tmp_path, uri, cause, words):
    before = tree(env["root"])
    rc, res, _ = run(env, tmp_path, content=source(env, uri), keyring_src=str(env["key"]))
    assert rc == 1
    assert res["cause"] == cause and words in res["msg"], res["msg"]
    assert "Hint:" in res["msg"]
    assert tree(env["root"]) == before == {}


def test_404_names_the_status(env, tmp_path, server):
    rc, res, _ = run(env, tmp_path, content=source(env, server + "/nope"),
                     keyring_src=str(env["key"]), auth_machine=server, username=USER,
                     password=PASSWORD)  # fmt: skip
    assert rc == 1 and res["cause"] == "not_found" and "404" in res["msg"], res["msg"]


def test_an_interrupted_change_is_proved_by_the_next_run(env, tmp_path, repo):
    """Killed after the source was written and before the lists knew it: the files are as
    wanted, but the record marks the change pending, so the next run refreshes anyway."""
    args = {"content": source(env, f"file://{repo}"), "keyring_src": str(env["key"])}
    assert run(env, tmp_path, **args)[0] == 0
    shutil.rmtree(env["lists"])  # the lists as they were before the refresh
    (env["lists"] / "partial").mkdir(parents=True)
    rc, res, _ = run(env, tmp_path, **args)
    assert rc == 0 and res["refreshed"] is True and res["changed"] is True
    assert lists_know(env, "toolkit-repo")
    assert run(env, tmp_path, state="commit")[0] == 0
    rc, res, _ = run(env, tmp_path, **args)
    assert res["refreshed"] is False and res["changed"] is False


def test_offers_reads_the_package_in_this_source_alone(env, tmp_path, repo):
    """The toolkit role's version list in the module's own call (it was an apt-cache madison
    round trip of its own, with a cache of every source built for it): this source's lists
    only, after the refresh; on an unchanged rerun too; not in check mode before the lists
    know a changed source."""
    other = env["root"] / "etc/apt/sources.list.d/other.sources"  # a host source, not read
    other.parent.mkdir(parents=True)
    other.write_text(f"Types: deb\nURIs: file://{tmp_path}/none\nSuites: /\n")
    args = {"content": source(env, f"file://{repo}"), "keyring_src": str(env["key"]),
            "offers": "nvidia-container-toolkit"}  # fmt: skip
    rc, res, raw = run(env, tmp_path, **args, _ansible_check_mode=True)
    assert rc == 0 and res["changed"] and "madison" not in res, raw
    rc, res, raw = run(env, tmp_path, **args)
    assert rc == 0 and res["refreshed"], raw
    versions = [line.split("|")[1].strip() for line in res["madison"].splitlines()]
    assert versions == sorted(versions, reverse=True) and len(versions) >= 2, res["madison"]
    assert all("nvidia-container-toolkit" in line and str(repo) in line
               for line in res["madison"].splitlines())  # fmt: skip
    assert run(env, tmp_path, state="commit")[0] == 0
    rc, again, _ = run(env, tmp_path, **args, _ansible_check_mode=True)
    assert rc == 0 and not again["changed"] and again["madison"] == res["madison"]
    rc, none, _ = run(env, tmp_path, **{**args, "offers": "no-such-package"})
    assert rc == 0 and none["madison"] == ""
    rc, plain, _ = run(env, tmp_path, content=args["content"], keyring_src=args["keyring_src"])
    assert rc == 0 and "madison" not in plain


def test_rollback_restores_the_state_before_the_uncommitted_change(env, tmp_path, repo, server):
    first = {"content": source(env, f"file://{repo}"), "keyring_src": str(env["key"])}
    assert run(env, tmp_path, **first)[0] == 0
    assert run(env, tmp_path, state="commit")[0] == 0
    stale = env["root"] / "etc/apt/sources.list.d/gpustack-t1.sources.2024-01-01@00:00:00~"
    stale.write_text("URIs: http://old-user:old-pass@mirror/\n")  # an old gpustack's backup
    before = tree(env["root"])
    second = {"content": source(env, server), "keyring_src": str(env["key"]),
              "auth_machine": server, "username": USER, "password": PASSWORD}  # fmt: skip
    rc, res, _ = run(env, tmp_path, **second)
    assert rc == 0 and not stale.exists(), "old backups (with old credentials) go"
    rc, res, _ = run(env, tmp_path, state="rollback")
    assert rc == 0 and res["rolled_back"] is True
    assert tree(env["root"]) == before
    rc, res, _ = run(env, tmp_path, state="rollback")
    assert rc == 0 and res["rolled_back"] is False and res["changed"] is False


def test_check_mode_changes_nothing_and_hides_credentials_in_the_diff(env, tmp_path, server):
    params = {"content": source(env, server), "keyring_src": str(env["key"]),
              "auth_machine": server, "username": USER, "password": PASSWORD,
              "_ansible_check_mode": True, "_ansible_diff": True}  # fmt: skip
    rc, res, raw = run(env, tmp_path, **params)
    assert rc == 0 and res["changed"] is True
    assert tree(env["root"]) == {}
    assert list(env["lists"].iterdir()) == [env["lists"] / "partial"], "the host's lists untouched"
    auth_diff = next(d for d in res["diff"] if d["after_header"].endswith(".conf"))
    assert auth_diff["after"] == "(new credentials, not shown)\n"
    assert PASSWORD not in raw


@pytest.mark.parametrize(
    ("where", "password", "cause", "words"),
    [
        ("/nope", PASSWORD, "not_found", "404"),
        ("", "wrong-one", "auth", "401"),
        ("http://127.0.0.1:9", PASSWORD, "connect", "Could not connect"),
    ],
)
def test_check_mode_proves_a_changed_source_on_copies(
    env, tmp_path, server, where, password, cause, words
):
    """plan said "would change" for a mirror whose repository answered 404 (real GPU host,
    2026-11-27); now the changed source is proved in check mode on copies in a temporary
    directory: the same cause and hint as install's, and nothing of the host's written."""
    uri = where if where.startswith("http") else server + where
    rc, res, raw = run(env, tmp_path, content=source(env, uri), keyring_src=str(env["key"]),
                       auth_machine=server, username=USER, password=password,
                       _ansible_check_mode=True)  # fmt: skip
    assert rc == 1 and res["cause"] == cause and words in res["msg"], res["msg"]
    assert "Nothing was written (check mode). Hint: " in res["msg"], res["msg"]
    assert not env["root"].exists()
    assert list(env["lists"].iterdir()) == [env["lists"] / "partial"]
    assert password not in raw


def _apt_major() -> int:
    out = subprocess.run(["apt-get", "--version"], capture_output=True, text=True).stdout
    return int(out.split()[1].split(".")[0])


def user_source(env, repo, name: str, options: str) -> Path:
    """A source the host already has for the fixture repository, as NVIDIA's guides write one."""
    arch = subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True,
                          check=True).stdout.strip()  # fmt: skip
    path = env["root"] / "etc/apt/sources.list.d" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"deb {options}file://{repo}/stable/deb/{arch} /\n")
    return path


@pytest.mark.parametrize("check_mode", [False, True])
@pytest.mark.parametrize("options", ["[signed-by=/usr/share/keyrings/user-key.gpg] ", ""])
def test_the_same_repository_under_another_key_is_refused_before_any_change(
    env, tmp_path, repo, options, check_mode
):
    """apt refuses every source of the host when one repository has two keys (or a key and
    none): the module names the host's file and writes nothing, in check mode too (plan)."""
    if not options and _apt_major() >= 3:
        pytest.skip("apt 3 (Debian 13) reads a repository declared with a key and without one "
                    "(the module's run with it succeeds, apt-get update included): no conflict")  # fmt: skip
    theirs = user_source(env, repo, "nvidia-container-toolkit.list", options)
    user_source(env, repo, "unrelated.list", "").write_text(
        "deb file:///nonexistent/other-repo /\n"
    )  # fmt: skip
    before = tree(env["root"])
    rc, res, raw = run(env, tmp_path, content=source(env, f"file://{repo}"),
                       keyring_src=str(env["key"]), _ansible_check_mode=check_mode)  # fmt: skip
    assert rc == 1, raw
    assert res["cause"] == "conflict" and res["conflicting"] == [str(theirs)]
    assert "Conflicting values set for option Signed-By" in res["msg"]
    assert "Nothing was changed. Hint: " + str(theirs) + " already declares" in res["msg"]
    assert tree(env["root"]) == before


def test_sources_the_host_cannot_read_anyway_are_not_blamed_on_the_repository(env, tmp_path, repo):
    broken = user_source(env, repo, "broken.list", "")
    broken.write_text("deb [arch=amd64\n")  # malformed: apt refuses it with or without ours
    before = tree(env["root"])
    rc, res, raw = run(env, tmp_path, content=source(env, f"file://{repo}"),
                       keyring_src=str(env["key"]))  # fmt: skip
    assert rc == 1, raw
    assert res["cause"] == "other" and res["conflicting"] == []
    assert str(broken) in res["msg"] and "Nothing was changed. Hint: apt names" in res["msg"]
    assert tree(env["root"]) == before


def test_the_same_repository_under_the_same_key_is_accepted(env, tmp_path, repo):
    keyring = env["root"] / "usr/share/keyrings/gpustack-t1.gpg"
    user_source(env, repo, "same.list", f"[signed-by={keyring}] ")
    rc, res, raw = run(env, tmp_path, content=source(env, f"file://{repo}"),
                       keyring_src=str(env["key"]))  # fmt: skip
    assert rc == 0, raw
    assert res["changed"] and res["refreshed"]


def test_white_space_in_credentials_is_refused(env, tmp_path, server):
    rc, res, _ = run(env, tmp_path, content=source(env, server), auth_machine=server,
                     username=USER, password="two words")  # fmt: skip
    assert rc == 1 and "white space" in res["msg"]


def test_apt_error_parsing_and_causes():
    out = (
        "Ign:1 http://h/x  InRelease\nErr:1 http://h/x  InRelease\n"
        "  Could not handshake: The TLS connection was non-properly terminated. [IP: 1.2.3.4 443]\n"
        "Reading package lists...\n"
        "W: Failed to fetch http://h/x/InRelease  Could not handshake: The TLS connection was "
        "non-properly terminated. [IP: 1.2.3.4 443]\n"
        "W: Some index files failed to download. They have been ignored, or old ones used instead.\n"
    )
    errors, warnings = m.parse_apt_errors(out)
    assert errors == [("http://h/x", errors[0][1])] and warnings == []  # one cause, once
    assert m.classify([r for _, r in errors]) == "tls"
    assert m.classify(["The following signatures couldn't be verified: NO_PUBKEY 1234"]) == (
        "signature"
    )
    assert m.classify(["503  Service Unavailable"]) == "server"


def _fingerprint(armored: Path) -> str:
    out = subprocess.run(["gpg", "--batch", "--show-keys", "--with-colons", str(armored)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    return next(line.split(":")[9] for line in out.splitlines() if line.startswith("fpr:"))


def test_the_fetched_key_is_checked_and_dearmored_in_the_same_call(env, tmp_path, repo):
    """key_url + key_fingerprint: the keyring written is gpg --dearmor of the fetched key (as the
    role's separate gpg calls made it before they were folded into the module)."""
    armored = repo / "gpgkey"
    tail = _fingerprint(armored)[-16:].lower()  # the tail, in lower case, is enough
    rc, res, raw = run(env, tmp_path, content=source(env, f"file://{repo}"), key_url=f"file://{armored}",
                       key_fingerprint=tail, key_location="file:///mirror/gpgkey")  # fmt: skip
    assert rc == 0, raw
    keyring = env["root"] / "usr/share/keyrings/gpustack-t1.gpg"
    assert keyring.read_bytes() == env["key"].read_bytes()
    assert keyring.stat().st_mode & 0o777 == 0o644 and res["refreshed"]


def test_a_key_with_another_fingerprint_is_refused_before_anything_is_written(env, tmp_path, repo):
    found = _fingerprint(repo / "gpgkey")
    pinned = "0123456789ABCDEF0123456789ABCDEF01234567"
    for check in (False, True):
        rc, res, _ = run(env, tmp_path, content=source(env, f"file://{repo}"),
                         key_url=f"file://{repo}/gpgkey", key_fingerprint=pinned,
                         key_location="file:///mirror/gpgkey", _ansible_check_mode=check)  # fmt: skip
        assert rc != 0 and res["cause"] == "fingerprint"
        assert res["msg"] == (
            f"The key at file:///mirror/gpgkey has fingerprint(s) {found}, not {pinned}. Nothing "
            "was installed from that repository. Hint: check the key URL and the pinned fingerprint."
        )
        assert not env["root"].exists()  # no source, keyring or record written
    not_a_key = tmp_path / "not-a-key"
    not_a_key.write_text("<html>login page</html>\n")
    rc, res, _ = run(env, tmp_path, content=source(env, f"file://{repo}"), key_url=f"file://{not_a_key}",
                     key_fingerprint=pinned)  # fmt: skip
    assert rc != 0 and "fingerprint(s) none" in res["msg"] and not env["root"].exists()


def _pub(env) -> Path:
    return env["root"] / "var/lib/gpustack/t1.pub"


def test_key_url_is_fetched_checked_and_stored_with_the_source(env, tmp_path, repo):
    """key_url: the key is fetched, checked and stored with the source (state directory 0755),
    on every run as get_url with force did; the same key again changes nothing, a key
    re-published under the same fingerprint (here: armored with a comment) is taken up."""
    tail = _fingerprint(repo / "gpgkey")[-16:]
    args = {"content": source(env, f"file://{repo}"), "key_fingerprint": tail,
            "key_location": "file:///mirror/gpgkey"}  # fmt: skip
    rc, res, raw = run(env, tmp_path, key_url=f"file://{repo}/gpgkey", **args)
    assert rc == 0, raw
    assert res["changed"] and res["refreshed"]
    assert _pub(env).read_bytes() == (repo / "gpgkey").read_bytes()
    assert (env["root"] / "var/lib/gpustack").stat().st_mode & 0o777 == 0o755
    keyring = env["root"] / "usr/share/keyrings/gpustack-t1.gpg"
    assert keyring.read_bytes() == env["key"].read_bytes()
    run(env, tmp_path, state="commit")
    before = tree(env["root"])
    rc, res, raw = run(env, tmp_path, key_url=f"file://{repo}/gpgkey", **args)
    assert rc == 0 and not res["changed"] and tree(env["root"]) == before, raw
    text = (repo / "gpgkey").read_text()
    republished = tmp_path / "gpgkey"
    republished.write_text(text.replace("\n\n", "\nComment: re-published\n\n", 1))
    rc, res, raw = run(env, tmp_path, key_url=f"file://{republished}", **args)
    assert rc == 0 and res["changed"], raw
    assert _pub(env).read_bytes() == republished.read_bytes()
    assert keyring.read_bytes() == env["key"].read_bytes()  # the same key
    # A later run that cannot fetch the key fails, and changes nothing.
    run(env, tmp_path, state="commit")
    before = tree(env["root"])
    rc, res, raw = run(env, tmp_path, key_url="http://127.0.0.1:9/gpgkey", **args)
    assert rc != 0 and res["cause"] == "fetch" and tree(env["root"]) == before, raw


def test_a_repository_apt_cannot_use_leaves_no_directory_behind(env, tmp_path, repo, server):
    """Seen on a real GPU host (Ubuntu 24.04, 2026-11-27): the key fetched from a mirror, the
    repository answering 404; the files were restored but an empty /var/lib/gpustack stayed."""
    tail = _fingerprint(repo / "gpgkey")[-16:]
    rc, res, raw = run(env, tmp_path, content=source(env, server + "/nope"), key_fingerprint=tail,
                       key_url=f"file://{repo}/gpgkey", auth_machine=server, username=USER,
                       password=PASSWORD)  # fmt: skip
    assert rc == 1 and res["cause"] == "not_found" and res["rolled_back"] is True, raw
    assert not env["root"].exists(), tree(env["root"])


def test_rollback_removes_the_directories_the_change_made_and_keeps_others(env, tmp_path, repo):
    args = {"content": source(env, f"file://{repo}"), "keyring_src": str(env["key"])}
    assert run(env, tmp_path, **args)[0] == 0
    assert (env["root"] / "var/lib/gpustack/apt-txn").is_dir()
    rc, res, _ = run(env, tmp_path, state="rollback")
    assert rc == 0 and res["rolled_back"] is True
    assert not env["root"].exists(), tree(env["root"])
    # a directory that holds something the change did not write stays (another role's stamp)
    stamp = env["root"] / "var/lib/gpustack/driver.json"
    assert run(env, tmp_path, **args)[0] == 0
    stamp.write_text("{}\n")
    assert run(env, tmp_path, state="rollback")[0] == 0
    assert sorted(tree(env["root"])) == ["var", "var/lib", "var/lib/gpustack",
                                         "var/lib/gpustack/driver.json"]  # fmt: skip


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("http://127.0.0.1:9/gpgkey", ["connection", "Connection refused", "cannot reach"]),
        ("file:///nonexistent/gpgkey", ["not found", "no key at that URL"]),
    ],
)
def test_a_key_that_cannot_be_fetched_writes_nothing(env, tmp_path, repo, url, words):
    """Not even gpustack's state directory (a failed get_url left it behind, then a rescue
    removed it and reported two changes)."""
    for check in (False, True):
        rc, res, _ = run(env, tmp_path, content=source(env, f"file://{repo}"), key_url=url,
                         key_location=url, key_fingerprint="ABCD",
                         _ansible_check_mode=check)  # fmt: skip
        assert rc != 0 and res["cause"] == "fetch" and not res["rolled_back"]
        assert res["msg"].startswith(f"cannot fetch the signing key from {url}: ")
        assert "Nothing was changed. Hint: " in res["msg"]
        for word in words:
            assert word in res["msg"], res["msg"]
        assert not env["root"].exists()


def test_key_url_credentials_go_as_basic_auth_and_a_refusal_names_the_inputs(
    env, tmp_path, repo, server
):
    tail = _fingerprint(repo / "gpgkey")[-16:]
    args = {"content": source(env, f"file://{repo}"), "key_fingerprint": tail,
            "key_url": f"{server}/gpgkey", "key_location": f"{server}/gpgkey",
            "hint_inputs": "x_username"}  # fmt: skip
    rc, res, raw = run(env, tmp_path, key_username=USER, key_password="wrong", **args)
    assert rc != 0 and res["cause"] == "fetch", raw
    assert "HTTP 401" in res["msg"] and "password (x_username)" in res["msg"]
    assert "wrong" not in raw and not env["root"].exists()
    rc, res, raw = run(env, tmp_path, key_username=USER, key_password=PASSWORD, **args)
    assert rc == 0, raw
    assert PASSWORD not in raw


def test_check_mode_fetches_the_key_and_plans_the_keyring(env, tmp_path, repo):
    """In check mode the key is read (no file written): the plan knows whether the keyring would
    change, which it could not while get_url skipped the download in check mode."""
    rc, res, raw = run(env, tmp_path, content=source(env, f"file://{repo}"),
                       key_url=f"file://{repo}/gpgkey", key_fingerprint=_fingerprint(repo / "gpgkey"),
                       _ansible_check_mode=True)  # fmt: skip
    assert rc == 0 and res["changed"], raw
    assert str(env["root"] / "usr/share/keyrings/gpustack-t1.gpg") in res["files"]
    assert not env["root"].exists()


def test_the_conflict_check_reads_the_sources_alone(env, tmp_path, repo, monkeypatch):
    """The conflict check parses the sources with empty package lists, an empty dpkg status and
    no cache file: apt complains about a source it cannot read while parsing, before it reads a
    list, so the complaint is the same, and it builds no package cache of the host's lists (on a
    lab node `apt-get indextargets` spent about a second of CPU rewriting
    /var/cache/apt/pkgcache.bin for a set of sources about to change; this machine's apt keeps
    no cache file, so that part was measured on the lab, docs/performance.md)."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile.tempdir = None  # read TMPDIR again
    parts = tmp_path / "parts"
    parts.mkdir()
    ours = (
        f"Types: deb\nURIs: file://{repo}/stable/deb/$(ARCH)\nSuites: /\nSigned-By: {env['key']}\n"
    )
    (parts / "ours.sources").write_text(ours)
    assert m.sources_error(str(parts), "/dev/null", env["options"]) == ""
    (parts / "theirs.list").write_text(
        f"deb [signed-by=/usr/share/keyrings/other.gpg] file://{repo}/stable/deb/amd64 /\n"
    )
    reason = m.sources_error(str(parts), "/dev/null", env["options"])
    assert "Conflicting values set for option Signed-By" in reason
    assert not list(tmp_path.glob("gpustack-apt-lists-*"))  # its empty lists are removed
    assert list(env["lists"].iterdir()) == [env["lists"] / "partial"]
    # the host's package state is not read: a dpkg status apt cannot parse (which made the old
    # check build a cache and fail) is not blamed on the sources
    broken = tmp_path / "status"
    broken.write_text("Package: x\nStatus: install ok installed\nVersion 1\n garbage\n")
    (parts / "theirs.list").unlink()
    assert (
        m.sources_error(str(parts), "/dev/null", [*env["options"], f"Dir::State::status={broken}"])
        == ""
    )
    tempfile.tempdir = None
