#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Apply a named MIG layout on a host (or, in check mode, say what would change)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_mig
short_description: Apply an nvidia-mig-parted MIG layout with nvidia-mig-parted or nvidia-smi
version_added: 0.1.0
description:
  - Reads every GPU (MIG mode current and pending, GPU and compute instances, profiles), plans
    the steps to the selected layout and, unless in check mode, carries them out - refusing
    while a process uses a GPU that must change, stopping and restarting the active GPU client
    units around the change, resetting GPUs where allowed, else reporting that a reboot is required.
  - The logic lives in the role's module_utils (gpustack_mig_plan, gpustack_mig_apply), which
    gpustack-mig.service runs at boot with the same settings.
  - Never fails the task for a refused or impossible change; it returns C(state=failed) and a
    C(reason), which the role turns into a failure after publishing the fact.
options:
  config:
    description: Name of the selected layout (a key of mig-configs).
    type: str
    required: true
  config_file:
    description: The layout file on the host (what nvidia-mig-parted reads).
    type: path
    required: true
  layout:
    description: The selected layout's entries, already loaded (devices, device-filter, mig-enabled,
      mig-devices).
    type: list
    elements: dict
    required: true
  applier:
    description: auto (nvidia-mig-parted when installed), nvidia-mig-parted, or nvidia-smi.
    type: str
    choices: [auto, nvidia-mig-parted, nvidia-smi]
    default: auto
  reset:
    description: Reset a GPU to make a MIG mode change effective when nothing uses it.
    type: bool
    default: true
  clients:
    description: systemd units holding the GPUs; the active ones are stopped for a change and
      started again.
    type: list
    elements: str
    default: []
  state_file:
    description: Where the result is recorded (not in check mode).
    type: path
    default: /var/lib/gpustack/mig/state.json
author: gpustack
"""

EXAMPLES = r"""
- name: Apply the all-1g.10gb layout of a mig-parted configuration
  gpustack.gpustack.gpustack_mig:
    config: all-1g.10gb
    config_file: /etc/nvidia-mig-manager/config.yaml
    layout:
      - devices: all
        mig-enabled: true
        mig-devices: {1g.10gb: 7}
    clients: [nvidia-persistenced, nvidia-dcgm]
"""

RETURN = r"""
mig:
  description: The gpustack_mig document - config, applier, state, reason, changed,
    reboot_required, gpus, ... (docs/mig.md).
  returned: always
  type: dict
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_mig_apply import run


def main():
    module = AnsibleModule(
        argument_spec={
            "config": {"type": "str", "required": True},
            "config_file": {"type": "path", "required": True},
            "layout": {"type": "list", "elements": "dict", "required": True},
            "applier": {
                "type": "str",
                "choices": ["auto", "nvidia-mig-parted", "nvidia-smi"],
                "default": "auto",
            },
            "reset": {"type": "bool", "default": True},
            "clients": {"type": "list", "elements": "str", "default": []},
            "state_file": {"type": "path", "default": "/var/lib/gpustack/mig/state.json"},
        },
        supports_check_mode=True,
    )
    result = run(dict(module.params), check_mode=module.check_mode, source="ansible")
    module.exit_json(changed=result["changed"], mig=result)


if __name__ == "__main__":
    main()
