#!/usr/bin/python
# -*- coding: utf-8 -*-
"""dpkg selections (hold / install) of several packages in one module call."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_dpkg_selections
short_description: Set the dpkg selection of several packages at once (hold, install)
version_added: 0.1.0
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

EXAMPLES = r"""
- name: Hold the driver's packages
  gpustack.gpustack.gpustack_dpkg_selections:
    names: [nvidia-kernel-dkms, nvidia-smi, libcuda1]
    selection: hold
    lock_timeout: 300

- name: Release them again
  gpustack.gpustack.gpustack_dpkg_selections:
    names: [nvidia-kernel-dkms, nvidia-smi, libcuda1]
    selection: install
"""

RETURN = r"""
items:
  description: Each package whose selection differs (changed, or would change in check mode) -
    item (the name), before (C(not present) for a package dpkg does not know) and after.
  returned: always
  type: list
  elements: dict
  sample: [{item: nvidia-smi, before: install, after: hold}]
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_dpkg import (
    SelectionError,
    selection_changes,
    selections_diff,
    set_selections,
)


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
    items = selection_changes(module.params["names"], module.params["selection"])
    result = dict(changed=bool(items), items=items, diff=selections_diff(items))
    if items and not module.check_mode:
        try:
            set_selections(items, module.params["lock_timeout"])
        except SelectionError as exc:
            module.fail_json(msg=exc.msg, rc=exc.rc, stderr=exc.stderr)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
