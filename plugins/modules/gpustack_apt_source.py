#!/usr/bin/python
# -*- coding: utf-8 -*-
"""One APT repository as a transaction: source, keyring and credentials written together,
proved usable by apt itself, rolled back byte for byte when they are not."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_apt_source
short_description: Write an APT source with its keyring and credentials, prove it, or roll it back
version_added: 0.1.0
description:
  - I(state=present) writes C(/etc/apt/sources.list.d/gpustack-<name>.sources) (0644), the keyring
    C(/usr/share/keyrings/gpustack-<name>.gpg) (0644) and, when I(auth_machine) is set, the
    credentials C(/etc/apt/auth.conf.d/gpustack-<name>.conf) (0600, apt_auth.conf(5)); the
    source never carries credentials. Before the first change it records what was there in
    C(/var/lib/gpustack/apt-txn/<name>.json) (0600). Before writing anything (and in check mode)
    it asks apt whether it can still read every source of the host with this one in place. A
    source the host already has for the same repository with another keyring, or with none (as
    NVIDIA's install guides and C(cuda-keyring) write them), makes apt refuse all of its
    sources; the module then fails naming that file, and changes nothing. Then it runs
    C(apt-get update) for this source alone; when apt cannot use it (HTTP status, DNS,
    connection, TLS, signature), every file is restored from the record, the directories the
    change created (C(/var/lib/gpustack) on a fresh host) are removed again, and the module fails
    with apt's own reason and a hint.
  - The record stays until I(state=commit) (the caller found what it needed in the source) or
    I(state=rollback) (the caller failed later; restores it). A record left by an interrupted
    run means "changed, not proved"; the next I(state=present) refreshes and proves the source
    again even when the files are already as wanted, and keeps the older record as "before".
  - Old C(gpustack-<name>.sources.*~) backups (earlier gpustack versions kept them, with any
    credentials of the URL in them) are removed with the change.
  - Supports check mode and diff mode (the credentials file's diff never shows its content).
options:
  name: {type: str, required: true, description: Short name used in file names.}
  state:
    type: str
    default: present
    choices: [present, commit, rollback]
    description: Write and prove; end the transaction; undo it.
  content: {type: str, default: "", description: The deb822 source (state=present).}
  keyring_src:
    type: path
    default: ""
    description: Keyring file to install; empty (and no I(key_url)) keeps the keyring as it is.
  key_url:
    type: str
    default: ""
    description:
      - Where the signing key is (http(s):// or file://, without credentials), armored. Fetched
        on every run (in check mode too, as a read); its fingerprint must end with
        I(key_fingerprint), else the module fails before anything is written; converted to the
        keyring (C(gpg --dearmor)) in memory; stored as C(/var/lib/gpustack/<name>.pub) with
        the change. A key that cannot be fetched fails the module with the cause in words and
        nothing written (not even the state directory). Used instead of I(keyring_src).
  key_username: {type: str, default: "", description: Login for I(key_url) (basic auth).}
  key_password: {type: str, default: "", no_log: true, description: Password for I(key_url).}
  key_fingerprint: {type: str, default: "", description: The pinned fingerprint (or its tail).}
  key_location: {type: str, default: "", description: Where the key came from (for messages).}
  auth_machine:
    type: str
    default: ""
    description: "apt_auth.conf machine token; empty: no credentials file."
  username: {type: str, default: "", description: Login for auth_machine.}
  password: {type: str, default: "", no_log: true, description: Password for auth_machine.}
  refresh:
    type: bool
    default: true
    description:
      - Prove the source with apt-get update when changed or pending.
      - In check mode a changed source is proved the same way on copies in a temporary directory
        (source, keyring, credentials and package lists there); a repository apt cannot use
        fails the plan with the same cause and hint, and nothing of the host's is written.
  hint_inputs:
    type: str
    default: ""
    description: The caller's credential inputs, named in the 401/403 hint.
  offers:
    type: str
    default: ""
    description:
      - A package name; C(madison) then returns C(apt-cache madison) of it in this source's
        package lists alone (read after the refresh, nothing written; the caller needs no
        second round trip, and apt builds no cache of every source for it). Not read in check
        mode when the source changed (the host's lists do not know it yet).
  root: {type: path, default: /, description: Prefix of every path (tests).}
  apt_options: {type: list, elements: str, default: [], description: Extra -o options (tests).}
author: gpustack
"""

