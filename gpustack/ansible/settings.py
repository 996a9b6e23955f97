"""The Ansible settings every run of gpustack's roles should have, wherever it runs.

Stock ansible-core settings only. The CLI passes them to ansible-playbook as environment
variables (runner.py); the same values are in the checkout's ansible.cfg, the ansible.cfg that
docs/collection.md gives collection users, the execution environment's image (environment
variables, execution-environment.yml) and molecule's config_options (molecule/*/molecule.yml).
tests/unit/test_ansible_settings.py holds all of them to this table.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Setting:
    section: str  # ansible.cfg section
    key: str  # ansible.cfg key
    env: str  # environment variable (ansible-core's name for the same setting)
    value: str
    why: str


SETTINGS = (
    Setting("ssh_connection", "pipelining", "ANSIBLE_PIPELINING", "True",
            "one SSH round trip per module call, no temporary files on the host"),
    Setting("ssh_connection", "ssh_args", "ANSIBLE_SSH_ARGS",
            "-C -o ControlMaster=auto -o ControlPersist=120s",
            "one SSH connection per host, kept between tasks and between runs"),
    Setting("defaults", "gathering", "ANSIBLE_GATHERING", "explicit",
            "the playbooks gather nothing; gpu_preflight reads what the roles need"),
    Setting("defaults", "interpreter_python", "ANSIBLE_PYTHON_INTERPRETER", "auto_silent",
            "the host's Python found without a warning per host"),
    Setting("defaults", "deprecation_warnings", "ANSIBLE_DEPRECATION_WARNINGS", "False",
            "no warnings about ansible-core's own deprecations in every run"),
    Setting("defaults", "timeout", "ANSIBLE_TIMEOUT", "20",
            "an unreachable host is reported after 20 s, not 10 s on a busy controller"),
)  # fmt: skip

# ansible.cfg only: the CLI passes forks per run (`-f`, else one per target host, 5 to 50),
# which on N hosts starts as many workers as forks=50 does (ansible-playbook starts at most one
# per host of the batch).
CFG_ONLY = (
    Setting("defaults", "forks", "ANSIBLE_FORKS", "50",
            "every host of a batch at once, up to 50"),
)  # fmt: skip


def environment() -> dict[str, str]:
    """SETTINGS as environment variables (the CLI's runs, the execution environment)."""
    return {s.env: s.value for s in SETTINGS}


def ansible_cfg() -> str:
    """SETTINGS and CFG_ONLY as an ansible.cfg (what docs/collection.md shows)."""
    sections: dict[str, list[str]] = {}
    for s in (*SETTINGS, *CFG_ONLY):
        sections.setdefault(s.section, []).append(f"# {s.why}\n{s.key} = {s.value}")
    order = ("defaults", "ssh_connection")
    return "\n\n".join(f"[{name}]\n" + "\n".join(sections[name]) for name in order) + "\n"
