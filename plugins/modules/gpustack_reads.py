#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Several reads of a host (files, read-only commands) in one module call."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_reads
short_description: Read several files and run several read-only commands in one round trip
version_added: 0.1.0
description:
  - A role that needs a file from C(/proc), a C(dpkg-query) and an C(nvidia-smi) answer paid one
    round trip per C(slurp) or C(command) task; this module does them all in one call.
  - Each file is read as C(ansible.builtin.slurp) reads it (content base64); a missing or
    unreadable file is reported (C(exists), C(error)), not a failure. Each command runs as
    C(ansible.builtin.command) runs an argv (no shell); its return code, output and error are
    reported, a failure only for those O(must_succeed) names; a missing binary is rc 127.
  - The commands must only read - the module reports C(changed=false) and runs them in check
    mode too (what C(check_mode=false) did for the tasks it replaces).
options:
  files: {type: dict, default: {}, description: Name to path.}
  commands: {type: dict, default: {}, description: Name to argv (a list of strings).}
  must_succeed:
    type: list
    elements: str
    default: []
    description: Names of commands whose non-zero return code fails the module (as a command task
      without C(failed_when) fails); the others are only reported.
author: gpustack
"""

EXAMPLES = r"""
- name: Read two files and run two read-only commands in one round trip
  gpustack.gpustack.gpustack_reads:
    files:
      version: /proc/driver/nvidia/version
      pin: /etc/apt/preferences.d/gpustack-nvidia-driver.pref
    commands:
      smi: [nvidia-smi, --query-gpu=name,uuid,memory.total, --format=csv,noheader,nounits]
      holds: [apt-mark, showhold]
    must_succeed: [holds]
  register: reads
"""

RETURN = r"""
files:
  description: Name to exists, content (base64, empty when missing), error.
  type: dict
  returned: always
commands:
  description: Name to rc, stdout, stderr (trailing newlines removed, as the command module),
    stdout_lines.
  type: dict
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_host import (
    read_failure,
    reads,
)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            files=dict(type="dict", default={}),
            commands=dict(type="dict", default={}),
            must_succeed=dict(type="list", elements="str", default=[]),
        ),
        supports_check_mode=True,
    )
    for name, argv in module.params["commands"].items():
        if not isinstance(argv, list) or not argv:
            module.fail_json(msg="commands.%s must be a non-empty argv list" % name)
    files, commands = reads(module.params["files"], module.params["commands"])
    failure = read_failure(commands, module.params["commands"], module.params["must_succeed"])
    if failure:
        module.fail_json(msg=failure, files=files, commands=commands)
    module.exit_json(changed=False, files=files, commands=commands)


if __name__ == "__main__":
    main()
