# -*- coding: utf-8 -*-
"""The end of a package-source change (its commit): what it added is the host's from then on, and
a later rollback takes nothing of it back.

gpustack_apt_components (the archive components, state=commit) and gpustack_apt_source (a
repository source, state=commit) commit their own change; gpustack_apt_install commits both in
the call of the transaction that follows the version's resolution (O(commit_components),
O(commit_sources)), a round trip each fewer.
"""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import json
import os


def components_pending_path(state_file):
    """The mark gpustack_apt_components leaves until its change is committed or rolled back."""
    return os.path.join(os.path.dirname(state_file), "apt-txn", "archive-components.pending")


def write_components_record(path, record):
    state_dir = os.path.dirname(path)
    if not os.path.isdir(state_dir):
        os.makedirs(state_dir, 0o755)
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        json.dump(record, fh, indent=2)
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, path)


def commit_components(state_file):
    """What the uncommitted change added stays recorded as the host's; the pending mark goes.
    True where there was something to commit."""
    record = {}
    if os.path.exists(state_file):
        with open(state_file) as fh:
            record = json.load(fh)
    marker = components_pending_path(state_file)
    committed = "uncommitted" in record or os.path.exists(marker)
    if "uncommitted" in record:
        write_components_record(
            state_file, dict((k, v) for k, v in record.items() if k != "uncommitted")
        )
    if os.path.exists(marker):
        os.remove(marker)
    return committed


def source_txn_path(root, name):
    """gpustack_apt_source's record of the files before its uncommitted change."""
    return os.path.join(root, "var/lib/gpustack/apt-txn/%s.json" % name)


def commit_source(name, root="/"):
    """The repository source `name`'s change record goes. True where there was one."""
    path = source_txn_path(root, name)
    if os.path.exists(path):
        os.remove(path)
        return True
    return False
