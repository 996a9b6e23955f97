#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Wait for the dpkg/apt locks and look for an interrupted dpkg run: one module call."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_dpkg_ready
short_description: Wait for the dpkg/apt locks, then look for an interrupted dpkg run
version_added: 0.1.0
description:
  - Lists the holders of dpkg's and apt's locks (C(/var/lib/dpkg/lock*), C(/var/lib/apt/lists/lock),
    C(/var/cache/apt/archives/lock)) with C(lslocks), once a second, until none is held or
    O(timeout) seconds have passed; then names the holders (pid and command line) in C(holders),
    for the caller's message. An C(lslocks) that cannot run counts as no holder.
  - With O(audit), when no lock is held, reads what an interrupted dpkg run leaves (the first
    entries of C(/var/lib/dpkg/updates), then C(dpkg --audit)) into C(audit); empty means dpkg
    is usable. It also says in C(python_apt) whether Ansible's apt module will find python3-apt
    (in this interpreter, or in one of O(interpreters), which that module respawns under);
    without it, that module installs python3-apt by itself, unannounced.
  - Reads only; runs the same in check mode.
options:
  timeout: {type: int, default: 300, description: Seconds to wait for the locks.}
  audit:
    type: bool
    default: false
    description: Also look for an interrupted dpkg run, and for python3-apt.
  interpreters:
    type: list
    elements: str
    default: [/usr/bin/python3, /usr/bin/python]
    description: The system interpreters Ansible's apt module respawns under (its own list).
author: gpustack
"""

EXAMPLES = r"""
- name: Wait up to 5 minutes for dpkg's and apt's locks, then look for an interrupted run
  gpustack.gpustack.gpustack_dpkg_ready:
    timeout: 300
    audit: true
  register: dpkg
"""

RETURN = r"""
holders: {description: "'pid N (command line)' of each holder left at the timeout.", type: list}
waited_s: {description: Seconds waited for the locks., type: float}
audit: {description: "What an interrupted run left (empty: nothing), with audit.", type: str}
python_apt:
  description: "Whether Ansible's apt module finds python3-apt (with audit; else true)."
  type: bool
"""

import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_dpkg import (
    INTERPRETERS,
    audit,
    lock_holders,
    python_apt,
)
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_host import process


def main():
    module = AnsibleModule(
        argument_spec=dict(
            timeout=dict(type="int", default=300),
            audit=dict(type="bool", default=False),
            interpreters=dict(type="list", elements="str", default=list(INTERPRETERS)),
        ),
        supports_check_mode=True,
    )
    started = time.monotonic()
    while True:
        pids = lock_holders()
        if not pids or time.monotonic() - started >= module.params["timeout"]:
            break
        time.sleep(1)
    result = dict(
        changed=False,
        holders=[process(pid) for pid in pids],
        waited_s=round(time.monotonic() - started, 1),
        audit="",
        python_apt=True,
    )
    if module.params["audit"] and not pids:
        result["audit"] = audit()
        result["python_apt"] = python_apt(module.params["interpreters"])
    module.exit_json(**result)


if __name__ == "__main__":
    main()
