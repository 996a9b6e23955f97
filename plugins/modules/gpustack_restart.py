#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Restart a service, wait until it answers, then clear gpustack's markers: one module call."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_restart
short_description: Restart a systemd service, wait until it answers, clear gpustack's markers
version_added: 0.1.0
description:
  - C(systemctl restart NAME) when C(restart) is true (after C(systemctl reset-failed NAME) when
    C(reset_failed) is true, as Docker's unit allows 3 starts a minute); then runs C(wait) until
    it succeeds, once a second, for at most C(timeout) seconds; then removes the C(remove) paths
    (container_runtime's restart-pending marker, as the service now runs the files).
  - Fails, naming systemctl's or the command's last error, when the restart fails or the service
    does not answer in time; nothing is removed then.
  - Check mode does nothing and reports a restart, or a marker to remove, as a change.
options:
  name: {type: str, required: true, description: The systemd unit (without .service).}
  restart: {type: bool, default: true, description: Restart it; false only waits and clears.}
  reset_failed: {type: bool, default: false, description: Reset the unit's start limit first.}
  wait: {type: list, elements: str, default: [], description: "argv that must exit 0 (or none)."}
  timeout: {type: int, default: 30, description: Seconds to wait for it.}
  remove: {type: list, elements: path, default: [], description: Paths removed once it answers.}
author: gpustack
"""

EXAMPLES = r"""
- name: Restart containerd, wait until it answers, clear the restart-pending marker
  gpustack.gpustack.gpustack_restart:
    name: containerd
    wait: [ctr, version]
    timeout: 30
    remove: [/var/lib/gpustack/containerd.restart-pending]

- name: Restart Docker (its unit allows 3 starts a minute)
  gpustack.gpustack.gpustack_restart:
    name: docker
    reset_failed: true
    wait: [docker, info]
"""

RETURN = r"""
name:
  description: The unit.
  returned: always
  type: str
restarted:
  description: Whether it was restarted.
  returned: success, not in check mode
  type: bool
would_restart:
  description: Whether it would be restarted.
  returned: check mode
  type: bool
removed:
  description: The marker paths removed (that would be removed, in check mode).
  returned: always
  type: list
  elements: str
waited_s:
  description: Seconds until C(wait) succeeded; null without C(wait).
  returned: success, not in check mode
  type: float
"""

import os
import time

from ansible.module_utils.basic import AnsibleModule


def _last_line(text):
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def main():
    module = AnsibleModule(
        argument_spec=dict(
            name=dict(type="str", required=True),
            restart=dict(type="bool", default=True),
            reset_failed=dict(type="bool", default=False),
            wait=dict(type="list", elements="str", default=[]),
            timeout=dict(type="int", default=30),
            remove=dict(type="list", elements="path", default=[]),
        ),
        supports_check_mode=True,
    )
    params = module.params
    name = params["name"]
    present = [path for path in params["remove"] if os.path.lexists(path)]
    if module.check_mode:
        module.exit_json(changed=params["restart"] or bool(present), name=name,
                         would_restart=params["restart"], removed=present)  # fmt: skip
    if params["restart"] and not module.get_bin_path("systemctl"):
        # run_command would fail with "Error executing command." (a host whose init is not
        # systemd, as the H100 VMs of docs/gpu-hosts.md)
        module.fail_json(msg="cannot restart %s: systemctl is not installed (the host does not run "
                             "systemd)" % name)  # fmt: skip
    if params["restart"]:
        if params["reset_failed"]:
            module.run_command(["systemctl", "reset-failed", name + ".service"])
        rc, out, err = module.run_command(["systemctl", "restart", name + ".service"])
        if rc != 0:
            msg = "systemctl restart %s failed: %s" % (name, _last_line(err or out))
            module.fail_json(msg=msg, rc=rc, stderr=err)
    started, waited = time.monotonic(), None
    if params["wait"]:
        while True:
            rc, out, err = module.run_command(params["wait"])
            if rc == 0:
                waited = round(time.monotonic() - started, 1)
                break
            if time.monotonic() - started >= params["timeout"]:
                module.fail_json(
                    msg="%s did not answer `%s` within %d s: %s"
                    % (name, " ".join(params["wait"]), params["timeout"], _last_line(err or out)),
                    rc=rc, stderr=err,
                )  # fmt: skip
            time.sleep(1)
    for path in present:
        os.unlink(path)
    module.exit_json(
        changed=params["restart"] or bool(present),
        name=name,
        restarted=params["restart"],
        removed=present,
        waited_s=waited,
    )


if __name__ == "__main__":
    main()
