#!/usr/bin/python
# -*- coding: utf-8 -*-
"""gpustack's own files on a host (its records, backups, markers), written in one call, in order."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_state_files
short_description: Write gpustack's own state files and directories in one call, in order
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

import os
import tempfile

from ansible.module_utils.basic import AnsibleModule

_KEYS = {"dest", "state", "content", "src", "mode", "keep", "write", "backup", "marks"}


def _mode(item, default):
    text = str(item.get("mode") or default)
    try:
        return int(text, 8)
    except ValueError:
        raise ValueError("%s: mode %r is not an octal mode" % (item["dest"], text)) from None


def _read(path):
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except (IOError, OSError):
        return None


def _directory(module, item, changes):
    path, mode = item["dest"], _mode(item, "0755")
    if os.path.isdir(path):
        if os.stat(path).st_mode & 0o7777 == mode:
            return
        action = "mode"
    else:
        action = "created"
    if not module.check_mode:
        if action == "created":
            os.makedirs(path, mode)
        os.chmod(path, mode)  # makedirs applies the umask
    changes.append({"path": path, "action": action})


def _desired(item):
    """(before, data): the file's bytes now (None: absent) and what the item writes (None: the
    item leaves the file as it is)."""
    path, mode = item["dest"], _mode(item, "0644")
    before = _read(path)
    if before is not None and item.get("keep"):
        return before, None
    if item.get("src"):
        data = _read(item["src"])
        if data is None:
            raise ValueError("%s: cannot read %s to copy it" % (path, item["src"]))
    else:
        data = (item.get("content") or "").encode("utf-8")
    if before == data and os.stat(path).st_mode & 0o7777 == mode:
        return before, None
    return before, data


def _file(module, item, changes, diffs):
    path, mode = item["dest"], _mode(item, "0644")
    before, data = _desired(item)
    if data is None:
        return
    action = "created" if before is None else ("updated" if before != data else "mode")
    change = {"path": path, "action": action}
    changes.append(change)
    if module._diff and not item.get("src"):
        diffs.append({
            "before_header": path, "after_header": path,
            "before": (before or b"").decode("utf-8", "replace"), "after": data.decode("utf-8"),
        })  # fmt: skip
    if module.check_mode:
        return
    if action == "updated" and module.boolean(item.get("backup", False)):
        try:
            change["backup"] = module.backup_local(path)
        except Exception as exc:  # backup_local raises a bare Exception
            raise OSError("%s: %s" % (path, exc)) from None
    prefix = "." + os.path.basename(path) + "."
    handle, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=prefix)
    try:
        with os.fdopen(handle, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        try:
            module.atomic_move(tmp, path)
        except Exception as exc:  # ansible-core 2.19 raises a bare Exception (a busy mount point)
            cause = " (%s)" % exc.__cause__ if exc.__cause__ else ""
            raise OSError("%s: %s%s" % (path, exc, cause)) from None
        os.chmod(path, mode)  # atomic_move keeps an existing destination's mode
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _marked(module, later, marker):
    """The later file item a marker item marks."""
    for item in later:
        if item.get("dest") == marker["marks"] and item.get("state", "file") == "file":
            if not module.boolean(item.get("write", True)):
                break
            return dict(item, keep=module.boolean(item.get("keep", False)))
    raise ValueError(
        "%s: marks %s, which is not a file item written later in this call"
        % (marker["dest"], marker["marks"])
    )


def main():
    module = AnsibleModule(
        argument_spec=dict(items=dict(type="list", elements="dict", required=True)),
        supports_check_mode=True,
    )
    changes, diffs = [], []
    # Every failure names what this call had already written, the roles' rescues restore from
    # that list. When module.atomic_move cannot replace a file (a destination that is a mount
    # point: EBUSY), ansible-core 2.19 raises (caught in _file) and older releases end the module
    # through fail_json itself, so fail_json carries the list too.
    exit_failed = module.fail_json
    module.fail_json = lambda msg, **kw: exit_failed(
        msg="gpustack could not write its state files: %s" % msg, changes=changes, **kw
    )
    items = module.params["items"]
    markers = []
    for index, item in enumerate(items):
        unknown = set(item) - _KEYS
        if unknown or not item.get("dest"):
            known = ", ".join(sorted(_KEYS))
            module.fail_json(msg="item %r: needs dest, knows only %s" % (item, known))
        if not module.boolean(item.get("write", True)):
            continue
        item = dict(item, keep=module.boolean(item.get("keep", False)))
        try:
            if item.get("marks"):
                marked = _marked(module, items[index + 1 :], item)
                if os.path.exists(item["dest"]) or _desired(marked)[1] is not None:
                    markers.append(item["dest"])
                    _file(module, dict(item, keep=True), changes, diffs)
            elif item.get("state", "file") == "directory":
                _directory(module, item, changes)
            elif item.get("state", "file") == "file":
                _file(module, item, changes, diffs)
            else:
                raise ValueError("%s: state must be file or directory" % item["dest"])
        except (ValueError, IOError, OSError) as exc:
            module.fail_json(msg=str(exc))
    result = dict(changed=bool(changes), changes=changes, markers=markers)
    if diffs:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
