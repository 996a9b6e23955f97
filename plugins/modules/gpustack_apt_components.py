#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Add (or remove again) archive components on existing APT sources, structurally."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_apt_components
short_description: Enable archive components (e.g. non-free) on the host's existing APT sources
version_added: 0.1.0
description:
  - Finds the APT sources (one-line C(.list) and deb822 C(.sources)) that serve one of I(suites)
    with the C(main) component and adds the missing I(components) to them, keeping every other
    field, comment and entry as it was. Works on whatever mirror the host already uses.
  - Records what it adds in I(state_file) before it changes a file, so I(state=absent) removes
    exactly that, even after a run that was killed half way.
  - Marks the change pending (C(<state_file dir>/apt-txn/archive-components.pending)) before
    it changes a file; the mark stays until I(state=commit) (the caller refreshed the package
    lists and found what it needed), I(state=rollback) or I(state=absent). C(pending) in the
    result tells the caller that an earlier run changed the sources and never refreshed the
    lists.
  - I(state=rollback) takes back only what no commit has ended yet (this run's additions, or an
    interrupted run's); what committed runs added stays (I(state=absent), the uninstall, takes
    back everything gpustack added).
  - Supports check mode and diff mode; keeps a backup of each changed file when I(backup).
options:
  components: {type: list, elements: str, required: true, description: Components to add.}
  suites: {type: list, elements: str, required: true, description: Suites whose sources change.}
  state:
    type: str
    default: present
    choices: [present, absent, commit, rollback]
    description: >-
      Add; undo everything gpustack added (absent); end the change (commit - the lists were
      refreshed); undo the change no commit ended (rollback).
  state_file: {type: path, default: /var/lib/gpustack/apt-components.json, description: Record.}
  backup: {type: bool, default: true, description: Back up changed files.}
  sources_dir: {type: path, default: /etc/apt, description: APT configuration directory.}
author: gpustack
"""

EXAMPLES = r"""
- name: Enable contrib, non-free and non-free-firmware for bookworm's suites
  gpustack.gpustack.gpustack_apt_components:
    components: [contrib, non-free, non-free-firmware]
    suites: [bookworm, bookworm-updates, bookworm-security]
  register: components

- name: End the change once the refreshed lists offer what was needed
  gpustack.gpustack.gpustack_apt_components:
    components: [contrib, non-free, non-free-firmware]
    suites: [bookworm, bookworm-updates, bookworm-security]
    state: commit

- name: Take back everything gpustack added (uninstall)
  gpustack.gpustack.gpustack_apt_components:
    components: [contrib, non-free, non-free-firmware]
    suites: [bookworm, bookworm-updates, bookworm-security]
    state: absent
"""

RETURN = r"""
files:
  description: The source files changed (would change, in check mode).
  returned: always, except when nothing was recorded and I(state) is not present
  type: list
  elements: str
entries:
  description: Each source entry changed, with its file and the components added or taken back.
  returned: as files
  type: list
  elements: dict
backups:
  description: Backup file per changed source file (with I(backup)).
  returned: as files
  type: dict
pending:
  description: A change to the sources that no I(state=commit) has ended yet (this run's or an
    interrupted run's); the caller refreshes the package lists before it trusts them.
  returned: always
  type: bool
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_apt_components import (
    ARGUMENT_SPEC,
    apply,
)


def main():
    module = AnsibleModule(argument_spec=ARGUMENT_SPEC, supports_check_mode=True)
    module.exit_json(**apply(module, module.params))


if __name__ == "__main__":
    main()
