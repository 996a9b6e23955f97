#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Install packages at exact versions with apt-get itself: one apt transaction, no python3-apt."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
module: gpustack_apt_install
short_description: Bring packages to exact versions in one apt-get transaction
description:
  - What C(ansible.builtin.apt) does with C(name=[pkg=version, ...]), C(state=present),
    C(allow_downgrade) and C(allow_change_held_packages) (and O(install_recommends)), with
    C(apt-get) alone. That module opens the whole package cache in Python (python3-apt) before
    the transaction to learn which packages need it, and runs C(apt-mark manual) after it; on a
    Debian host with the non-free sources that is about a second of the node's CPU per call.
  - Reads the installed versions with C(dpkg-query). Where every package is installed (at its
    version, where one is given) nothing runs and nothing changes. Else one
    C(apt-get install --allow-downgrades --allow-change-held-packages) (C(--no-install-recommends)
    unless O(install_recommends))
    of every C(name=version) and of the missing names without a version (apt-get marks named
    packages manually installed; an installed name without a version is left as it is), with dpkg's
    C(--force-confdef --force-confold), C(DEBIAN_FRONTEND=noninteractive) and apt's lock
    timeout, as the apt module runs it.
  - Where nothing needs the transaction but a package is marked automatically installed,
    C(apt-mark manual) for those (the apt module marks every named package manual).
  - Check mode runs C(apt-get --simulate) (no python3-apt needed) and returns its output in
    C(stdout), as the apt module does (C(gpustack plan) reads the C(Inst) lines).
  - "A failed transaction fails the module with apt-get's error, as the apt module words it
    (C('CMD' failed - STDERR), with a colon)."
options:
  packages:
    type: list
    elements: str
    required: true
    description: C(name=version) (that version exactly) or C(name) (any version, the candidate
      where missing).
  install_recommends:
    type: bool
    default: false
    description: Install the packages' recommends too (C(--no-install-recommends) without it).
  lock_timeout:
    type: int
    default: 300
    description: Seconds apt-get waits for dpkg's lock (C(DPkg::Lock::Timeout)).
  apt_options:
    type: list
    elements: str
    default: []
    description: Extra C(-o) options for apt-get (tests).
  pins:
    type: list
    elements: dict
    default: []
    description:
      - In check mode, the apt pin files (C(dest), C(content)) the run writes before its
        transaction. The simulation runs with C(/etc/apt/preferences.d) as the run will leave it
        (a temporary copy with these files in it, C(Dir::Etc::PreferencesParts)), so that a
        version change that the pin on disk still refuses simulates as it will install. Outside
        check mode the caller has written them; not used.
  preferences_dir:
    type: path
    default: /etc/apt/preferences.d
    description: apt's preferences directory (tests).
  extended_states:
    type: path
    default: /var/lib/apt/extended_states
    description: apt's record of automatically installed packages (tests).
author: gpustack
"""

RETURN = r"""
stdout: {description: apt-get's output (the simulation's in check mode)., type: str}
stderr: {description: apt-get's standard error., type: str}
cmd: {description: The apt-get command line (absent when none ran)., type: list}
needed:
  description: The packages that were not installed at their version before the call.
  type: list
manual: {description: Packages marked manually installed by apt-mark., type: list}
"""

import os
import shutil
import tempfile

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_host import (
    apt_option_args,
    packages,
    run,
)

ENV = dict(DEBIAN_FRONTEND="noninteractive", DEBIAN_PRIORITY="critical", LANG="C", LC_ALL="C",
           LC_MESSAGES="C", LC_CTYPE="C", LANGUAGE="C")  # fmt: skip
DPKG_OPTIONS = ["-o", "Dpkg::Options::=--force-confdef", "-o", "Dpkg::Options::=--force-confold"]


def split(spec):
    name, _, version = spec.partition("=")
    return name.strip(), version.strip() or None


def spec_text(name, version):
    return "%s=%s" % (name, version) if version else name


def auto_marked(names, path):
    """The names apt's extended_states marks Auto-Installed (any architecture)."""
    try:
        with open(path) as fh:
            text = fh.read()
    except (IOError, OSError):
        return []
    marked = set()
    for stanza in text.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line)
        if fields.get("Auto-Installed", "").strip() == "1":
            marked.add(fields.get("Package", "").strip())
    return [name for name in names if name in marked]


def preferences_as_written(directory, pins):
    """A temporary copy of apt's preferences directory with the pin files a run writes."""
    copy = tempfile.mkdtemp(prefix="gpustack-preferences-")
    names = os.listdir(directory) if os.path.isdir(directory) else []
    for name in names:
        if os.path.isfile(os.path.join(directory, name)):
            shutil.copy(os.path.join(directory, name), copy)
    for pin in pins:
        with open(os.path.join(copy, os.path.basename(pin["dest"])), "w") as fh:
            fh.write(pin.get("content") or "")
    return copy


def main():
    module = AnsibleModule(
        argument_spec=dict(
            packages=dict(type="list", elements="str", required=True),
            install_recommends=dict(type="bool", default=False),
            lock_timeout=dict(type="int", default=300),
            apt_options=dict(type="list", elements="str", default=[]),
            pins=dict(type="list", elements="dict", default=[]),
            preferences_dir=dict(type="path", default="/etc/apt/preferences.d"),
            extended_states=dict(type="path", default="/var/lib/apt/extended_states"),
        ),
        supports_check_mode=True,
    )
    env = dict(os.environ, **ENV)
    specs = [split(spec) for spec in module.params["packages"] if spec.strip()]
    names = [name for name, _ in specs]
    have = packages(names)  # installed (held or not); half-configured ones: apt-get finishes them
    needed = [
        spec_text(name, version)
        for name, version in specs
        if name not in have or (version and have[name] != version)
    ]
    if not needed:
        auto = auto_marked(names, module.params["extended_states"])
        if auto and not module.check_mode:
            rc, out, err = run(["apt-mark", "manual"] + auto, env=env)
            if rc != 0:
                module.fail_json(msg="apt-mark manual failed: %s" % err.strip(), rc=rc)
        module.exit_json(changed=False, stdout="", stderr="", needed=[], manual=auto)
    # every exact version (apt-get marks an installed one manual, and leaves it), and the names
    # without one that are missing (an installed one stays at its version, as with the apt
    # module's state=present)
    wanted = [spec_text(name, version) for name, version in specs if version or name not in have]
    preferences = None
    if module.check_mode and module.params["pins"]:
        preferences = preferences_as_written(
            module.params["preferences_dir"], module.params["pins"]
        )
    cmd = (
        ["apt-get", "-y"]
        + DPKG_OPTIONS
        + ["-o", "DPkg::Lock::Timeout=%d" % module.params["lock_timeout"]]
        + apt_option_args(module.params["apt_options"])
        + (["-o", "Dir::Etc::PreferencesParts=%s" % preferences] if preferences else [])
        + (["--simulate"] if module.check_mode else [])
        + ([] if module.params["install_recommends"] else ["--no-install-recommends"])
        + ["--allow-downgrades", "--allow-change-held-packages"]
        + ["install"]
        + wanted
    )
    try:
        rc, out, err = run(cmd, env=env)
    finally:
        if preferences:
            shutil.rmtree(preferences, ignore_errors=True)
    if rc != 0:
        module.fail_json(msg="'%s' failed: %s" % (" ".join(cmd), err), rc=rc, stdout=out,
                         stderr=err, cmd=cmd, needed=needed)  # fmt: skip
    module.exit_json(changed=True, stdout=out, stderr=err, cmd=cmd, needed=needed, manual=[])


if __name__ == "__main__":
    main()
