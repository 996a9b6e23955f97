#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Everything container_runtime reads on a containerd host before it changes a file, in one call."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_containerd_read
short_description: Read containerd's version, files and loaded configuration in one round trip
version_added: 0.1.0
description:
  - What the container_runtime role needs before it merges the nvidia runtime into containerd's
    configuration, in one module call (one task per read paid a round trip each) -
    C(containerd --version); the main configuration (exists, content); the effective
    configuration C(containerd config dump) of the main file (of C(/dev/null) without one, the
    built-in defaults) with its return code and error; whether gpustack's record of an earlier
    change and the drop-in directory exist; the current drop-in; and what the running containerd
    loaded against its files (the check C(gpustack_containerd_loaded) makes, same keys).
  - Read-only; supports check mode. Fails when C(containerd --version) does or when the main
    configuration exists but cannot be read.
options:
  config: {type: path, required: true, description: Main configuration.}
  dropin: {type: path, required: true, description: gpustack's drop-in file.}
  record: {type: path, required: true, description: gpustack's record of an earlier change.}
  socket: {type: path, default: /run/containerd/containerd.sock, description: containerd's socket.}
  marker: {type: path, default: "", description: gpustack's restart-pending marker.}
author: gpustack
"""

EXAMPLES = r"""
- name: Read containerd's version, its files and its effective configuration
  gpustack.gpustack.gpustack_containerd_read:
    config: /etc/containerd/config.toml
    dropin: /etc/containerd/conf.d/99-nvidia.toml
    record: /var/lib/gpustack/container_runtime.json
  register: containerd
"""

RETURN = r"""
version: {description: What C(containerd --version) printed., type: str, returned: always}
main:
  description: exists, content (base64, empty without the file) of the main configuration.
  type: dict
  returned: always
dump:
  description: rc, stdout, stderr of C(containerd config dump) before any change.
  type: dict
  returned: always
record_exists: {description: gpustack's record exists., type: bool, returned: always}
dropin_dir_exists: {description: The drop-in file's directory exists., type: bool, returned: always}
dropin:
  description: exists, content (base64, empty without the file) of gpustack's drop-in.
  type: dict
  returned: always
restart_needed:
  description: Also loaded, disk, differences, restart_pending - as gpustack_containerd_loaded.
  type: bool
  returned: always
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_containerd import (
    loaded_state,
)
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_host import (
    effective_dump,
    run,
    slurp,
)


def file_state(module, path, strict):
    """{exists, content (base64)} of a file; strict: one that exists but cannot be read fails
    the module (its content must never be taken for empty and written over)."""
    exists, content, error = slurp(path)
    if exists and error and strict:
        module.fail_json(
            msg="cannot read %s: %s. gpustack changed nothing on it. Hint: make it a readable "
            "containerd configuration file (or remove it to start from containerd's defaults), "
            "then run install again." % (path, error)
        )
    return {"exists": exists, "content": content}


def main():
    module = AnsibleModule(
        argument_spec=dict(
            config=dict(type="path", required=True),
            dropin=dict(type="path", required=True),
            record=dict(type="path", required=True),
            socket=dict(type="path", default="/run/containerd/containerd.sock"),
            marker=dict(type="path", default=""),
        ),
        supports_check_mode=True,
    )
    params = module.params
    rc, out, err = run(["containerd", "--version"])
    if rc != 0:
        module.fail_json(
            msg="containerd --version failed: %s. Hint: repair the containerd installation "
            "(the package or binary on PATH), then run install again." % (err or out).strip(),
            rc=rc,
        )
    main_file = file_state(module, params["config"], strict=True)
    # the main file's, or without one the built-in defaults; loaded_state below reuses it
    dump_rc, dump_out, dump_err = effective_dump(params["config"])
    result = dict(
        changed=False,
        version=out.strip(),
        main=main_file,
        dump={"rc": dump_rc, "stdout": dump_out, "stderr": dump_err},
        record_exists=os.path.exists(params["record"]),
        dropin_dir_exists=os.path.isdir(os.path.dirname(params["dropin"])),
        dropin=file_state(module, params["dropin"], strict=False),
    )
    result.update(loaded_state(params["config"], params["socket"], params["marker"]))
    module.exit_json(**result)


if __name__ == "__main__":
    main()