EXAMPLES = r"""
- name: Add NVIDIA's CUDA repository with its key, checked against its fingerprint
  gpustack.gpustack.gpustack_apt_source:
    name: nvidia-cuda
    content: |
      Types: deb
      URIs: https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/
      Suites: /
      Signed-By: /usr/share/keyrings/gpustack-nvidia-cuda.gpg
    key_url: https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/3bf863cc.pub
    key_fingerprint: EB693B3035CD5710E231E123A4B469963BF863CC
    key_location: /usr/share/keyrings/gpustack-nvidia-cuda.gpg
    offers: cuda-drivers

- name: Keep it once the driver was installed from it
  gpustack.gpustack.gpustack_apt_source:
    name: nvidia-cuda
    state: commit
"""

RETURN = r"""
files:
  description: Paths written or removed (state=present) or restored (state=rollback).
  type: list
pending: {description: A change is recorded and not yet committed, type: bool}
refreshed: {description: apt-get update ran for this source, type: bool}
rolled_back: {description: Files were restored from the record, type: bool}
madison:
  description: "With I(offers): apt-cache madison's lines for that package in this source."
  type: str
cause:
  description: >-
    On failure: fetch, fingerprint, conflict, auth, not_found, dns, connect, tls, signature,
    server or other.
  type: str
conflicting:
  description: "On cause=conflict: the host's source files apt refuses together with this source."
  type: list
"""

import base64
import glob
import json
import os
import re
import shutil
import subprocess
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_apt_commit import (
    commit_source,
)
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_host import (
    apt_option_args,
    parse_apt_errors,
    run,
)
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_keyfetch import (
    fetch_failure,
    fetch_key,
)

HINTS = {
    "auth": "the mirror refused the credentials: check the user name and password{inputs}",
    "not_found": "no repository at that URL: check the mirror URL and its layout (a Release or "
    "InRelease file must exist where the source points)",
    "dns": "the node cannot resolve the mirror's host name: check the name, or the node's DNS "
    "(/etc/resolv.conf), or use an IP address",
    "connect": "the node cannot reach the mirror: is it running, is the port right, is a firewall "
    "or a proxy (Acquire::http::Proxy) in the way?",
    "tls": "the TLS handshake did not succeed: install the mirror's CA certificate on the node "
    "(update-ca-certificates) or fix the mirror's certificate",
    "signature": "the repository is not signed by the pinned key: check the key URL and the "
    "fingerprint",
    "server": "the mirror answered with a server error: check the mirror's logs",
    "other": "check that the mirror is reachable from the node and serves an apt repository",
}
CAUSES = (  # first match wins; matched against apt's reason text
    ("auth", re.compile(r"\b(401|403)\b|Unauthori[sz]ed|Forbidden", re.I)),
    ("not_found", re.compile(r"\b404\b|Not Found|does not have a Release file", re.I)),
    ("dns", re.compile(r"resolv|Name or service not known|No address associated", re.I)),
    ("tls", re.compile(r"handshake|certificate|TLS|SSL|GnuTLS", re.I)),
    ("connect", re.compile(r"connect|timed out|unreachable|No route|refused|Connection", re.I)),
    ("signature", re.compile(r"NO_PUBKEY|not signed|signature|BADSIG|GPG error|Signed-By", re.I)),
    ("server", re.compile(r"\b5[0-9][0-9]\b")),
)


def paths(root, name):
    def at(path):
        return os.path.join(root, path.lstrip("/"))

    return {
        "source": at("/etc/apt/sources.list.d/gpustack-%s.sources" % name),
        "auth": at("/etc/apt/auth.conf.d/gpustack-%s.conf" % name),
        "keyring": at("/usr/share/keyrings/gpustack-%s.gpg" % name),
        "txn": at("/var/lib/gpustack/apt-txn/%s.json" % name),
        "pub": at("/var/lib/gpustack/%s.pub" % name),
    }


def read(path):
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except (IOError, OSError):
        return None


