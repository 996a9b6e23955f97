# -*- coding: utf-8 -*-
"""k3s and RKE2: which containerd template k3s reads, whose it is, and what gpustack refuses.
Shared by the container_runtime filters (controller) and the host probe (doctor). Standard
library only."""

from __future__ import absolute_import, division, print_function

__metaclass__ = type

import re

# k3s and RKE2 (docs/runtime.md, "k3s and RKE2"). They generate containerd's config.toml at
# every start from a Go template: their own ("base"), or the user's config-v3.toml.tmpl or
# config.toml.tmpl, which may include the base with {{ template "base" . }}. The base declares
# every runtime k3s finds (nvidia, nvidia-experimental, nvidia-cdi: nvidia-container-runtime[...]
# looked up on PATH with /usr/local/nvidia/toolkit in front; k3s-io/k3s
# pkg/agent/containerd/runtimes.go and config_linux.go@469d009) and, with default-runtime,
# default_runtime_name (pkg/agent/templates/templates.go@469d009). So gpustack writes no template:
# the toolkit puts the runtime where k3s finds it, a config.yaml.d drop-in sets default-runtime
# when asked to, and k3s restarts. A template that includes the base and declares the runtime
# again makes containerd refuse the generated file (a table defined twice: containerd 1.6.20,
# 1.7.24 and 2.1.9 all refuse it; tests/fixtures/k3s).
# The templates k3s and RKE2 read. Since k3s-io/k3s bc4597239 (2025-01, the releases with
# containerd 2) k3s takes the first that exists, with the base of its generation: version 3 for
# config-v3.toml.tmpl (and without a template), version 2 for config.toml.tmpl
# (pkg/agent/containerd/config.go@469d009, templateGenerations). Earlier k3s read
# config.toml.tmpl only. k3s does not look at containerd's version.
TEMPLATES = ("config-v3.toml.tmpl", "config.toml.tmpl")
K3S_BASE = re.compile(r"\{\{-?\s*template\s+\"base\"\s+\.\s*-?\}\}")
# The template gpustack wrote before 2026-11-26: the base, "# Ansible managed", the runtime.
K3S_LEGACY_MARK = "# Ansible managed"


def _k3s_declares(text, name):
    """Whether a template's text declares the runtime `name` as a table (any quoting)."""
    quoted = r"[\"']?%s[\"']?" % re.escape(name)
    header = r"^\s*\[\s*plugins\s*\.[^\]\n]*\.\s*runtimes\s*\.\s*%s\s*\]" % quoted
    return re.search(header, text or "", re.M) is not None


def _k3s_legacy(text, name):
    """Whether a template is the one gpustack wrote before 2026-11-26."""
    lines = (text or "").strip().splitlines()
    first = lines[0].strip() if lines else ""
    return bool(K3S_BASE.fullmatch(first)) and K3S_LEGACY_MARK in text and _k3s_declares(text, name)


K3S_REFUSALS = {
    "twice": (
        "it includes k3s's base template and declares the {name} runtime too; the base declares "
        "that runtime itself once nvidia-container-runtime is on PATH, and containerd refuses a "
        "configuration with the table twice, so k3s's next start would fail",
        "remove the {name} runtime's tables from the template (k3s adds them), then run again",
    ),
    "missing": (
        "it replaces k3s's base template and does not declare the {name} runtime, so the runtimes "
        "k3s finds never reach containerd",
        'start the template with {{{{ template "base" . }}}}, or declare the runtime in it',
    ),
    "default": (
        "it replaces k3s's base template, where k3s's default-runtime setting takes effect",
        'set default_runtime_name = "{name}" in the template and container_runtime_nvidia_default '
        "to false, or include the base",
    ),
}


def k3s_templates(files, name, want_default=False, config_version=2):
    """Which containerd template k3s reads, whose it is, and what gpustack must refuse.

    files: {file name: text, or None when missing} for TEMPLATES (config-v3.toml.tmpl and
    config.toml.tmpl, in the containerd directory of k3s or RKE2).
    config_version: the version of the config.toml k3s generated at its last start (2 when there
    is none). A k3s that generated version 3 is a recent one: it reads config-v3.toml.tmpl when
    it exists, else config.toml.tmpl. Version 2 comes from an older k3s (config.toml.tmpl only)
    or from a recent one that found config.toml.tmpl alone then; a config-v3.toml.tmpl there now
    is what a recent k3s reads at the restart gpustack causes, so both are judged and either
    refuses (the hint says an older k3s ignores the v3 one). Returns {"legacy": [keys of
    templates gpustack wrote earlier: removed], "active": key or "", "extends_base",
    "declares", "error" and "hint" ("" when nothing is refused)}. gpustack's own old templates
    never count as active: they go, and k3s's base takes their place.
    """
    legacy = [key for key in TEMPLATES if _k3s_legacy(files.get(key), name)]
    present = [key for key in TEMPLATES if files.get(key) is not None]
    user = dict((key, files[key]) for key in present if key not in legacy)
    recent = int(config_version or 2) >= 3
    read = [key for key in TEMPLATES if key in user]
    if recent:
        read = read[:1]  # the first that exists
    result = {"legacy": legacy, "active": read[0] if read else "", "extends_base": True}
    result.update(declares=False, error="", hint="")
    for key in read:
        judged = _k3s_judge(user[key], name, want_default)
        if key == read[0]:
            result.update(extends_base=judged[0], declares=judged[1])
        if judged[2]:
            error, hint = K3S_REFUSALS[judged[2]]
            if key == TEMPLATES[0] and not recent:
                hint += (" (k3s releases since 2025-01 read %s before %s; an older k3s ignores "
                         "it: then remove it instead)" % TEMPLATES)  # fmt: skip
            result.update(active=key, extends_base=judged[0], declares=judged[1])
            result.update(error=error.format(name=name), hint=hint.format(name=name))
            break
    return result


def _k3s_judge(text, name, want_default):
    """(extends the base, declares the runtime, refusal key or "") of one template."""
    extends = K3S_BASE.search(text) is not None
    declares = _k3s_declares(text, name)
    refusal = ""
    if extends and declares:
        refusal = "twice"
    elif not extends and not declares:
        refusal = "missing"
    elif not extends and str(want_default).lower() in ("1", "true", "yes"):
        refusal = "default"
    return extends, declares, refusal
