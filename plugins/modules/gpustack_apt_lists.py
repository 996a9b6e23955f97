#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Refresh the package lists when they are stale, then list the versions the sources offer: one
module call, with apt-get and apt-cache (no python3-apt)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_apt_lists
short_description: Refresh stale package lists, then ask apt-cache madison, in one call
description:
  - Measures the lists' age as C(ansible.builtin.apt)'s O(cache_valid_time) does (the mtime of
    apt's update-success stamp where it exists, else of the lists directory) and runs
    C(apt-get update) when they are older than O(valid_seconds), or when neither exists.
  - Then runs C(apt-cache madison) for O(madison) and returns its output in C(stdout), as
    C(ansible.builtin.command) would.
  - Fails on any source apt-get could not fetch or read (C(Err:) lines, C(E:) lines, signature
    errors), like C(ansible.builtin.apt)'s refresh; apt-get itself retries each fetch
    (C(Acquire::Retries)).
  - Unlike C(ansible.builtin.apt), it does not open the package cache in Python (about 0.6 s of
    CPU before and again after a refresh on a Debian host, also when the lists are fresh).
  - Check mode refreshes nothing and reports a stale refresh as a change; madison still runs.
options:
  valid_seconds:
    type: int
    default: 3600
    description: Lists younger than this are kept; 0 refreshes them whatever their age.
  refresh:
    type: bool
    default: true
    description: Whether to look at the lists' age at all (false - madison alone).
  madison:
    type: list
    elements: str
    default: []
    description: Packages to ask C(apt-cache madison) about (none - no madison call).
  lock_timeout:
    type: int
    default: 300
    description: Seconds apt-get waits for apt's locks (C(DPkg::Lock::Timeout)).
  apt_options:
    type: list
    elements: str
    default: []
    description: Extra C(-o) options for apt-get and apt-cache (tests - private directories).
  marks:
    type: list
    elements: str
    default: [/var/lib/apt/periodic/update-success-stamp, /var/lib/apt/lists]
    description: The paths whose mtime says when the lists were refreshed, the first that exists.
author: gpustack
"""

RETURN = r"""
refreshed: {description: Whether apt-get update ran., type: bool}
refresh: {description: "O(refresh): the lists' age was looked at (refreshed if stale).", type: bool}
cache_updated:
  description: "The lists' mark moved (ansible.builtin.apt's meaning); in check mode - stale."
  type: bool
cache_update_time: {description: The mark's mtime after the call (0 - none)., type: int}
stdout: {description: apt-cache madison's output (empty without madison)., type: str}
stdout_lines: {description: The same, as lines., type: list}
apt_warnings: {description: "apt-get update's W: lines that are not errors.", type: list}
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_host import (
    APT_LISTS_MARKS,
    apt_option_args,
    lists_mtime,
    parse_apt_errors,
    run,
)


def mark_time(marks):
    """ansible.builtin.apt's get_cache_mtime(): 0 when no mark exists."""
    return lists_mtime(marks) or 0


def refresh(module, env):
    timeout = "DPkg::Lock::Timeout=%d" % module.params["lock_timeout"]
    args = ["apt-get", "update", "-q", "-o", timeout]
    rc, out, err = run(args + apt_option_args(module.params["apt_options"]), env=env)
    errors, warnings = parse_apt_errors(out + "\n" + err)
    if rc != 0 and not errors:
        errors = [("", (err.strip() or "apt-get update exited %d" % rc))]
    if errors:
        reasons = ["%s: %s" % (uri, reason) if uri else reason for uri, reason in errors]
        module.fail_json(msg="apt-get update failed: %s" % "; ".join(dict.fromkeys(reasons)),
                         rc=rc, stdout=out, stderr=err)  # fmt: skip
    return warnings


def madison(module, env):
    names = module.params["madison"]
    if not names:
        return ""
    args = ["apt-cache"] + apt_option_args(module.params["apt_options"]) + ["madison"] + names
    rc, out, err = run(args, env=env)
    if rc != 0:
        lines = [line[2:].strip() for line in err.splitlines() if line.startswith("E:")]
        reason = "; ".join(lines) or err.strip() or "exit %d" % rc
        module.fail_json(msg="apt-cache madison failed: %s" % reason, rc=rc, stdout=out, stderr=err)
    return out


def main():
    module = AnsibleModule(
        argument_spec=dict(
            refresh=dict(type="bool", default=True),
            valid_seconds=dict(type="int", default=3600),
            madison=dict(type="list", elements="str", default=[]),
            lock_timeout=dict(type="int", default=300),
            apt_options=dict(type="list", elements="str", default=[]),
            marks=dict(type="list", elements="str", default=list(APT_LISTS_MARKS)),
        ),
        supports_check_mode=True,
    )
    env = dict(os.environ, LANG="C", LC_ALL="C", DEBIAN_FRONTEND="noninteractive")
    before = mark_time(module.params["marks"])
    stale = module.params["refresh"] and (
        before == 0 or time.time() - before > module.params["valid_seconds"]
    )
    refreshed, updated, warnings = False, False, []
    if stale and module.check_mode:
        updated = True
    elif stale:
        warnings = refresh(module, env)
        refreshed = True
    after = mark_time(module.params["marks"])
    updated = updated or (refreshed and after != before)
    out = madison(module, env)
    module.exit_json(changed=updated, refreshed=refreshed, refresh=module.params["refresh"],
                     cache_updated=updated,
                     cache_update_time=int(after), stdout=out, stdout_lines=out.splitlines(),
                     apt_warnings=warnings)  # fmt: skip


if __name__ == "__main__":
    main()
