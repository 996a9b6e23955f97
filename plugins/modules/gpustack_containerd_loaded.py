#!/usr/bin/python
# -*- coding: utf-8 -*-
"""What containerd has loaded against what its files say: the lost-restart check."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_containerd_loaded
short_description: Compare the runtime handlers containerd runs with those its files define
description:
  - Asks the running containerd for the configuration its CRI plugin loaded, over its socket
    with the CRI API (C(RuntimeService/Status), verbose - what C(crictl info) prints; no crictl
    needed), and compares the runtime handlers there (name, runtime type, options such as
    BinaryName) with those of the effective configuration on disk (C(containerd config dump)).
  - Also reports gpustack's restart-pending marker, written before gpustack changes the files
    and removed after the restart, so a run killed in between is finished by the next one even
    where the CRI plugin cannot be asked.
  - The logic lives in roles/gpu_preflight/module_utils/gpustack_containerd.py, which
    gpustack_host_probe shares (section loaded). Read-only; supports check mode.
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

import os
import time

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_containerd import (
    loaded_state,
)
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_host import (
    effective_dump,
)

OK = "gpustack-runtime-ok"


def test_container(module, params, state):
    """The verify container through the handler the running daemon loaded (skipped: see docs)."""
    spec = params["test_container"]
    loaded = state["loaded"]
    if not spec.get("image") or not state.get("binary_exists"):
        return {"skipped": True}
    if loaded.get("available") and params["name"] not in loaded.get("runtimes", {}):
        return {"skipped": True}
    handler = loaded.get("runtimes", {}).get(params["name"]) or {}
    options = handler.get("options") or {}
    ctr = module.get_bin_path("ctr")
    cmd = (
        [ctr or "ctr", "--namespace", "gpustack", "run", "--rm"]
        + ["--snapshotter", spec.get("snapshotter") or "overlayfs"]
        + ["--runtime", handler.get("runtime_type") or "io.containerd.runc.v2"]
        + ["--runc-binary", options.get("BinaryName") or params["binary"]]
        + list(spec.get("ctr_args") or [])
        + [spec["image"], spec.get("container") or "gpustack-verify", "/bin/sh", "-c", "echo " + OK]
    )
    if not ctr:
        return {"rc": 127, "stdout": "", "stderr": "ctr: not found in PATH", "cmd": cmd,
                "attempts": 0}  # fmt: skip
    for attempt in range(1, 4):
        rc, out, err = module.run_command(cmd)
        if OK in out or attempt == 3:
            return {"rc": rc, "stdout": out, "stderr": err, "cmd": cmd, "attempts": attempt}
        time.sleep(2)


def main():
    module = AnsibleModule(
        argument_spec=dict(
            config=dict(type="path", default="/etc/containerd/config.toml"),
            socket=dict(type="path", default="/run/containerd/containerd.sock"),
            marker=dict(type="path", default=""),
            name=dict(type="str", default="nvidia"),
            binary=dict(type="path", default=""),
            test_container=dict(type="dict", default={}),
        ),
        supports_check_mode=True,
    )
    params = module.params
    state = loaded_state(params["config"], params["socket"], params["marker"])
    if params["binary"]:
        rc, out, err = effective_dump(params["config"])  # loaded_state's (once per module run)
        state.update(
            binary_exists=os.path.exists(params["binary"]),
            dump={"rc": rc, "stdout": out, "stderr": err},
        )
    if params["test_container"]:
        state["run"] = test_container(module, params, state)
    module.exit_json(changed=False, **state)


if __name__ == "__main__":
    main()
