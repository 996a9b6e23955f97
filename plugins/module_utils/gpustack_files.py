# -*- coding: utf-8 -*-
"""gpustack's own files on a host (its records, backups, markers, apt pins), written in order:
the items of gpustack_state_files, and of gpustack_apt_install's O(files) (the driver's pins and
nouveau blacklist, written in the call of the transaction they must precede)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import tempfile

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


class FilesError(Exception):
    """An item could not be written: the message, and what the call had written before it (and
    the item that failed, with its backup where one was taken)."""

    def __init__(self, msg, changes):
        Exception.__init__(self, msg)
        self.msg, self.changes = msg, changes


def write_items(module, items, changes=None):
    """Write `items` in order, stopping at the first failure (FilesError); check mode writes
    nothing. Returns (changes, diffs, markers); `changes`, where given, is the list the changes
    are appended to as they happen (a caller's fail_json can name them)."""
    changes = [] if changes is None else changes
    diffs, markers = [], []
    for index, item in enumerate(items):
        unknown = set(item) - _KEYS
        if unknown or not item.get("dest"):
            known = ", ".join(sorted(_KEYS))
            raise FilesError("item %r: needs dest, knows only %s" % (item, known), changes)
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
            raise FilesError(str(exc), changes) from None
    return changes, diffs, markers
