#!/usr/bin/python
# -*- coding: utf-8 -*-
"""dpkg selections (hold / install) of several packages in one module call."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_dpkg_selections
short_description: Set the dpkg selection of several packages at once (hold, install)
description:
  - What C(ansible.builtin.dpkg_selections) does for one package, for a list, in one module call
    and one C(dpkg --set-selections) run (a loop pays a round trip per package).
  - Reads the current selections with C(dpkg --get-selections); changes only those that differ,
    waiting up to O(lock_timeout) for dpkg's lock (no wait, and no lock needed, when nothing
    differs).
  - Supports check mode and diff mode. C(items) lists each package that differs with its
    selection C(before) (C(not present) for a package dpkg does not know) and C(after).
options:
  names: {type: list, elements: str, required: true, description: Package names.}
  selection:
    type: str
    required: true
    choices: [install, hold, deinstall, purge]
    description: The selection to set.
  lock_timeout:
    type: int
    default: 0
    description: Seconds to wait, when a selection must change, for another package manager to
      release dpkg's lock (C(dpkg --set-selections) fails at once on a held lock); 0 does not wait.
author: gpustack
"""

import os
import re
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_host import (
    process,
    run,
)

# dpkg's refusals on a held lock (exit 2): "dpkg frontend lock was locked by another process with
# pid N", "dpkg database lock was locked ...", older "dpkg status database is locked ...".
LOCKED = re.compile(r"lock was locked by another process|database is locked by another process")
HOLDER = re.compile(r"with pid (\d+)")


def current_selections(module, names):
    """name -> selection for the packages dpkg knows (others are missing)."""
    dpkg = module.get_bin_path("dpkg", required=True)
    _rc, out, _err = module.run_command([dpkg, "--get-selections"] + list(names), check_rc=False)
    found = {}
    for line in out.splitlines():
        fields = line.split()
        if len(fields) == 2:
            found[fields[0].split(":")[0]] = fields[1]
    return found


def holder(err):
    """'pid N (command line)' of the lock holder dpkg named, else 'another process'."""
    found = HOLDER.search(err)
    return process(found.group(1)) if found else "another process"


def set_selections(module, data, timeout):
    """dpkg --set-selections, retried each second while another process holds dpkg's lock."""
    dpkg = module.get_bin_path("dpkg", required=True)
    deadline = time.time() + timeout
    while True:
        # dpkg checks its lock before it reads the selections: run() keeps its refusal
        rc, out, err = run([dpkg, "--set-selections"], data, env=dict(os.environ, LC_ALL="C"))
        if rc == 0:
            return
        if rc != 2 or not LOCKED.search(err) or time.time() >= deadline:
            break
        time.sleep(1)
    if LOCKED.search(err):
        module.fail_json(
            msg="The dpkg lock is still held after %d s by %s. Nothing was changed by this step. "
            "Hint: let that package run finish (or stop it), then run gpustack again; "
            "dpkg_ready_lock_timeout sets the wait." % (timeout, holder(err)),
            rc=rc,
            stderr=err,
        )
    module.fail_json(msg="dpkg --set-selections failed: %s" % (err or out).strip(), rc=rc)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            names=dict(type="list", elements="str", required=True),
            selection=dict(
                type="str", required=True, choices=["install", "hold", "deinstall", "purge"]
            ),
            lock_timeout=dict(type="int", default=0),
        ),
        supports_check_mode=True,
    )
    names = list(dict.fromkeys(module.params["names"]))  # order kept, duplicates dropped
    wanted = module.params["selection"]
    have = current_selections(module, names)
    items = [
        {"item": name, "before": have.get(name, "not present"), "after": wanted}
        for name in names
        if have.get(name, "not present") != wanted
    ]
    result = dict(
        changed=bool(items),
        items=items,
        diff=dict(
            before="".join("%s %s\n" % (i["item"], i["before"]) for i in items),
            after="".join("%s %s\n" % (i["item"], i["after"]) for i in items),
        ),
    )
    if items and not module.check_mode:
        data = "".join("%s %s\n" % (i["item"], wanted) for i in items)
        set_selections(module, data, module.params["lock_timeout"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
