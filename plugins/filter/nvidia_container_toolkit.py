# -*- coding: utf-8 -*-
"""Filters of the nvidia_container_toolkit role: apt's offered versions, parsed by
gpustack/driver_version.py (filter plugins run on the controller, where gpustack is)."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import os
import sys

try:
    from gpustack.driver_version import madison_versions
except ImportError:  # the source checkout, run by an ansible-playbook without gpustack installed
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../.."))
    from gpustack.driver_version import madison_versions


class FilterModule(object):
    def filters(self):
        return {"nvidia_container_toolkit_madison_versions": madison_versions}
