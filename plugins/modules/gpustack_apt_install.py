#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Install packages at exact versions with apt-get itself: one apt transaction, no python3-apt."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_apt_install
short_description: Bring packages to exact versions in one apt-get transaction
version_added: 0.1.0
description:
  - What C(ansible.builtin.apt) does with C(name=[pkg=version, ...]), C(state=present),
    C(allow_downgrade) and C(allow_change_held_packages) (and O(install_recommends)), with
    C(apt-get) alone. That module opens the whole package cache in Python (python3-apt) before
    the transaction to learn which packages need it, and runs C(apt-mark manual) after it; on a
    Debian host with the non-free sources that is about a second of the node's CPU per call.
  - Reads the installed versions with C(dpkg-query). Where every package is installed (at its
    version, where one is given) nothing runs and nothing changes. Else one
    C(apt-get install --allow-downgrades --allow-change-held-packages) (C(--no-install-recommends)
    unless O(install_recommends))
    of every C(name=version) and of the missing names without a version (apt-get marks named
    packages manually installed; an installed name without a version is left as it is), with dpkg's
    C(--force-confdef --force-confold), C(DEBIAN_FRONTEND=noninteractive) and apt's lock
    timeout, as the apt module runs it.
  - Where nothing needs the transaction but a package is marked automatically installed,
    C(apt-mark manual) for those (the apt module marks every named package manual).
  - Check mode runs C(apt-get --simulate) (no python3-apt needed) and returns its output in
    C(stdout), as the apt module does (C(gpustack plan) reads the C(Inst) lines).
  - "A failed transaction fails the module with apt-get's error, as the apt module words it
    (C('CMD' failed - STDERR), with a colon)."
  - What must surround the transaction can go in the same call, in this order (each optional).
    Before it, in the call itself (also where the transaction then runs in the background), the
    package sources' changes committed (O(commit_components), O(commit_sources); the version was
    found there, as C(state=commit) of gpustack_apt_components and gpustack_apt_source) and
    gpustack's own files written (O(files), as gpustack_state_files; the driver's apt pins and
    nouveau blacklist). Then the record of the packages installed before (O(record), written
    once); a runtime mask on units whose package scripts must not start them (O(mask_runtime),
    lifted after the transaction whether it failed or not, and wherever a killed earlier run left
    one); then, after
    a transaction that succeeded or was not needed, units enabled (O(enable)), packages held
    (O(hold), O(hold_present)) and reads of the host (O(reads), as C(gpustack_reads)). The driver
    role's mask, transaction, unmask and enable, and hold were four tasks, four round trips
    (docs/performance.md); the commits and the pins' write three more.
  - With O(background) (not in check mode) a call whose transaction is needed starts it in a
    process of its own on the host and returns at once with RV(job); a later call with O(join)
    waits for it there and returns what the call would have returned. Meanwhile the play goes on
    with work that does not need these packages (in site.yml the container runtime's wiring). The
    transaction finishes on the host even when the controller goes away.
options:
  packages:
    type: list
    elements: str
    required: true
    description: C(name=version) (that version exactly) or C(name) (any version, the candidate
      where missing).
  install_recommends:
    type: bool
    default: false
    description: Install the packages' recommends too (C(--no-install-recommends) without it).
  lock_timeout:
    type: int
    default: 300
    description: Seconds apt-get waits for dpkg's lock (C(DPkg::Lock::Timeout)).
  apt_options:
    type: list
    elements: str
    default: []
    description: Extra C(-o) options for apt-get (tests).
  pins:
    type: list
    elements: dict
    default: []
    description:
      - In check mode, the apt pin files (C(dest), C(content)) the run writes before its
        transaction. The simulation runs with C(/etc/apt/preferences.d) as the run will leave it
        (a temporary copy with these files in it, C(Dir::Etc::PreferencesParts)), so that a
        version change that the pin on disk still refuses simulates as it will install. Outside
        check mode the caller has written them; not used.
  commit_components:
    type: path
    description: The record of gpustack_apt_components (C(state_file)) whose uncommitted change
      is committed before anything else in the call (not in check mode).
  commit_sources:
    type: list
    elements: str
    default: []
    description: gpustack_apt_source repository names whose uncommitted change is committed
      there too (not in check mode).
  sources_root:
    type: path
    default: /
    description: The root O(commit_sources) are found under, as gpustack_apt_source's C(root)
      (tests).
  files:
    type: list
    elements: dict
    default: []
    description: Items as gpustack_state_files takes them, written in order after the commits
      and before the record (check mode and diff as there; RV(changes), RV(markers)). A failure
      fails the call before anything else happens.
  preferences_dir:
    type: path
    default: /etc/apt/preferences.d
    description: apt's preferences directory (tests).
  extended_states:
    type: path
    default: /var/lib/apt/extended_states
    description: apt's record of automatically installed packages (tests).
  record:
    type: path
    description: Where the names of the installed packages (held or not) are written, one per
      line, before the transaction; only where the file does not exist yet (written complete or
      not at all). Check mode writes nothing and reports RV(recorded).
  mask_runtime:
    type: list
    elements: str
    default: []
    description:
      - Units masked with C(systemctl mask --runtime) for the transaction (not in check mode);
        each is unmasked after it, failed or not, and wherever a runtime mask is found.
      - systemd reloads once for both. The mask goes without a reload where systemd knows none of
        the units (C(LoadState) C(not-found), a first install; the unit is loaded from disk, mask
        first, when asked for, and its package's script reloads systemd before starting it); the
        unmask goes without one, and the enable of O(enable) after it reloads (a
        C(daemon-reload) where nothing is to be enabled, or the transaction failed).
  enable:
    type: list
    elements: str
    default: []
    description: Units enabled after the transaction (or where none was needed), unless they are
      (not in check mode). RV(enabled) says which.
  hold:
    type: list
    elements: str
    default: []
    description: Packages put on hold after the transaction (dpkg selections, as
      C(gpustack_dpkg_selections)); in check mode RV(holds) says what would change.
  hold_present:
    type: list
    elements: str
    default: []
    description: Packages put on hold as O(hold), those of them that are installed.
  reads:
    type: dict
    default: {}
    description: Reads after the transaction (in check mode too), as C(gpustack_reads) takes
      them (C(files), C(commands), C(must_succeed)); returned in RV(reads).
  initramfs:
    type: dict
    description:
      - After the reads (not in check mode), where O(initramfs.marker) exists - the nouveau
        blacklist changed and no regeneration succeeded since - O(initramfs.argv) runs and the
        marker is removed once it succeeded (RV(initramfs) C(regenerated)); a host without the
        tool (argv's first word not an executable file) has nothing to regenerate (C(no tool),
        marker removed). A failing tool fails the call with its output, the marker kept.
    suboptions:
      marker: {type: path, required: true, description: The pending regeneration's marker.}
      argv: {type: list, elements: str, required: true, description: The tool, by absolute path.}
  background:
    type: bool
    default: false
    description: Start a needed transaction on the host and return without waiting (RV(job));
      ignored in check mode and where no transaction is needed (the call then does it all).
  job_dir:
    type: path
    default: /var/lib/gpustack/jobs
    description: Where a background transaction keeps its process id and its result.
  join:
    type: path
    description: Wait for the background transaction of this RV(job) and return its result (the
      other options are not used).
  join_timeout:
    type: int
    default: 7200
    description: Seconds O(join) waits (a DKMS build can take many minutes).
  containerd_loaded:
    type: dict
    description:
      - With O(join), once the transaction succeeded - gpustack_containerd_loaded's check with
        these options (config, socket, marker, name, binary, test_container), returned as
        RV(containerd_loaded). site.yml hands over container_runtime's verify step this way where
        containerd was wired while the transaction installed the runtime binary - one round trip
        fewer on the host whose transaction ends last.
    suboptions:
      config: {type: path, default: /etc/containerd/config.toml, description: Main configuration.}
      socket: {type: path, default: /run/containerd/containerd.sock, description: The socket.}
      marker: {type: path, default: "", description: gpustack's restart-pending marker.}
      name: {type: str, default: nvidia, description: The runtime handler gpustack adds.}
      binary: {type: path, default: "", description: The NVIDIA runtime binary.}
      test_container:
        type: dict
        default: {}
        description: image, snapshotter, ctr_args (list), container, as gpustack_containerd_loaded.
author: gpustack
"""

EXAMPLES = r"""
- name: Install the driver at an exact version, held, in one apt-get transaction
  gpustack.gpustack.gpustack_apt_install:
    packages: [nvidia-kernel-dkms=535.261.03-1, nvidia-smi=535.261.03-1, libcuda1=535.261.03-1]
    hold: [nvidia-kernel-dkms, nvidia-smi, libcuda1]
    lock_timeout: 300
  register: driver_packages

- name: The same, and read nvidia-smi's answer in the same round trip
  gpustack.gpustack.gpustack_apt_install:
    packages: [nvidia-container-toolkit=1.17.8-1]
    hold: [nvidia-container-toolkit]
    reads:
      commands:
        version: [nvidia-ctk, --version]
  register: toolkit_packages
"""

RETURN = r"""
stdout: {description: apt-get's output (the simulation's in check mode)., type: str}
stderr: {description: apt-get's standard error., type: str}
cmd: {description: The apt-get command line (absent when none ran)., type: list}
needed:
  description: The packages that were not installed at their version before the call.
  type: list
manual: {description: Packages marked manually installed by apt-mark., type: list}
recorded: {description: O(record) was written (would be, in check mode)., type: bool}
enabled:
  description: Unit to C(enabled) (enabled by this call) or C(was enabled).
  type: dict
holds:
  description: Each package whose selection changed (would change in check mode) to hold, with
    its selection C(before) (C(not present) for one dpkg does not know) and C(after).
  type: list
reads:
  description: O(reads) as C(gpustack_reads) returns them (C(files), C(commands)).
  type: dict
initramfs:
  description: "O(initramfs): C(regenerated), C(no tool), or empty (no marker, check mode)."
  type: str
job:
  description: A started background transaction (for O(join)); empty where none started.
  type: str
committed:
  description: The source changes O(commit_components) and O(commit_sources) ended (C(archive
    components), the repository names).
  type: list
changes:
  description: What O(files) changed (would change in check mode), as gpustack_state_files.
  type: list
markers:
  description: The marker items of O(files) that exist after the call, as gpustack_state_files.
  type: list
steps:
  description: Where the transaction's time went - each step that ran, as C([name, start, end])
    in seconds since the epoch on the host's clock (C(dpkg-query), C(record), C(mask),
    C(apt-get) or C(apt-mark), C(unmask), C(enable), C(holds), C(reads), C(initramfs)); also
    for a failed step. A background transaction's steps come with O(join)'s result.
  type: list
containerd_loaded:
  description: gpustack_containerd_loaded's result for O(containerd_loaded), after a transaction
    that succeeded.
  type: dict
  returned: with O(join) and O(containerd_loaded)
"""

import contextlib
import json
import os
import shutil
import tempfile
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_apt_commit import (
    commit_components,
    commit_source,
)
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_containerd import (
    LOADED_CHECK_OPTIONS,
    loaded_check,
)
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_dpkg import (
    SelectionError,
    selection_changes,
    selections_diff,
    set_selections,
)
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_files import (
    FilesError,
    write_items,
)
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_host import (
    apt_option_args,
    packages,
    read_failure,
    reads,
    run,
)

ENV = dict(DEBIAN_FRONTEND="noninteractive", DEBIAN_PRIORITY="critical", LANG="C", LC_ALL="C",
           LC_MESSAGES="C", LC_CTYPE="C", LANGUAGE="C")  # fmt: skip
DPKG_OPTIONS = ["-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"]
INITRAMFS_OPTIONS = dict(
    marker=dict(type="path", required=True),
    argv=dict(type="list", elements="str", required=True),
)
# Where `systemctl mask --runtime` puts its link.
RUNTIME_UNITS = "/run/systemd/system"


class Failed(Exception):
    """A step failed: the module fails with this message and these result keys."""

    def __init__(self, msg, **result):
        Exception.__init__(self, msg)
        self.result = dict(result, msg=msg)


@contextlib.contextmanager
def timed(steps, name):
    """Append [name, start, end] (epoch seconds, the host's clock) to steps, also for a step
    that fails (RV(steps))."""
    start = time.time()
    try:
        yield
    finally:
        steps.append([name, round(start, 3), round(time.time(), 3)])


def split(spec):
    name, _, version = spec.partition("=")
    return name.strip(), version.strip() or None


def spec_text(name, version):
    return "%s=%s" % (name, version) if version else name


def auto_marked(names, path):
    """The names apt's extended_states marks Auto-Installed (any architecture)."""
    try:
        with open(path) as fh:
            text = fh.read()
    except (IOError, OSError):
        return []
    marked = set()
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line)
        if fields.get("Auto-Installed", "").strip() == "1":
            marked.add(fields.get("Package", "").strip())
    return [name for name in names if name in marked]


def preferences_as_written(directory, pins):
    """A temporary copy of apt's preferences directory with the pin files a run writes."""
    copy = tempfile.mkdtemp(prefix="gpustack-preferences-")
    names = os.listdir(directory) if os.path.isdir(directory) else []
    for name in names:
        if os.path.isfile(os.path.join(directory, name)):
            shutil.copy(os.path.join(directory, name), copy)
    for pin in pins:
        with open(os.path.join(copy, os.path.basename(pin["dest"])), "w") as fh:
            fh.write(pin.get("content") or "")
    return copy


def needed_specs(specs):
    """The name=version specs apt must act on (the packages not installed at their version)."""
    have = packages([name for name, _ in specs])  # held or not; half-configured: apt finishes them
    return have, [
        spec_text(name, version)
        for name, version in specs
        if name not in have or (version and have[name] != version)
    ]


def write_record(path, check_mode):
    """The installed packages' names, once: False where the record exists already."""
    if os.path.exists(path):
        return False
    if check_mode:
        return True
    rc, out, err = run(["dpkg-query", "-W", "-f=${Package} ${db:Status-Abbrev}\n"])
    if rc != 0:
        raise Failed("dpkg-query could not list the installed packages: %s" % err.strip(), rc=rc)
    names = [f[0] for f in (line.split() for line in out.splitlines()) if len(f) > 1
             and f[1][:2] in ("ii", "hi")]  # fmt: skip
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path + ".tmp", "w") as fh:
            fh.write("".join(name + "\n" for name in names))
        os.rename(path + ".tmp", path)
    except (IOError, OSError) as exc:
        raise Failed("could not write %s (nothing was installed): %s" % (path, exc)) from None
    return True


def systemctl(*args):
    rc, out, err = run(["systemctl"] + list(args))
    if rc != 0:
        raise Failed("systemctl %s failed: %s" % (" ".join(args), (err or out).strip()), rc=rc)


def mask(units):
    """`systemctl mask --runtime` for the transaction, without systemd's reload where systemd
    knows none of the units (a first install: LoadState not-found). A unit systemd has not loaded
    is loaded from disk, where the mask is found first, when it is asked for (systemd >= 246
    retries a not-found unit once its unit directories changed); and the package scripts that
    start it reload systemd before (dh_installsystemd's postinst). A unit systemd has loaded (an
    upgrade) is masked with the reload, as before. The reload took 0.1-0.5 s on a lab node."""
    rc, out, _err = run(["systemctl", "show", "--property=LoadState", "--value"] + list(units))
    unknown = rc == 0 and [line.strip() for line in out.splitlines() if line.strip()] == [
        "not-found"] * len(units)  # fmt: skip
    systemctl("mask", "--runtime", *((["--no-reload"] if unknown else []) + list(units)))


def runtime_masked(unit):
    link = os.path.join(RUNTIME_UNITS, unit)
    return os.path.islink(link) and os.readlink(link) == os.devnull


def apt_get(params, specs, have, check_mode):
    """One apt-get install of what is needed: (changed, result keys); Failed with apt's words."""
    wanted = [spec_text(name, version) for name, version in specs if version or name not in have]
    preferences = None
    if check_mode and params["pins"]:
        preferences = preferences_as_written(params["preferences_dir"], params["pins"])
    cmd = (
        ["apt-get", "-y"]
        + DPKG_OPTIONS
        + ["-o", "DPkg::Lock::Timeout=%d" % params["lock_timeout"]]
        + apt_option_args(params["apt_options"])
        + (["-o", "Dir::Etc::PreferencesParts=%s" % preferences] if preferences else [])
        + (["--simulate"] if check_mode else [])
        + ([] if params["install_recommends"] else ["--no-install-recommends"])
        + ["--allow-downgrades", "--allow-change-held-packages"]
        + ["install"]
        + wanted
    )
    try:
        rc, out, err = run(cmd, env=dict(os.environ, **ENV))
    finally:
        if preferences:
            shutil.rmtree(preferences, ignore_errors=True)
    if rc != 0:
        raise Failed("'%s' failed: %s" % (" ".join(cmd), err), rc=rc, stdout=out, stderr=err,
                     cmd=cmd)  # fmt: skip
    return dict(stdout=out, stderr=err, cmd=cmd)


def transaction(params, check_mode):
    """The whole call but a background start or a join: the module's result (failed, msg on a
    failure)."""
    specs = [split(spec) for spec in params["packages"] if spec.strip()]
    names = [name for name, _ in specs]
    result = dict(changed=False, stdout="", stderr="", needed=[], manual=[], recorded=False,
                  enabled={}, holds=[], reads={}, initramfs="", steps=[])  # fmt: skip
    steps = result["steps"]
    try:
        with timed(steps, "dpkg-query"):
            have, needed = needed_specs(specs)
        result["needed"] = needed
        if params["record"]:
            with timed(steps, "record"):
                result["recorded"] = write_record(params["record"], check_mode)
        masked = lifted = []
        succeeded = False
        try:
            if needed and not check_mode and params["mask_runtime"]:
                with timed(steps, "mask"):
                    mask(params["mask_runtime"])
                masked = list(params["mask_runtime"])
            if needed:
                with timed(steps, "apt-get"):
                    result.update(apt_get(params, specs, have, check_mode), changed=True)
            else:
                auto = auto_marked(names, params["extended_states"])
                if auto and not check_mode:
                    with timed(steps, "apt-mark"):
                        rc, _out, err = run(["apt-mark", "manual"] + auto,
                                            env=dict(os.environ, **ENV))  # fmt: skip
                    if rc != 0:
                        raise Failed("apt-mark manual failed: %s" % err.strip(), rc=rc)
                result["manual"] = auto
            succeeded = True
        finally:
            if not check_mode:  # also a mask a killed earlier run left
                lifted = [unit for unit in params["mask_runtime"]
                          if unit in masked or runtime_masked(unit)]  # fmt: skip
                if lifted:
                    # systemd reloads once: in the enable step after a transaction that
                    # succeeded, at once after one that failed
                    with timed(steps, "unmask"):
                        systemctl("unmask", "--runtime", "--no-reload", *lifted)
                        if not succeeded:
                            systemctl("daemon-reload")
        after(params, check_mode, result, reload_pending=bool(lifted))
    except Failed as exc:
        result.update(exc.result, failed=True)
    except SelectionError as exc:
        result.update(failed=True, msg=exc.msg, rc=exc.rc, stderr=exc.stderr)
    result["changed"] = bool(result["changed"] or result["recorded"] or result["holds"]
                             or "enabled" in result["enabled"].values()
                             or result["initramfs"] == "regenerated")  # fmt: skip
    return result


def after(params, check_mode, result, reload_pending=False):
    """After a transaction that succeeded or was not needed: enable, hold, read. With
    reload_pending (units unmasked without systemd's reload), `systemctl enable` reloads, or a
    daemon-reload where nothing is to be enabled."""
    steps = result["steps"]
    if not check_mode and (params["enable"] or reload_pending):
        with timed(steps, "enable"):
            try:
                for unit in params["enable"]:
                    if run(["systemctl", "is-enabled", "--quiet", unit])[0] == 0:
                        result["enabled"][unit] = "was enabled"
                    else:
                        systemctl("enable", "--quiet", unit)
                        result["enabled"][unit] = "enabled"
                        reload_pending = False
            finally:
                if reload_pending:
                    systemctl("daemon-reload")
    if params["hold"] or params["hold_present"]:
        with timed(steps, "holds"):
            present = packages(params["hold_present"]) if params["hold_present"] else {}
            names = params["hold"] + [name for name in params["hold_present"] if name in present]
            result["holds"] = selection_changes(names, "hold") if names else []
            if result["holds"]:
                result["diff"] = selections_diff(result["holds"])
                if not check_mode:
                    set_selections(result["holds"], params["lock_timeout"])
    spec = params["reads"]
    if spec:
        argvs = spec.get("commands") or {}
        with timed(steps, "reads"):
            files, commands = reads(spec.get("files") or {}, argvs)
        result["reads"] = dict(files=files, commands=commands)
        failure = read_failure(commands, argvs, spec.get("must_succeed") or [])
        if failure:
            raise Failed(failure)
    if params["initramfs"] and not check_mode:
        with timed(steps, "initramfs"):
            result["initramfs"] = regenerate_initramfs(params["initramfs"])


def regenerate_initramfs(spec):
    """The initramfs regenerated where its marker says so (configure.yml's task, where this call
    did not run): `regenerated`, `no tool`, or empty (no marker)."""
    marker, argv = spec["marker"], spec["argv"]
    if not os.path.exists(marker):
        return ""
    done = "no tool"
    if os.path.isfile(argv[0]) and os.access(argv[0], os.X_OK):
        rc, out, err = run(argv, env=dict(os.environ, **ENV))
        if rc != 0:
            said = " ".join(text.strip() for text in (out, err) if text.strip())
            raise Failed("'%s' failed (the initramfs is regenerated again on the next run): %s"
                         % (" ".join(argv), said or "exit %d" % rc), rc=rc)  # fmt: skip
        done = "regenerated"
    os.unlink(marker)
    return done


def write_json(path, data):
    with open(path + ".tmp", "w") as fh:
        json.dump(data, fh)
    os.rename(path + ".tmp", path)


def start(params):
    """Run the transaction in a process of its own (detached from the module's SSH session):
    returns the job's path; the process writes JOB.pid at once and JOB.json at its end."""
    directory = params["job_dir"]
    os.makedirs(directory, mode=0o700, exist_ok=True)
    for name in os.listdir(directory):  # what no run joined (a run that failed meanwhile)
        path = os.path.join(directory, name)
        if name.endswith(".json") or (name.endswith(".pid") and not alive(read_pid(path))):
            os.unlink(path)
    job = os.path.join(directory, "apt-install-%d-%d" % (time.time(), os.getpid()))
    child = os.fork()
    if child == 0:  # a session of its own, then a grandchild that init adopts
        try:
            os.setsid()
            grandchild = os.fork()
            if grandchild:
                write_json(job + ".pid", {"pid": grandchild})
                os._exit(0)
            os.chdir("/")
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(3, 1024)
            try:
                result = transaction(params, False)
            except Exception as exc:  # never leave the joining call without an answer
                msg = "the package transaction failed: %s" % exc
                result = dict(failed=True, changed=True, msg=msg)
            write_json(job + ".json", result)
        finally:
            os._exit(0)
    os.waitpid(child, 0)
    return job


def read_pid(path):
    try:
        with open(path) as fh:
            return json.load(fh)["pid"]
    except (IOError, OSError, ValueError, KeyError, TypeError):
        return None


def alive(pid):
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True


def join(job, timeout):
    """The result of the background transaction `job`, once it is there."""
    deadline = time.time() + timeout
    while not os.path.exists(job + ".json"):
        pid = read_pid(job + ".pid")
        if os.path.exists(job + ".json"):
            break
        if not alive(pid):
            msg = ("The background package transaction %s ended without a result. Hint: look at "
                   "/var/log/apt/term.log on the host, then run gpustack again." % job)  # fmt: skip
            return dict(failed=True, changed=True, msg=msg)
        if time.time() >= deadline:
            msg = ("The background package transaction %s (pid %d) is still running after %d s; "
                   "it goes on on the host. Hint: wait for it (dpkg's lock), then run gpustack "
                   "again." % (job, pid, timeout))  # fmt: skip
            return dict(failed=True, changed=True, msg=msg)
        time.sleep(0.1)
    with open(job + ".json") as fh:
        result = json.load(fh)
    for suffix in (".json", ".pid"):
        if os.path.exists(job + suffix):
            os.unlink(job + suffix)
    return result


def prepare(module, params):
    """Before the transaction, in the call's own process: the sources' changes committed, then
    gpustack's files written. (result keys, diffs); fails the module on an error."""
    committed = []
    changes = []
    try:
        if not module.check_mode:
            if params["commit_components"] and commit_components(params["commit_components"]):
                committed.append("archive components")
            committed += [name for name in params["commit_sources"]
                          if commit_source(name, params["sources_root"])]  # fmt: skip
        changes, diffs, markers = write_items(module, params["files"], changes)
    except FilesError as exc:
        module.fail_json(msg="gpustack could not write its state files: %s" % exc.msg,
                         changes=changes, committed=committed)  # fmt: skip
    except (IOError, OSError, ValueError) as exc:
        module.fail_json(msg="gpustack could not commit the package sources' change: %s" % exc)
    return dict(committed=committed, changes=changes, markers=markers), diffs


def main():
    module = AnsibleModule(
        argument_spec=dict(
            packages=dict(type="list", elements="str", default=[]),
            install_recommends=dict(type="bool", default=False),
            lock_timeout=dict(type="int", default=300),
            apt_options=dict(type="list", elements="str", default=[]),
            pins=dict(type="list", elements="dict", default=[]),
            preferences_dir=dict(type="path", default="/etc/apt/preferences.d"),
            extended_states=dict(type="path", default="/var/lib/apt/extended_states"),
            commit_components=dict(type="path"),
            commit_sources=dict(type="list", elements="str", default=[]),
            sources_root=dict(type="path", default="/"),
            files=dict(type="list", elements="dict", default=[]),
            record=dict(type="path"),
            mask_runtime=dict(type="list", elements="str", default=[]),
            enable=dict(type="list", elements="str", default=[]),
            hold=dict(type="list", elements="str", default=[]),
            hold_present=dict(type="list", elements="str", default=[]),
            reads=dict(type="dict", default={}),
            initramfs=dict(type="dict", options=INITRAMFS_OPTIONS),
            background=dict(type="bool", default=False),
            job_dir=dict(type="path", default="/var/lib/gpustack/jobs"),
            join=dict(type="path"),
            join_timeout=dict(type="int", default=7200),
            containerd_loaded=dict(type="dict", options=LOADED_CHECK_OPTIONS),
        ),
        required_one_of=[("packages", "join")],
        supports_check_mode=True,
    )
    params = module.params
    for name, argv in (params["reads"].get("commands") or {}).items():
        if not isinstance(argv, list) or not argv:
            module.fail_json(msg="reads.commands.%s must be a non-empty argv list" % name)
    if params["join"]:
        result = join(params["join"], params["join_timeout"])
        if params["containerd_loaded"] is not None and not result.get("failed"):
            result["containerd_loaded"] = loaded_check(module, params["containerd_loaded"])
    else:
        before, diffs = prepare(module, params)
        if params["background"] and not module.check_mode:
            specs = [split(spec) for spec in params["packages"] if spec.strip()]
            if needed_specs(specs)[1]:
                module.exit_json(changed=True, job=start(params), started=True, **before,
                                 **(dict(diff=diffs) if diffs else {}))  # fmt: skip
            result = transaction(params, False)
        else:
            result = transaction(params, module.check_mode)
        result.update(before, changed=result["changed"] or bool(before["changes"]))
        if diffs:
            result["diff"] = diffs + ([result["diff"]] if result.get("diff") else [])
    result.setdefault("job", "")
    if result.pop("failed", False):
        module.fail_json(**result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
