# -*- coding: utf-8 -*-
"""dpkg selections (hold, install, ...) of several packages: read them, set those that differ;
and whether dpkg is usable: the holders of its and apt's locks, what an interrupted run left,
whether Ansible's apt module finds python3-apt.

Shared by gpustack_dpkg_selections and gpustack_dpkg_ready (roles/dpkg_ready), gpustack_apt_install
(which holds what its transaction installed in the same call) and gpustack_host_probe (section
dpkg: site.yml's probe reads dpkg's state, and dpkg_ready's own call is needed only where it
found something to wait for or finish).
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import importlib.util
import os
import re
import sys
import time

from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_host import (
    process,
    run,
    which,
)

# dpkg's refusals on a held lock (exit 2): "dpkg frontend lock was locked by another process with
# pid N", "dpkg database lock was locked ...", older "dpkg status database is locked ...".
LOCKED = re.compile(r"lock was locked by another process|database is locked by another process")
HOLDER = re.compile(r"with pid (\d+)")


class SelectionError(Exception):
    """dpkg refused the selections; the message is the task's error (one line, with a hint)."""

    def __init__(self, msg, rc, stderr):
        Exception.__init__(self, msg)
        self.msg, self.rc, self.stderr = msg, rc, stderr


def current_selections(names):
    """name -> selection for the packages dpkg knows (others are missing)."""
    _rc, out, _err = run(["dpkg", "--get-selections"] + list(names))
    found = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 2:
            found[fields[0].split(":")[0]] = fields[1]
    return found


def selection_changes(names, wanted, have=None):
    """{item, before, after} for each of `names` (order kept, duplicates dropped) whose selection
    is not `wanted`; `before` is 'not present' for a package dpkg does not know."""
    names = list(dict.fromkeys(names))
    have = current_selections(names) if have is None else have
    return [
        {"item": name, "before": have.get(name, "not present"), "after": wanted}
        for name in names
        if have.get(name, "not present") != wanted
    ]


def selections_diff(items):
    return dict(
        before="".join("%s %s\n" % (i["item"], i["before"]) for i in items),
        after="".join("%s %s\n" % (i["item"], i["after"]) for i in items),
    )


def holder(err):
    """'pid N (command line)' of the lock holder dpkg named, else 'another process'."""
    found = HOLDER.search(err)
    return process(found.group(1)) if found else "another process"


def set_selections(items, timeout):
    """dpkg --set-selections of `items` (selection_changes), retried each second while another
    process holds dpkg's lock, up to `timeout` seconds; SelectionError when dpkg refuses."""
    data = "".join("%s %s\n" % (i["item"], i["after"]) for i in items)
    deadline = time.time() + timeout
    while True:
        # dpkg checks its lock before it reads the selections: run() keeps its refusal
        rc, out, err = run(["dpkg", "--set-selections"], data, env=dict(os.environ, LC_ALL="C"))
        if rc == 0:
            return
        if rc != 2 or not LOCKED.search(err) or time.time() >= deadline:
            break
        time.sleep(1)
    if LOCKED.search(err):
        raise SelectionError(
            "The dpkg lock is still held after %d s by %s. Nothing was changed by this step. "
            "Hint: let that package run finish (or stop it), then run gpustack again; "
            "dpkg_ready_lock_timeout sets the wait." % (timeout, holder(err)),
            rc,
            err,
        )
    raise SelectionError("dpkg --set-selections failed: %s" % (err or out).strip(), rc, err)


LOCKS = re.compile(r"/var/lib/dpkg/lock|/var/lib/apt/lists/lock|/var/cache/apt/archives/lock")
INTERPRETERS = ("/usr/bin/python3", "/usr/bin/python")  # ansible.builtin.apt's own list


def lock_holders():
    """The pids holding dpkg's or apt's locks (lslocks unusable: none)."""
    if not which("lslocks"):
        return []
    rc, out, _err = run(["lslocks", "--noheadings", "--raw", "--output", "PID,PATH"])
    if rc != 0:
        return []
    pids = [line.split()[0] for line in out.splitlines() if line.split() and LOCKS.search(line)]
    return list(dict.fromkeys(pids))


def audit():
    """What an interrupted dpkg run left: the first entries of /var/lib/dpkg/updates, then
    `dpkg --audit` (empty: dpkg is usable)."""
    lines = []
    try:
        lines.extend(sorted(os.listdir("/var/lib/dpkg/updates"))[:5])
    except (IOError, OSError):
        pass
    _rc, out, err = run(["dpkg", "--audit"])
    lines.extend((out + err).splitlines()[:20])
    return "\n".join(lines)


def python_apt(interpreters=INTERPRETERS):
    """Whether Ansible's apt module finds python3-apt: in this interpreter (its own import), or
    in a system interpreter it would respawn under (ansible.builtin.apt, `respawn_module`)."""
    if all(importlib.util.find_spec(name) is not None for name in ("apt", "apt_pkg")):
        return True
    own = os.path.realpath(sys.executable)
    for path in interpreters:
        if os.path.exists(path) and os.path.realpath(path) != own:
            if run([path, "-c", "import apt, apt_pkg"])[0] == 0:
                return True
    return False
