#!/usr/bin/python
# -*- coding: utf-8 -*-
"""gpustack's own files on a host (its records, backups, markers), written in one call, in order."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_state_files
short_description: Write gpustack's own state files and directories in one call, in order
version_added: 0.1.0
description:
  - Goes through C(items) in the order given and stops at the first failure, so a run killed
    part-way leaves the earlier items done and the later ones not. container_runtime relies on
    it, as the user's original configuration is kept before the record that says it was kept,
    and the restart-pending marker is written before the configuration changes.
  - A directory item is created (parents too) with its mode. A file item is written atomically
    (a temporary file in the same directory, then a rename) with its mode, from C(content), or
    as a copy of the host file C(src). C(keep) writes it only when the destination does not exist
    yet (as copy's C(force=false)). C(backup) first copies an existing destination whose content
    changes next to it, named as ansible.builtin.copy names its backups, and gives that path as
    the change's C(backup). An item with C(write=false) is passed over.
  - For files gpustack owns (its records, backups and markers, its apt pins, its nouveau
    blacklist), and for containerd's drop-in and main configuration, written with C(backup) in
    the same call as the records that must precede them (an existing file keeps its owner and
    group, which the rename takes over as ansible.builtin.copy does).
  - Check mode writes nothing and reports what would change; diff mode gives the before and after
    of content items.
options:
  items:
    type: list
    elements: dict
    required: true
    description:
      - "dest: the path (required); state: file (default) or directory; content or src (file
        items); mode (octal string; 0644 for files, 0755 for directories); keep (bool); backup
        (bool); write (bool, default true); marks (the dest of a later file item: a marker)."
author: gpustack
"""

EXAMPLES = r"""
- name: Write gpustack's state directory, then a record in it, in that order
  gpustack.gpustack.gpustack_state_files:
    items:
      - {dest: /var/lib/gpustack, state: directory, mode: "0755"}
      - {dest: /var/lib/gpustack/example.json, content: "{}\n", mode: "0600"}
"""

RETURN = r"""
changes:
  description:
    - What changed (or would change in check mode), in order.
    - Also returned on failure, the item that failed last (with its C(backup) when one was
      taken), so that a caller can put back what this call wrote.
  type: list
  elements: dict
  sample: [{"path": "/var/lib/gpustack/container_runtime.json", "action": "created"},
           {"path": "/etc/containerd/config.toml", "action": "updated",
            "backup": "/etc/containerd/config.toml.1234.2026-11-28@22:10:00~"}]
markers:
  description: The marker items' paths that exist after the call (would exist, in check mode).
  type: list
  elements: str
  returned: success
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_files import (
    FilesError,
    write_items,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(items=dict(type="list", elements="dict", required=True)),
        supports_check_mode=True,
    )
    # Every failure names what this call had already written, the roles' rescues restore from
    # that list. When module.atomic_move cannot replace a file (a destination that is a mount
    # point: EBUSY), ansible-core 2.19 raises (caught in write_items) and older releases end the
    # module through fail_json itself, so fail_json carries the list too.
    changes = []
    exit_failed = module.fail_json
    module.fail_json = lambda msg, **kw: exit_failed(
        msg="gpustack could not write its state files: %s" % msg, changes=changes, **kw
    )
    try:
        changes, diffs, markers = write_items(module, module.params["items"], changes)
    except FilesError as exc:
        module.fail_json(msg=exc.msg)
    result = dict(changed=bool(changes), changes=changes, markers=markers)
    if diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
