#!/usr/bin/python
# -*- coding: utf-8 -*-
"""What containerd has loaded against what its files say: the lost-restart check."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_containerd_loaded
short_description: Compare the runtime handlers containerd runs with those its files define
version_added: 0.1.0
description:
  - Asks the running containerd for the configuration its CRI plugin loaded, over its socket
    with the CRI API (C(RuntimeService/Status), verbose - what C(crictl info) prints; no crictl
    needed), and compares the runtime handlers there (name, runtime type, options such as
    BinaryName) with those of the effective configuration on disk (C(containerd config dump)).
  - Also reports gpustack's restart-pending marker, written before gpustack changes the files
    and removed after the restart, so a run killed in between is finished by the next one even
    where the CRI plugin cannot be asked.
  - The logic lives in plugins/module_utils/gpustack_containerd.py, which gpustack_host_probe
    (section loaded) and gpustack_apt_install (O(containerd_loaded) of a join) share. Read-only;
    supports check mode.
options:
  config: {type: path, default: /etc/containerd/config.toml, description: Main configuration.}
  socket: {type: path, default: /run/containerd/containerd.sock, description: containerd's socket.}
  marker: {type: path, default: "", description: gpustack's restart-pending marker.}
  name: {type: str, default: nvidia, description: The runtime handler gpustack adds.}
  binary:
    type: path
    default: ""
    description: The NVIDIA runtime binary; when given, also C(binary_exists) and the effective
      configuration C(dump) (rc, stdout, stderr) - the role's verify step in one round trip.
  test_container:
    type: dict
    default: {}
    description:
      - "image, snapshotter, ctr_args (list), container: start a container through the runtime
        handler as the running daemon loaded it for pods (its CRI runtime type and BinaryName;
        the configured I(binary) stands in only without a CRI plugin), with
        C(ctr --namespace gpustack run --rm) printing C(gpustack-runtime-ok); up to 3 tries
        2 s apart (ctr can lose a short-lived container's output on a loaded host). Not run when
        the binary is missing, when the running daemon lacks the handler, or without an image."
      - The caller leaves it empty in check mode (the module runs with check_mode false).
author: gpustack
"""

EXAMPLES = r"""
- name: Does the running containerd run the nvidia runtime its files define?
  gpustack.gpustack.gpustack_containerd_loaded:
    config: /etc/containerd/config.toml
    name: nvidia
    binary: /usr/bin/nvidia-container-runtime
  register: loaded

- name: Say what differs
  ansible.builtin.debug:
    msg: "{{ loaded.differences }}"
  when: loaded.differences | length > 0
"""

RETURN = r"""
loaded:
  description: available, error, runtimes {name {runtime_type, options}} as containerd runs them.
  type: dict
  returned: always
disk: {description: The runtimes the files define and any dump error., type: dict, returned: always}
differences: {description: One line per loaded/disk difference., type: list, returned: always}
restart_pending: {description: The marker exists., type: bool, returned: always}
restart_needed: {description: restart_pending or any difference., type: bool, returned: always}
binary_exists: {description: The binary exists., type: bool, returned: when binary is given}
dump:
  description: rc, stdout, stderr of C(containerd config dump).
  type: dict
  returned: when binary is given
run:
  description: "The test container: rc, stdout, stderr, cmd, attempts; or skipped: true."
  type: dict
  returned: when test_container is given
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_containerd import (
    LOADED_CHECK_OPTIONS,
    loaded_check,
)


def main():
    module = AnsibleModule(argument_spec=LOADED_CHECK_OPTIONS, supports_check_mode=True)
    module.exit_json(changed=False, **loaded_check(module, module.params))


if __name__ == "__main__":
    main()
