#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Refresh the package lists when they are stale (at once where the archive components it adds
first changed the sources), then list the versions the sources offer: one module call, with
apt-get and apt-cache (no python3-apt)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_apt_lists
short_description: Refresh stale package lists, then ask apt-cache madison, in one call
version_added: 0.1.0
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
  - With O(components), first adds archive components to the host's existing sources as
    C(gpustack_apt_components) does (record and pending mark before any file changes, backups,
    diff); while that change is pending (this call's or an interrupted run's, until a caller
    commits it) the lists are refreshed whatever their age. A refresh or madison that fails
    after it reports C(sources_changed) and C(sources_pending) with its failure, for the
    caller's rollback.
  - Check mode refreshes nothing and reports a stale refresh as a change; madison still runs,
    except where O(components) would change the sources, which the lists cannot know yet
    (C(madison_skipped)).
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
  components:
    type: dict
    description:
      - Archive components to add first (C(gpustack_apt_components)' options, state present).
    suboptions:
      components: {type: list, elements: str, required: true, description: Components to add.}
      suites: {type: list, elements: str, required: true, description: Suites whose sources change.}
      state_file: {type: path, default: /var/lib/gpustack/apt-components.json, description: Record.}
      backup: {type: bool, default: true, description: Back up changed files.}
      sources_dir: {type: path, default: /etc/apt, description: APT configuration directory.}
  marks:
    type: list
    elements: str
    default: [/var/lib/apt/periodic/update-success-stamp, /var/lib/apt/lists]
    description: The paths whose mtime says when the lists were refreshed, the first that exists.
author: gpustack
"""

EXAMPLES = r"""
- name: Refresh the package lists when older than an hour, then list the driver's versions
  gpustack.gpustack.gpustack_apt_lists:
    valid_seconds: 3600
    madison: [nvidia-kernel-dkms, nvidia-smi]
  register: lists

- name: Show the versions the sources offer
  ansible.builtin.debug:
    msg: "{{ lists.stdout }}"
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
sources_changed: {description: "O(components) changed a source file in this call.", type: bool}
sources_pending:
  description: "O(components)' change is not committed yet (this call's or an earlier run's)."
  type: bool
files: {description: The source files O(components) changed (or would)., type: list}
entries: {description: What O(components) added where., type: list}
backups: {description: Backup of each changed source file., type: dict}
madison_skipped:
  description: "Check mode, sources that would change: no refresh, no madison."
  type: bool
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_apt_components import (
    ARGUMENT_SPEC as COMPONENTS_SPEC,
)
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_apt_components import (
    apply as apply_components,
)
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


def refresh(module, env, sources):
    timeout = "DPkg::Lock::Timeout=%d" % module.params["lock_timeout"]
    args = ["apt-get", "update", "-q", "-o", timeout]
    rc, out, err = run(args + apt_option_args(module.params["apt_options"]), env=env)
    errors, warnings = parse_apt_errors(out + "\n" + err)
    if rc != 0 and not errors:
        errors = [("", (err.strip() or "apt-get update exited %d" % rc))]
    if errors:
        reasons = ["%s: %s" % (uri, reason) if uri else reason for uri, reason in errors]
        module.fail_json(msg="apt-get update failed: %s" % "; ".join(dict.fromkeys(reasons)),
                         rc=rc, stdout=out, stderr=err, **sources)  # fmt: skip
    return warnings


def madison(module, env, sources):
    names = module.params["madison"]
    if not names:
        return ""
    args = ["apt-cache"] + apt_option_args(module.params["apt_options"]) + ["madison"] + names
    rc, out, err = run(args, env=env)
    if rc != 0:
        lines = [line[2:].strip() for line in err.splitlines() if line.startswith("E:")]
        reason = "; ".join(lines) or err.strip() or "exit %d" % rc
        module.fail_json(msg="apt-cache madison failed: %s" % reason, rc=rc, stdout=out, stderr=err,
                         **sources)  # fmt: skip
    return out


def components_result(module):
    """The archive components added first (O(components)), as the result's keys."""
    options = module.params["components"]
    if not options:
        return {}
    done = apply_components(module, dict(options, state="present"))
    return dict(sources_changed=done["changed"], sources_pending=done["pending"],
                files=done["files"], entries=done["entries"], backups=done["backups"],
                diff=done["diff"])  # fmt: skip


def main():
    components_spec = dict((k, v) for k, v in COMPONENTS_SPEC.items() if k != "state")
    module = AnsibleModule(
        argument_spec=dict(
            refresh=dict(type="bool", default=True),
            valid_seconds=dict(type="int", default=3600),
            madison=dict(type="list", elements="str", default=[]),
            lock_timeout=dict(type="int", default=300),
            apt_options=dict(type="list", elements="str", default=[]),
            marks=dict(type="list", elements="str", default=list(APT_LISTS_MARKS)),
            components=dict(type="dict", options=components_spec),
        ),
        supports_check_mode=True,
    )
    env = dict(os.environ, LANG="C", LC_ALL="C", DEBIAN_FRONTEND="noninteractive")
    sources = components_result(module)
    before = mark_time(module.params["marks"])
    if module.check_mode and sources.get("sources_changed"):
        module.exit_json(changed=True, refreshed=False, refresh=module.params["refresh"],
                         cache_updated=False, cache_update_time=int(before), stdout="",
                         stdout_lines=[], apt_warnings=[], madison_skipped=True,
                         **sources)  # fmt: skip
    stale = module.params["refresh"] and (
        before == 0
        or time.time() - before > module.params["valid_seconds"]
        or sources.get("sources_pending", False)
    )
    refreshed, updated, warnings = False, False, []
    if stale and module.check_mode:
        updated = True
    elif stale:
        warnings = refresh(module, env, sources)
        refreshed = True
    after = mark_time(module.params["marks"])
    updated = updated or (refreshed and after != before)
    out = madison(module, env, sources)
    module.exit_json(changed=updated or sources.get("sources_changed", False),
                     refreshed=refreshed, refresh=module.params["refresh"],
                     cache_updated=updated,
                     cache_update_time=int(after), stdout=out, stdout_lines=out.splitlines(),
                     apt_warnings=warnings, madison_skipped=False, **sources)  # fmt: skip


if __name__ == "__main__":
    main()