def write(path, data, mode):
    """Atomic write; the temporary file has the final mode from its creation on."""
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o755)
    fd, tmp = tempfile.mkstemp(prefix=".gpustack-", dir=directory)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.rename(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def put(path, data, mode):
    """Make `path` hold `data` (None: absent)."""
    if data is None:
        if os.path.lexists(path):
            os.remove(path)
    else:
        write(path, data, mode)


def auth_text(machine, username, password):
    if not machine:
        return None
    return ("machine %s login %s password %s\n" % (machine, username, password)).encode("utf-8")


def load_txn(path):
    """(files before the change, directories the change created) or None when no record."""
    data = read(path)
    if data is None:
        return None
    try:
        record = json.loads(data.decode("utf-8"))
        before = dict(
            (p, None if v is None else (base64.b64decode(v["data"]), v["mode"]))
            for p, v in record["files"].items()
        )
        return before, [str(d) for d in record.get("dirs", [])]
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def save_txn(path, before, dirs):
    files = {}
    for p, entry in before.items():
        files[p] = None
        if entry is not None:
            files[p] = {"data": base64.b64encode(entry[0]).decode("ascii"), "mode": entry[1]}
    directory = os.path.dirname(path)
    if not os.path.isdir(directory):
        os.makedirs(directory, 0o700)
    os.chmod(directory, 0o700)
    data = json.dumps({"files": files, "dirs": sorted(dirs)}, sort_keys=True).encode("utf-8")
    write(path, data, 0o600)


def missing_dirs(paths):
    """The directories above `paths` that do not exist yet (what writing them would create)."""
    missing = set()
    for path in paths:
        directory = os.path.dirname(path)
        while directory and directory != os.path.dirname(directory):
            if os.path.isdir(directory):
                break
            missing.add(directory)
            directory = os.path.dirname(directory)
    return missing


def remove_dirs(dirs):
    """Remove the directories a change created, deepest first, where nothing else is in them."""
    for directory in sorted(dirs, key=len, reverse=True):
        try:
            os.rmdir(directory)
        except OSError:  # gone already, or holds files the change did not write: kept
            pass


def snapshot(path):
    data = read(path)
    if data is None:
        return None
    return (data, os.stat(path).st_mode & 0o7777)


def restore(before):
    restored = []
    for p, entry in sorted(before.items()):
        current = snapshot(p)
        if entry is None:
            if current is not None:
                os.remove(p)
                restored.append(p)
            continue
        if current != entry:
            write(p, entry[0], entry[1])
            restored.append(p)
    return restored


def classify(reasons):
    text = " ".join(reasons)
    for cause, pattern in CAUSES:
        if pattern.search(text):
            return cause
    return "other"


def freshness_marks(root, apt_options):
    """The paths whose mtime tells apt users when the package lists were last refreshed: the lists
    directory (ansible.builtin.apt's cache_valid_time reads it) and the success stamp some systems'
    apt hooks touch (Ubuntu's update-notifier; the apt module reads it first where it exists)."""
    lists = os.path.join(root, "var/lib/apt/lists")
    for option in apt_options:
        if option.startswith("Dir::State::Lists="):
            lists = option.split("=", 1)[1]
    return [lists, os.path.join(root, "var/lib/apt/periodic/update-success-stamp")]


def refresh(source_text, name, apt_options, marks=()):
    """apt-get update for this one source; returns (ok, errors, warnings, output).

    It refreshes this source's lists only, so it must not look like a refresh of every source:
    the mtimes of `marks` are put back afterwards, and an hourly refresh (cache_valid_time) that
    follows still runs where the other sources' lists are old.
    """
    times = {}
    for path in marks:
        try:
            stat = os.stat(path)
        except OSError:
            continue
        times[path] = (stat.st_atime_ns, stat.st_mtime_ns)
    try:
        return _refresh(source_text, name, apt_options)
    finally:
        for path, (atime, mtime) in times.items():
            try:
                os.utime(path, ns=(atime, mtime))
            except OSError:
                pass


def _refresh(source_text, name, apt_options):
    tmp = tempfile.mkdtemp(prefix="gpustack-apt-source-")
    try:
        with open(os.path.join(tmp, "gpustack-%s.sources" % name), "wb") as fh:
            fh.write(source_text)
        return _update(tmp, apt_options)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def probe(files, content, keyring, auth, apt_options):
    """Check mode: apt-get update of the changed source on copies in a temporary directory (the
    source pointing at a copy of the keyring, the credentials in a private auth.conf.d, private
    package lists). Returns refresh()'s (ok, errors, warnings, output); writes nothing of the
    host's."""
    tmp = tempfile.mkdtemp(prefix="gpustack-apt-probe-")
    try:
        os.chmod(tmp, 0o755)  # apt's download sandbox (_apt) must reach the lists
        parts, lists, netrc = (os.path.join(tmp, d) for d in ("parts", "lists", "auth"))
        for directory in (parts, os.path.join(lists, "partial"), netrc):
            os.makedirs(directory, 0o755)
        ring = os.path.join(tmp, "keyring.gpg")
        write(ring, keyring, 0o644)
        text = content.replace(files["keyring"].encode("utf-8"), ring.encode("utf-8"))
        write(os.path.join(parts, os.path.basename(files["source"])), text, 0o644)
        if auth is not None:
            write(os.path.join(netrc, os.path.basename(files["auth"])), auth, 0o600)
        private = ["Dir::State::Lists=" + lists, "Dir::Etc::netrcparts=" + netrc,
                   "Dir::Etc::netrc=/dev/null", "Debug::NoLocking=1"]  # fmt: skip
        return _update(parts, list(apt_options) + private)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _update(source_parts, apt_options):
    """apt-get update of the sources in `source_parts` alone: (ok, errors, warnings, output)."""
    try:
        args = ["apt-get", "update", "-o", "Dir::Etc::SourceList=/dev/null",
                "-o", "Dir::Etc::SourceParts=" + source_parts, "-o", "APT::Get::List-Cleanup=0",
                "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=",
                "-o", "DPkg::Lock::Timeout=120"]  # fmt: skip
        args += apt_option_args(apt_options)
        env = dict(os.environ, LANG="C", LC_ALL="C", DEBIAN_FRONTEND="noninteractive")
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
        out = proc.communicate()[0].decode("utf-8", "replace")
    except OSError as exc:
        return False, [("", "cannot run apt-get: %s" % exc)], [], ""
    errors, warnings = parse_apt_errors(out)
    if proc.returncode != 0 and not errors:
        errors = [("", "apt-get update exited %d" % proc.returncode)]
    return not errors, errors, warnings, out


def offered(module, source_text, name, package, apt_options):
    """apt-cache madison of `package` in this one source's package lists (as they are now)."""
    tmp = tempfile.mkdtemp(prefix="gpustack-apt-offers-")
    try:
        with open(os.path.join(tmp, "gpustack-%s.sources" % name), "wb") as fh:
            fh.write(source_text)
        args = ["apt-cache", "-o", "Dir::Etc::SourceList=/dev/null",
                "-o", "Dir::Etc::SourceParts=" + tmp,
                "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache="]  # fmt: skip
        args += apt_option_args(apt_options)
        rc, out, err = run(args + ["madison", package], env=dict(os.environ, LANG="C", LC_ALL="C"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if rc != 0:
        reason = err.strip() or "exit %d" % rc
        module.fail_json(msg="apt-cache madison %s failed on the source %s: %s"
                         % (package, name, reason), rolled_back=False)  # fmt: skip
    return out


def sources_error(source_parts, source_list, apt_options):
    """apt's complaint when it reads this set of sources (no network), or ''.

    apt reports a source it cannot read (a conflicting Signed-By, a malformed line) while it
    parses the sources, before it looks at any package list. `apt-get indextargets` then builds
    the package cache, which takes about a second of CPU on a Debian host and writes
    /var/cache/apt/pkgcache.bin for a set of sources that is about to change. Here it reads
    empty lists and an empty dpkg status and keeps its cache in memory: the same complaints,
    no cache written, in a few milliseconds."""
    lists = tempfile.mkdtemp(prefix="gpustack-apt-lists-")
    os.mkdir(os.path.join(lists, "partial"))
    args = ["apt-get", "indextargets", "-o", "Dir::Etc::SourceList=" + source_list,
            "-o", "Dir::Etc::SourceParts=" + source_parts]  # fmt: skip
    args += apt_option_args(apt_options)
    args += ["-o", "Dir::State::Lists=" + lists, "-o", "Dir::State::status=/dev/null",
             "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache="]  # fmt: skip
    try:
        rc, _out, err = run(args, env=dict(os.environ, LANG="C", LC_ALL="C"))
    finally:
        shutil.rmtree(lists, ignore_errors=True)
    if rc == 0:
        return ""
    lines = [line[2:].strip() for line in err.splitlines() if line.startswith("E:")]
    lines = [line for line in lines if not line.startswith("The list of sources could not be read")]
    if lines:
        return "; ".join(dict.fromkeys(lines))
    if rc == 127:  # run(): the binary could not be started
        return "cannot run apt-get: %s" % err.strip()
    return "apt-get indextargets exited %d" % rc


def conflicts(files, content, root, apt_options):
    """Can apt read the host's sources with `content` as this source? ('', []) when it can, else
    (apt's reason, [the host's files apt refuses only together with it]). Writes nothing."""
    etc = os.path.join(root, "etc/apt")
    parts = os.path.join(etc, "sources.list.d")
    others = sorted(
        path for path in glob.glob(os.path.join(parts, "*"))
        if path != files["source"] and path.endswith((".list", ".sources"))
        and os.path.isfile(path)
    )  # fmt: skip
    main_list = os.path.join(etc, "sources.list")
    tmp = tempfile.mkdtemp(prefix="gpustack-apt-sources-")

    def check(candidates, with_main, ours=True):
        for name in os.listdir(tmp):
            os.remove(os.path.join(tmp, name))
        chosen = [(files["source"], content)] if ours else []
        chosen += [(path, read(path)) for path in candidates]
        for path, data in chosen:
            if data is not None:
                with open(os.path.join(tmp, os.path.basename(path)), "wb") as fh:
                    fh.write(data)
        reason = sources_error(tmp, main_list if with_main else "/dev/null", apt_options)
        return reason.replace(tmp + os.sep, parts + os.sep)  # the files' real names

    def refused_with_ours(candidates, with_main):
        return not check(candidates, with_main, ours=False) and check(candidates, with_main)

    try:
        reason = check(others, True)
        if not reason:
            return "", []
        culprits = [path for path in others if refused_with_ours([path], False)]
        if os.path.isfile(main_list) and refused_with_ours([], True):
            culprits.append(main_list)
        return reason, culprits
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def old_backups(source_path):
    return sorted(glob.glob(glob.escape(source_path) + ".*~"))


def fingerprints(module, armored):
    """The fingerprints gpg reads in the key (bytes; upper case)."""
    fd, tmp = tempfile.mkstemp(prefix="gpustack-key-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(armored)
        rc, out, _err = module.run_command(["gpg", "--batch", "--show-keys", "--with-colons", tmp])
    finally:
        os.remove(tmp)
    if rc != 0:
        return []
    return [line.split(":")[9].upper() for line in out.splitlines()
            if line.startswith("fpr:") and len(line.split(":")) > 9]  # fmt: skip


def has_pin(found, params):
    pinned = params["key_fingerprint"].replace(" ", "").upper()
    return not pinned or any(f.endswith(pinned) for f in found)


def keyring_from_armored(module, params, armored, where):
    """The keyring from a key, after its fingerprint was checked."""
    found = fingerprints(module, armored)
    if not has_pin(found, params):
        module.fail_json(
            msg="The key at %s has fingerprint(s) %s, not %s. Nothing was installed from that "
            "repository. Hint: check the key URL and the pinned fingerprint."
            % (where, ", ".join(found) or "none", params["key_fingerprint"]),
            cause="fingerprint",
        )  # fmt: skip
    rc, out, err = module.run_command(["gpg", "--batch", "--dearmor"], data=armored,
                                      binary_data=True, encoding=None)  # fmt: skip
    if rc != 0 or not out:
        reason = err.decode("utf-8", "replace").strip()
        msg = "gpg could not convert the key at %s to a keyring: %s" % (where, reason)
        module.fail_json(msg=msg)
    return out


def key_from_url(module, params):
    """(keyring, armored key): the key fetched from key_url (each run, as get_url with force
    did: a key re-published at its URL under the same fingerprint, say with a later expiry, is
    taken up), checked against the pin. Nothing is written here; a fetch that fails fails the
    module."""
    where = params["key_location"] or params["key_url"]
    armored, failure = fetch_key(params["key_url"], params["key_username"], params["key_password"])
    if armored is None:
        module.fail_json(msg=fetch_failure(failure, where, params["hint_inputs"]), cause="fetch",
                         rolled_back=False, files=[])  # fmt: skip
    return keyring_from_armored(module, params, armored, where), armored


def present(module, files):
    params = module.params
    if re.search(r"\s", params["username"] + params["password"]):
        module.fail_json(
            msg="the mirror's user name or password contains white space, which apt_auth.conf(5) "
            "cannot express. Hint: use credentials without spaces or tabs"
        )
    keyring = None
    stored_key = None
    if params["key_url"]:
        keyring, stored_key = key_from_url(module, params)
    elif params["keyring_src"]:
        keyring = read(params["keyring_src"])
        if keyring is None and not module.check_mode:
            module.fail_json(msg="keyring %s is missing" % params["keyring_src"])
    wanted = {
        files["source"]: (params["content"].encode("utf-8"), 0o644),
        files["auth"]: None,
    }
    auth = auth_text(params["auth_machine"], params["username"], params["password"])
    if auth is not None:
        wanted[files["auth"]] = (auth, 0o600)
    if params["key_url"] or params["keyring_src"]:
        wanted[files["keyring"]] = (keyring or b"", 0o644) if keyring is not None else "unknown"
    if stored_key is not None:  # kept under the state directory, restored with the rest
        wanted[files["pub"]] = (stored_key, 0o644)
    for backup in old_backups(files["source"]):
        wanted[backup] = None
    before = dict((path, snapshot(path)) for path in wanted)
    changed = sorted(path for path, want in wanted.items() if want != before[path])
    record = load_txn(files["txn"])
    pending = record is not None
    txn, made = record if record else (None, set())
    diff = []
    if files["source"] in changed:
        old = before[files["source"]]
        diff.append({
            "before_header": files["source"], "after_header": files["source"],
            "before": old[0].decode("utf-8", "replace") if old else "",
            "after": params["content"],
        })  # fmt: skip
    if files["auth"] in changed:
        diff.append({
            "before_header": files["auth"], "after_header": files["auth"],
            "before": "(current credentials, not shown)\n" if before[files["auth"]] else "",
            "after": "(new credentials, not shown)\n" if auth is not None else "",
        })  # fmt: skip
    result = {"changed": bool(changed), "files": changed, "pending": pending or bool(changed),
              "refreshed": False, "rolled_back": False, "diff": diff}  # fmt: skip
    reason, culprits = conflicts(
        files, params["content"].encode("utf-8"), params["root"], params["apt_options"]
    )
    if reason:
        hint = (
            "apt names the problem; fix that source (apt-get update shows the same), then run again"
        )
        if culprits:
            hint = (
                "%s already declare%s this repository with another signing key (or none), and apt "
                "refuses one repository under two keys: remove that source (gpustack writes its "
                "own, with the pinned key), then run again"
                % (", ".join(culprits), "" if len(culprits) > 1 else "s")
            )
        module.fail_json(
            msg="apt could not read its sources with %s in place: %s. Nothing was changed. "
            "Hint: %s" % (files["source"], reason.rstrip(". "), hint),
            cause="conflict" if culprits else "other",
            conflicting=culprits,
            rolled_back=False,
            files=[],
        )
    ring = wanted.get(files["keyring"])
    if module.check_mode:
        if changed and params["refresh"] and ring != "unknown":
            keyring = ring[0] if ring else (snapshot(files["keyring"]) or (b"",))[0]
            ok, errors, _warnings, _ = probe(files, params["content"].encode("utf-8"), keyring,
                                             auth, params["apt_options"])  # fmt: skip
            if not ok:
                unusable(module, params, files, errors, "nothing was written (check mode)")
        if params["offers"] and not changed:
            result["madison"] = offered(module, params["content"].encode("utf-8"), params["name"],
                                        params["offers"], params["apt_options"])  # fmt: skip
        module.exit_json(**result)
    if changed:
        # the directories this change creates are part of it: a rollback removes them again
        made = set(made) | missing_dirs([files["txn"]] + [p for p in changed if wanted[p]])
        state_dir = os.path.dirname(os.path.dirname(files["txn"]))
        if not os.path.isdir(state_dir):  # gpustack's state directory, readable (the key is)
            os.makedirs(state_dir, 0o755)
            os.chmod(state_dir, 0o755)
        if not pending:  # keep the oldest "before": that of the run that began the change
            txn = dict((path, before[path]) for path in wanted)
        else:
            for path in wanted:  # files this change touches that the record did not know
                txn.setdefault(path, before[path])
        save_txn(files["txn"], txn, made)
        for path in changed:
            want = wanted[path]
            put(path, None if want is None else want[0], 0o644 if want is None else want[1])
    if (changed or pending) and params["refresh"]:
        ok, errors, warnings, _ = refresh(
            params["content"].encode("utf-8"),
            params["name"],
            params["apt_options"],
            freshness_marks(params["root"], params["apt_options"]),
        )
        result["refreshed"] = True
        for warning in warnings:
            module.warn("apt-get update: %s" % warning)
        if not ok:
            restored = restore(txn) if txn else []
            os.remove(files["txn"])
            remove_dirs(made)
            done = "%d file(s) restored" % len(restored) if restored else "nothing had changed"
            unusable(module, params, files, errors, "the source was rolled back (%s)" % done,
                     restored)  # fmt: skip
        result["changed"] = True  # the package lists now know the source
    if params["offers"]:
        result["madison"] = offered(module, params["content"].encode("utf-8"), params["name"],
                                    params["offers"], params["apt_options"])  # fmt: skip
    module.exit_json(**result)


def unusable(module, params, files, errors, outcome, restored=()):
    """Fail: apt cannot use the repository (apt's reasons, the cause, what became of the host)."""
    uri = next((u for u, _ in errors if u), "")
    reasons = [r for _, r in errors if r]
    cause = classify(reasons)
    inputs = (" (%s)" % params["hint_inputs"]) if params["hint_inputs"] else ""
    module.fail_json(
        msg="apt cannot use the repository %s: %s. %s. Hint: %s"
        % (
            uri or "of " + files["source"],
            "; ".join(r.rstrip(". ") for r in reasons[:3]) or "apt-get update failed",
            outcome[0].upper() + outcome[1:],
            HINTS[cause].format(inputs=inputs),
        ),
        cause=cause,
        apt_errors=["%s %s" % e for e in errors],
        rolled_back=bool(restored),
        files=list(restored),
    )


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            state=dict(type="str", default="present", choices=["present", "commit", "rollback"]),
            content=dict(type="str", default=""),
            keyring_src=dict(type="path", default=""),
            key_url=dict(type="str", default=""),
            key_username=dict(type="str", default=""),
            key_password=dict(type="str", default="", no_log=True),
            key_fingerprint=dict(type="str", default=""),
            key_location=dict(type="str", default=""),
            auth_machine=dict(type="str", default=""),
            username=dict(type="str", default=""),
            password=dict(type="str", default="", no_log=True),
            refresh=dict(type="bool", default=True),
            hint_inputs=dict(type="str", default=""),
            offers=dict(type="str", default=""),
            root=dict(type="path", default="/"),
            apt_options=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    params = module.params
    if not re.match(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$", params["name"]):
        module.fail_json(msg="invalid repository name %r" % params["name"])
    files = paths(params["root"], params["name"])
    if params["state"] == "present":
        if not params["content"]:
            module.fail_json(msg="state=present needs content")
        present(module, files)
    record = load_txn(files["txn"])
    if params["state"] == "commit":
        if record is not None and not module.check_mode:
            commit_source(params["name"], params["root"])
        module.exit_json(changed=False, pending=False, committed=record is not None)
    # rollback
    if record is None:
        module.exit_json(changed=False, rolled_back=False, files=[])
    txn, made = record
    if module.check_mode:
        module.exit_json(changed=True, rolled_back=True, files=sorted(txn))
    restored = restore(txn)
    os.remove(files["txn"])
    remove_dirs(made)
    module.exit_json(changed=bool(restored), rolled_back=bool(restored), files=restored)


if __name__ == "__main__":
    main()
