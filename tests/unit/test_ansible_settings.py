"""One set of Ansible settings for every runner of the roles (gpustack/ansible/settings.py): the
CLI's environment, the checkout's ansible.cfg, the ansible.cfg of docs/collection.md, the
execution environment and molecule carry the same values, and ansible-core reads each of them
(a misspelt key or section would be ignored without a word)."""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import yaml

from gpustack.ansible import settings
from gpustack.ansible.runner import RunSpec, ansible_playbook
from tests.conftest import ROOT

BIN = Path(sys.executable).parent
EVERY = (*settings.SETTINGS, *settings.CFG_ONLY)


def _cfg(text: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(text)
    return parser


def _same(value, expected: str) -> bool:
    return str(value).lower() == expected.lower()


def test_the_cli_passes_them_to_ansible_playbook(tmp_path):
    env = RunSpec(playbook=tmp_path / "p.yml", inventory=tmp_path / "i", target_group="all",
                  hosts=["a"]).envvars()  # fmt: skip
    for setting in settings.SETTINGS:
        assert env[setting.env] == setting.value


def test_the_cli_runs_ansible_cores_own_ansible_playbook():
    path = Path(ansible_playbook())
    assert path == BIN / "ansible-playbook"
    assert "ansible.cli.playbook" in path.read_text()  # the console script ansible-core installs


def test_the_checkout_and_the_collection_docs_carry_the_same_ansible_cfg():
    docs = (ROOT / "docs/collection.md").read_text()
    blocks = re.findall(r"```ini\n(.*?)```", docs, re.DOTALL)
    assert blocks, "docs/collection.md shows no ansible.cfg"
    for cfg in (_cfg(blocks[0]), _cfg((ROOT / "ansible.cfg").read_text())):
        for s in EVERY:
            assert cfg.get(s.section, s.key) == s.value, (s.section, s.key)
    assert _cfg(blocks[0]) == _cfg(settings.ansible_cfg())


def test_molecule_scenarios_carry_them():
    scenarios = sorted((ROOT / "molecule").glob("*/molecule.yml"))
    assert len(scenarios) >= 3
    for path in scenarios:
        options = yaml.safe_load(path.read_text())["provisioner"]["config_options"]
        for s in EVERY:
            assert _same(options[s.section][s.key], s.value), (path, s.key)


def test_the_execution_environment_image_carries_them():
    ee = yaml.safe_load((ROOT / "execution-environment.yml").read_text())
    env = {}
    for step in ee["additional_build_steps"]["append_final"]:
        if step.startswith("ENV "):
            name, _, value = step[4:].partition("=")
            env[name] = shlex.split(value)[0]
    assert env == {s.env: s.value for s in EVERY}


def _changed(environ: dict) -> tuple[dict, dict]:
    """ansible-config's view: (core settings, ssh connection options) not at their defaults."""
    proc = subprocess.run([str(BIN / "ansible-config"), "dump", "--only-changed", "-t", "all",
                           "--format", "json"], capture_output=True, text=True, timeout=300,
                          env=environ, cwd="/")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    core, ssh = {}, {}
    for entry in json.loads(proc.stdout):
        if "name" in entry:
            core[entry["name"]] = entry["value"]
        for plugin in entry.get("CONNECTION_PLUGINS", []):
            for option in plugin.get("ssh", []):
                ssh[option["name"]] = option["value"]
    return core, ssh


CORE = {"gathering": "DEFAULT_GATHERING", "interpreter_python": "INTERPRETER_PYTHON",
        "deprecation_warnings": "DEPRECATION_WARNINGS", "timeout": "DEFAULT_TIMEOUT",
        "forks": "DEFAULT_FORKS"}  # fmt: skip


def _assert_read(core: dict, ssh: dict, expected) -> None:
    for s in expected:
        seen = ssh.get(s.key) if s.section == "ssh_connection" else core.get(CORE[s.key])
        assert seen is not None and _same(seen, s.value), (s.key, seen)


def test_ansible_core_reads_every_one_from_the_cfg_and_from_the_environment(tmp_path):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_")}
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text(settings.ansible_cfg())
    _assert_read(*_changed({**clean, "ANSIBLE_CONFIG": str(cfg)}), EVERY)
    empty = tmp_path / "empty.cfg"
    empty.write_text("")
    environ = {**clean, "ANSIBLE_CONFIG": str(empty), **settings.environment()}
    _assert_read(*_changed(environ), settings.SETTINGS)
