#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Converged-host stamps: record what a role left on a host (the probe is gpustack_host_probe)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_converged
short_description: Record a host role's converged stamp
description:
  - Run at the end of a successful, non-check run of a host role; writes C(<dir>/<role>.json) -
    the role's resolved inputs, the preflight facts, gpustack's content hash, the sha256 of every
    file the role manages, the versions of its packages, its holds, its services' states, the
    containerd effective configuration's sha256 and the facts the role published. The file is
    rewritten only when that content differs (changed reports it); it is mode 0600, and secret
    inputs arrive as digests (filter_plugins/gpu_converged.py).
  - The stamps are read back and re-checked by C(gpustack_host_probe) (section converged); both
    share roles/gpu_preflight/module_utils/gpustack_stamps.py.
options:
  dir: {type: path, default: /var/lib/gpustack/converged, description: Where stamps live.}
  role: {type: str, required: true, description: The role the stamp is for.}
  stamp: {type: dict, default: {}, description: "Inputs, facts, content, resolve, published."}
  files: {type: list, elements: path, default: [], description: Files the role manages.}
  globs: {type: list, elements: str, default: [], description: File patterns it reads.}
  exclude: {type: list, elements: str, default: [], description: Patterns left out of globs.}
  packages: {type: list, elements: str, default: [], description: Packages it installed.}
  holds: {type: list, elements: str, default: [], description: Packages it held.}
  services: {type: list, elements: str, default: [], description: Units it manages.}
  runtime: {type: dict, default: {}, description: "kind, config, name, binary."}
author: gpustack
"""

import json
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_stamps import DIR, build


def record(module, params):
    path = os.path.join(params["dir"], params["role"] + ".json")
    text = json.dumps(build(params), indent=1, sort_keys=True) + "\n"
    try:
        with open(path) as fh:
            same = fh.read() == text
        if same and os.stat(path).st_mode & 0o777 == 0o600:
            module.exit_json(changed=False, path=path)
    except (IOError, OSError):
        pass
    if not module.check_mode:
        if not os.path.isdir(params["dir"]):
            os.makedirs(params["dir"], 0o755)
        tmp = path + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(text)
        os.chmod(tmp, 0o600)  # root only: checksums of credential files are in it
        module.atomic_move(tmp, path)
        os.chmod(path, 0o600)  # atomic_move gives a new file the umask's mode
    module.exit_json(changed=True, path=path)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dir=dict(type="path", default=DIR),
            role=dict(type="str", required=True),
            stamp=dict(type="dict", default={}),
            files=dict(type="list", elements="path", default=[]),
            globs=dict(type="list", elements="str", default=[]),
            exclude=dict(type="list", elements="str", default=[]),
            packages=dict(type="list", elements="str", default=[]),
            holds=dict(type="list", elements="str", default=[]),
            services=dict(type="list", elements="str", default=[]),
            runtime=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    if not re.match(r"^[a-z][a-z0-9_]*$", module.params["role"]):
        module.fail_json(msg="record needs a role name, got %r" % module.params["role"])
    record(module, module.params)


if __name__ == "__main__":
    main()
