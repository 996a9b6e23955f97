"""Ansible Vault on a real lab node: `gpustack doctor` with an inventory whose SSH port and
mirror password are inline `!vault` values, and with the documented pattern (plain variables
`"{{ vault_ssh_port }}"` / `"{{ vault_mirror_password }}"`, the values in an encrypted
group_vars file). The node is reached only if ansible-playbook itself decrypted the port;
without the password, one Error line and nothing runs. The secret is searched for in
everything gpustack printed or wrote.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import lab_nodes, run_cli, runs_started

pytestmark = pytest.mark.lab

# GPUSTACK_VAULT_LAB: use (and keep) that lab, e.g. one already up
LAB = os.environ.get("GPUSTACK_VAULT_LAB") or (
    os.environ.get("GPUSTACK_TEST_LAB_PREFIX", "") + f"vlt{os.getpid()}"
)
VAULT_BIN = str(Path(sys.executable).parent / "ansible-vault")
PASSWORD = "lab-vault-pw-4b7d"
SECRET = "LabVaulted5ecret-e21c"


def _vault(args: list[str]) -> str:
    return subprocess.run([VAULT_BIN, *args], check=True, capture_output=True, text=True).stdout


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    work = tmp_path_factory.mktemp("vault")
    inventory = work / "lab.ini"
    with lab_nodes(LAB, 1, inventory, keep=bool(os.environ.get("GPUSTACK_VAULT_LAB"))):
        (work / "pw").write_text(PASSWORD + "\n")
        hostvars = json.loads(subprocess.run(
            [str(Path(sys.executable).parent / "ansible-inventory"), "-i", str(inventory),
             "--list"], check=True, capture_output=True, text=True).stdout)["_meta"]["hostvars"]  # fmt: skip
        (host,) = hostvars
        variables = dict(hostvars[host])
        port = int(variables.pop("ansible_port"))
        variables.update(nvidia_driver_mirror_username="robot",
                         nvidia_driver_mirror_url="https://mirror.example/cuda/repos")  # fmt: skip
        # 1. inline !vault values in a YAML inventory
        lines = [f"          {k}: {json.dumps(v)}" for k, v in variables.items()]
        for name, value in (("ansible_port", str(port)), ("nvidia_driver_mirror_password", SECRET)):
            encrypted = _vault(["encrypt_string", "--vault-password-file", str(work / "pw"), value,
                                "--name", name])  # fmt: skip
            lines += ["          " + line for line in encrypted.strip().splitlines()]
        (work / "inline.yml").write_text(
            f"all:\n  children:\n    gpu_nodes:\n      hosts:\n        {host}:\n"
            + "\n".join(lines) + "\n"
        )  # fmt: skip
        # 2. the {{ vault_... }} pattern: port and password in an encrypted group_vars file
        pattern = work / "pattern"
        (pattern / "group_vars/all").mkdir(parents=True)
        (pattern / "hosts.ini").write_text(
            inventory.read_text().replace(f" ansible_port={port}", "")
        )
        (pattern / "group_vars/all/vars.yml").write_text(
            'ansible_port: "{{ vault_ssh_port }}"\n'
            "nvidia_driver_mirror_username: robot\n"
            'nvidia_driver_mirror_password: "{{ vault_mirror_password }}"\n'
            "nvidia_driver_mirror_url: https://mirror.example/cuda/repos\n"
        )
        secret_vars = pattern / "group_vars/all/vault.yml"
        secret_vars.write_text(f"vault_ssh_port: {port}\nvault_mirror_password: {SECRET}\n")
        _vault(["encrypt", "--vault-password-file", str(work / "pw"), str(secret_vars)])
        yield work, host


def _written(state: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in state.rglob("*") if p.is_file())


def _doctor_reads_the_node(proc, report: Path, host: str) -> None:
    assert proc.returncode == 0, proc.stdout + proc.stderr
    node = json.loads(report.read_text())["hosts"][host]
    assert node["status"] == "ok" and node["facts"], node  # facts read from the node over SSH


@pytest.mark.parametrize(
    ("inventory", "how"),
    [("inline.yml", "option"), ("pattern/hosts.ini", "environment")],
    ids=["inline-vault-password-file", "pattern-ANSIBLE_VAULT_PASSWORD_FILE"],
)
def test_doctor_with_vaulted_inventory(lab, state_dir, tmp_path, inventory, how):
    work, host = lab
    report = tmp_path / "report.json"
    option = ["--vault-password-file", str(work / "pw")] if how == "option" else []
    env = {"ANSIBLE_VAULT_PASSWORD_FILE": str(work / "pw")} if how == "environment" else {}
    proc = run_cli("doctor", str(work / inventory), *option, "--report", str(report), "-vv",
                   env=env)  # fmt: skip
    _doctor_reads_the_node(proc, report, host)
    everything = proc.stdout + proc.stderr + report.read_text() + _written(state_dir)
    assert SECRET not in everything and PASSWORD not in everything


@pytest.mark.parametrize(
    "inventory", ["inline.yml", "pattern/hosts.ini"], ids=["inline", "pattern"]
)
def test_without_the_password(lab, state_dir, inventory):
    work, _ = lab
    proc = run_cli("doctor", str(work / inventory))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and "no vault password was given" in lines[0], proc.stderr
    assert lines[1].startswith("Hint: ") and "--vault-password-file" in lines[1]
    assert runs_started(state_dir) == []
