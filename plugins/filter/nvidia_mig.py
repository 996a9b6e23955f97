# -*- coding: utf-8 -*-
"""Controller-side checks of MIG layout files, with the same rules the host-side applier uses."""

from __future__ import absolute_import, division, print_function

import os
import sys

__metaclass__ = type

try:
    from ansible_collections.gpustack.gpustack.plugins.module_utils.gpustack_mig_plan import (
        LayoutError,
        parse_config,
    )
except ImportError:  # loaded as a file, outside Ansible's collection loader (unit tests)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../module_utils"))
    from gpustack_mig_plan import LayoutError, parse_config


def nvidia_mig_layout_problem(doc, name):
    """'' when `doc` is a valid nvidia-mig-parted layout file holding `name`, else why not."""
    try:
        configs = parse_config(doc)
    except LayoutError as exc:
        return str(exc)
    if name not in configs:
        return "it has no layout named %s (it has: %s)" % (name, ", ".join(sorted(configs)))
    return ""


class FilterModule(object):
    def filters(self):
        return {"nvidia_mig_layout_problem": nvidia_mig_layout_problem}
