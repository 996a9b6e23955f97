# -*- coding: utf-8 -*-
"""Filters of the nvidia_container_toolkit role: apt's offered versions, parsed by the
collection's module_utils/gpustack_driver_version.py (filter plugins run on the controller)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import sys

try:
    from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_driver_version import (
        madison_versions,
    )
except ImportError:  # loaded as a file, outside Ansible's collection loader (unit tests)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../module_utils"))
    from gpustack_driver_version import madison_versions


class FilterModule(object):
    def filters(self):
        return {"nvidia_container_toolkit_madison_versions": madison_versions}
