# -*- coding: utf-8 -*-
"""Pure helpers of the nvidia_container_toolkit role (no Ansible imports: unit-testable)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type


def madison_versions(text):
    """Versions from `apt-cache madison PKG` output ('pkg | version | source'), in its order
    (newest first, as apt lists them); [] when the lists offer none."""
    versions = []
    for line in (text or "").splitlines():
        parts = [p.strip() for p in line.split("|")]
        if len(parts) >= 3 and parts[1] and parts[1] not in versions:
            versions.append(parts[1])
    return versions


class FilterModule(object):
    def filters(self):
        return {"nvidia_container_toolkit_madison_versions": madison_versions}
