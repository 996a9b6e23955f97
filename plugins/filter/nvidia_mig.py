# -*- coding: utf-8 -*-
"""Controller-side checks of MIG layout files, with the same rules the host-side applier uses."""

from __future__ import absolute_import, division, print_function

import os
import sys

__metaclass__ = type


def _mig_plan():
    """module_utils/gpustack_mig_plan, imported where the filter runs: Ansible imports every
    filter file of the collection in each worker process that resolves any gpustack filter, MIG
    or not, and this import was about 0.3 s of the controller's CPU per host and run there
    (docs/performance.md)."""
    try:
        from ansible_collections.gpustack.gpustack.plugins.module_utils import gpustack_mig_plan
    except ImportError:  # loaded as a file, outside Ansible's collection loader (unit tests)
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.join(here, "../module_utils"))
        import gpustack_mig_plan
    return gpustack_mig_plan


def nvidia_mig_layout_problem(doc, name):
    """'' when `doc` is a valid nvidia-mig-parted layout file holding `name`, else why not."""
    plan = _mig_plan()
    try:
        configs = plan.parse_config(doc)
    except plan.LayoutError as exc:
        return str(exc)
    if name not in configs:
        return "it has no layout named %s (it has: %s)" % (name, ", ".join(sorted(configs)))
    return ""


class FilterModule(object):
    def filters(self):
        return {"nvidia_mig_layout_problem": nvidia_mig_layout_problem}
