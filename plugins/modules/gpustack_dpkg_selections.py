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
  - Reads the current selections with C(dpkg --get-selections); changes only those that differ.
  - Supports check mode and diff mode. C(items) lists each package that differs with its
    selection C(before) (C(not present) for a package dpkg does not know) and C(after).
options:
  names: {type: list, elements: str, required: true, description: Package names.}
  selection:
    type: str
    required: true
    choices: [install, hold, deinstall, purge]
    description: The selection to set.
author: gpustack
"""

from ansible.module_utils.basic import AnsibleModule


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


def main():
    module = AnsibleModule(
        argument_spec=dict(
            names=dict(type="list", elements="str", required=True),
            selection=dict(
                type="str", required=True, choices=["install", "hold", "deinstall", "purge"]
            ),
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
        dpkg = module.get_bin_path("dpkg", required=True)
        data = "".join("%s %s\n" % (i["item"], wanted) for i in items)
        module.run_command([dpkg, "--set-selections"], data=data, check_rc=True)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
