#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Converged-host stamps: record what a role left on a host (the probe is gpustack_host_probe)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_converged
short_description: Record a host role's converged stamp
version_added: 0.1.0
description:
  - Run at the end of a successful, non-check run of a host role; writes C(<dir>/<role>.json) -
    the role's resolved inputs, the preflight facts, gpustack's content hash, the sha256 of every
    file the role manages, the versions of its packages, its holds, its services' states, the
    containerd effective configuration's sha256 and the facts the role published. The file is
    rewritten only when that content differs (changed reports it); it is mode 0600, and secret
    inputs arrive as digests (filter_plugins/gpu_converged.py).
  - The stamps are read back and re-checked by C(gpustack_host_probe) (section converged); both
    share roles/gpu_preflight/module_utils/gpustack_stamps.py.
  - C(stamps) writes several roles' stamps in one call, in order (playbooks/site.yml records the
    host roles' stamps this way at the end of its play). Each item takes the options below but
    C(dir); C(role) and C(stamps) exclude each other.
options:
  dir: {type: path, default: /var/lib/gpustack/converged, description: Where stamps live.}
  role: {type: str, description: The role the stamp is for (or give C(stamps)).}
  stamps: {type: list, elements: dict, description: "Several stamps: role, stamp, files, ..."}
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

EXAMPLES = r"""
- name: Record the driver role's converged stamp after a successful run
  gpustack.gpustack.gpustack_converged:
    role: nvidia_driver
    stamp:
      inputs: {nvidia_driver_version: 535.261.03-1}
    files: [/etc/apt/preferences.d/gpustack-nvidia-driver.pref]
    packages: [nvidia-kernel-dkms, nvidia-smi, libcuda1]
    holds: [nvidia-kernel-dkms, nvidia-smi, libcuda1]
    services: [nvidia-persistenced]
"""

RETURN = r"""
path:
  description: The first stamp file written or found unchanged.
  returned: success
  type: str
  sample: /var/lib/gpustack/converged/nvidia_driver.json
paths:
  description: Every stamp file, in the order given.
  returned: success
  type: list
  elements: str
changed_paths:
  description: The stamp files whose content changed.
  returned: success
  type: list
  elements: str
"""

import json
import os
import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_stamps import DIR, build

STAMP_OPTIONS = dict(
    role=dict(type="str"),
    stamp=dict(type="dict", default={}),
    files=dict(type="list", elements="path", default=[]),
    globs=dict(type="list", elements="str", default=[]),
    exclude=dict(type="list", elements="str", default=[]),
    packages=dict(type="list", elements="str", default=[]),
    holds=dict(type="list", elements="str", default=[]),
    services=dict(type="list", elements="str", default=[]),
    runtime=dict(type="dict", default={}),
)
ITEM_OPTIONS = dict(STAMP_OPTIONS, role=dict(type="str", required=True))


def stamp_path(params):
    return os.path.join(params["dir"], params["role"] + ".json")


def record(module, params):
    """Write one role's stamp (not in check mode); True when its content or mode differs."""
    path = stamp_path(params)
    text = json.dumps(build(params), indent=1, sort_keys=True) + "\n"
    try:
        with open(path) as fh:
            same = fh.read() == text
        if same and os.stat(path).st_mode & 0o777 == 0o600:
            return False
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
    return True


def main():
    module = AnsibleModule(
        argument_spec=dict(
            dir=dict(type="path", default=DIR),
            stamps=dict(type="list", elements="dict", options=ITEM_OPTIONS),
            **STAMP_OPTIONS,
        ),
        required_one_of=[("role", "stamps")],
        mutually_exclusive=[("role", "stamps")],
        supports_check_mode=True,
    )
    if module.params["stamps"]:
        todo = [dict(item, dir=module.params["dir"]) for item in module.params["stamps"]]
    else:
        todo = [module.params]
    for params in todo:
        if not re.match(r"^[a-z][a-z0-9_]*$", str(params["role"] or "")):
            module.fail_json(msg="record needs a role name, got %r" % params["role"])
    paths = [stamp_path(params) for params in todo]
    changed = [stamp_path(params) for params in todo if record(module, params)]
    module.exit_json(changed=bool(changed), path=paths[0], paths=paths, changed_paths=changed)


if __name__ == "__main__":
    main()
