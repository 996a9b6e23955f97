"""Inputs read as ansible-playbook reads them, with Ansible's own code: `-e` (parse_kv, YAML/JSON,
@FILE), `--limit @FILE`, `-h`, role variables through ArgumentSpecValidator with "did you mean",
Ansible's booleans, and Vault (inline `!vault` values, encrypted files, the `{{ vault_... }}`
pattern, password files, ANSIBLE_VAULT_PASSWORD_FILE).

The vault tests run the real `gpustack` against a host at 127.0.0.1 port 9, where nothing
listens, with the port itself vaulted: "port 9" in the unreachable message proves that the
playbook run (not only gpustack's checks) decrypted it. Nothing is contacted otherwise.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpustack.ansible.extravars import for_playbook, parse_extra_vars
from gpustack.ansible.input_specs import check_inputs, is_true
from gpustack.ansible.inventory import load_inventory
from gpustack.errors import BadInput
from tests.conftest import ROOT, run_cli, runs_started

VAULT_BIN = str(Path(sys.executable).parent / "ansible-vault")
PASSWORD = "unit-vault-pw-7c1e"
SECRET = "Vaulted5ecret-9f2a"  # a mirror password that lives only in vault


# -e ------------------------------------------------------------------------------------------


def test_key_value_items_are_split_as_ansible_playbook_splits_them():
    assert parse_extra_vars(["a=1 b=2"]) == {"a": "1", "b": "2"}
    assert parse_extra_vars(["a='x y' b=\"z=1\""]) == {"a": "x y", "b": "z=1"}
    assert parse_extra_vars(['{"n": 1, "l": [true]}']) == {"n": 1, "l": [True]}
    assert parse_extra_vars(["{n: 2}", "n=3"]) == {"n": "3"}  # later items win


def test_words_ansible_playbook_would_drop_are_refused():
    with pytest.raises(BadInput, match="'reboot' is not KEY=VALUE"):
        parse_extra_vars(["nvidia_driver_branch=580 reboot"])
    with pytest.raises(BadInput, match="looks like a file name"):
        parse_extra_vars(["./vars.yml"])


def test_files_reach_the_playbook_as_files_in_order(tmp_path):
    first, second = tmp_path / "one.yml", tmp_path / "two.yml"
    first.write_text("a: from-one\nb: from-one\nc: from-one\n")
    second.write_text("b: from-two\n")
    variables = parse_extra_vars([f"@{first}", "c=inline", f"@{second}"])
    assert variables == {"a": "from-one", "b": "from-two", "c": "inline"}
    values, files = for_playbook({**variables, "gpustack_target": "gpu_nodes"})
    assert files == [str(first), str(second)]
    # a and b come from the files (their last definer); c was given inline after the file
    assert values == {"c": "inline", "gpustack_target": "gpu_nodes"}
    # a value gpustack sets over a file's wins as a value
    values, _ = for_playbook({**variables, "a": "set-by-gpustack"})
    assert values["a"] == "set-by-gpustack"


# --limit @FILE and -h ------------------------------------------------------------------------


def test_limit_from_a_retry_file(tmp_path):
    inventory = tmp_path / "inv.ini"
    inventory.write_text("[gpu_nodes]\nn1\nn2\nn3\n")
    retry = tmp_path / "site.retry"
    retry.write_text("n3\nn1\n")
    assert load_inventory(inventory, f"@{retry}").hosts == ["n1", "n3"]
    assert load_inventory(inventory, f"@{retry},n2").hosts == ["n1", "n2", "n3"]


def test_dash_h_is_help():
    proc = run_cli("install", "-h")
    assert proc.returncode == 0, proc.stderr
    assert "Usage:" in proc.stdout and "--vault-password-file" in proc.stdout
    assert "--ask-vault-pass" in proc.stdout and "-h, --help" in proc.stdout


# role variables, booleans --------------------------------------------------------------------


def test_role_inputs_use_ansibles_validator_and_booleans():
    # Ansible's conversions: a comma-separated list, key=value dict, y/t booleans
    check_inputs({"nvidia_driver_packages": "a,b", "container_runtime_nvidia_runtime_extra":
                  "k=v", "nvidia_driver_blacklist_nouveau": "y", "gpustack_require_gpu": "t"})  # fmt: skip
    assert is_true("y") and is_true("on") and is_true("T") and not is_true("off")
    with pytest.raises(BadInput) as err:
        check_inputs({"nvidia_driver_persistenced": "maybe"})
    assert "is not a valid boolean" in err.value.message
    assert "yes" in err.value.hint and "off" in err.value.hint


def test_unknown_role_variables_get_did_you_mean():
    with pytest.raises(BadInput) as err:
        check_inputs({"nvidia_driver_rebot": "if_needed"})
    assert "no role takes this variable" in err.value.message
    assert err.value.hint == "did you mean nvidia_driver_reboot?"
    with pytest.raises(BadInput, match="nvidia_driver_ubuntu_branch"):  # a DeepOps name
        check_inputs({"nvidia_driver_ubuntu_branch": "535"})
    check_inputs({"my_own_variable": "x", "ansible_user": "root"})  # not a role's: left alone


def test_connection_plugins_by_name_fqcn_and_alias():
    from ansible.plugins.loader import connection_loader

    from gpustack.ansible.input_specs import check_connection

    names = ["ssh", "local", "ansible.builtin.ssh", "ansible.builtin.local"]
    # paramiko (an alias of ansible.builtin.paramiko_ssh) is in ansible-core up to 2.20 only
    if connection_loader.find_plugin("ansible.builtin.paramiko_ssh"):
        names.append("paramiko")
    for name in names:
        check_connection("n1", name)
    for name, message in (("winrm", "Windows hosts or network devices"),
                          ("ansible.windows.psrp", "Windows hosts or network devices"),
                          ("teleport", "no such connection plugin")):  # fmt: skip
        with pytest.raises(BadInput, match=message):
            check_connection("n1", name)


# vault -----------------------------------------------------------------------------------------


def _encrypt_string(folder: Path, value: str, name: str) -> str:
    proc = subprocess.run(
        [VAULT_BIN, "encrypt_string", "--vault-password-file", str(folder / "pw"), value,
         "--name", name],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    return proc.stdout.strip()


def _indent(text: str, spaces: int) -> str:
    return "\n".join(" " * spaces + line for line in text.splitlines())


@pytest.fixture(scope="module")
def vaulted(tmp_path_factory) -> Path:
    """Inventories and vars files whose SSH port (9) and mirror password only vault holds."""
    folder = tmp_path_factory.mktemp("vault")
    (folder / "pw").write_text(PASSWORD + "\n")
    # 1. inline !vault values in a YAML inventory
    port = _encrypt_string(folder, "9", "ansible_port")
    password = _encrypt_string(folder, SECRET, "nvidia_driver_mirror_password")
    (folder / "inline.yml").write_text(
        "all:\n  children:\n    gpu_nodes:\n      hosts:\n        n1:\n"
        "          ansible_host: 127.0.0.1\n"
        "          nvidia_driver_mirror_username: robot\n"
        "          nvidia_driver_mirror_url: https://mirror.example/cuda/repos\n"
        f"{_indent(port, 10)}\n{_indent(password, 10)}\n"
    )
    # 2. the documented pattern: plain vars referring to vault_* in an encrypted file
    pattern = folder / "pattern"
    (pattern / "group_vars/all").mkdir(parents=True)
    (pattern / "hosts.ini").write_text("[gpu_nodes]\nn1 ansible_host=127.0.0.1\n")
    (pattern / "group_vars/all/vars.yml").write_text(
        'ansible_port: "{{ vault_ssh_port }}"\n'
        "nvidia_driver_mirror_username: robot\n"
        'nvidia_driver_mirror_password: "{{ vault_mirror_password }}"\n'
        "nvidia_driver_mirror_url: https://mirror.example/cuda/repos\n"
    )
    secret_vars = pattern / "group_vars/all/vault.yml"
    secret_vars.write_text(f"vault_ssh_port: 9\nvault_mirror_password: {SECRET}\n")
    subprocess.run([VAULT_BIN, "encrypt", "--vault-password-file", str(folder / "pw"),
                    str(secret_vars)], check=True, capture_output=True)  # fmt: skip
    # 3. an encrypted -e file that moves the host to port 9 (the inventory says 10)
    (folder / "port10.ini").write_text("[gpu_nodes]\nn1 ansible_host=127.0.0.1 ansible_port=10\n")
    extra = folder / "extra.yml"
    extra.write_text(f"ansible_port: 9\nnvidia_driver_mirror_password: {SECRET}\n"
                     "nvidia_driver_mirror_username: robot\n"
                     "nvidia_driver_mirror_url: https://mirror.example/cuda/repos\n")  # fmt: skip
    subprocess.run([VAULT_BIN, "encrypt", "--vault-password-file", str(folder / "pw"),
                    str(extra)], check=True, capture_output=True)  # fmt: skip
    return folder


def _everything_written(state_dir: Path, *texts: str) -> str:
    found = list(texts)
    for path in state_dir.rglob("*"):
        if path.is_file():
            found.append(path.read_text(errors="replace"))
    return "\n".join(found)


def _command(state_dir: Path) -> dict:
    (command,) = list(state_dir.glob("runs/*/artifacts/*/command"))
    return json.loads(command.read_text())


def _assert_ran_on_port_9(proc, report: Path) -> None:
    assert proc.returncode == 4, proc.stdout + proc.stderr  # unreachable: the run happened
    host = json.loads(report.read_text())["hosts"]["n1"]
    assert "port 9" in host["unreachable_message"], host


@pytest.mark.parametrize(
    "inventory", ["inline.yml", "pattern/hosts.ini"], ids=["inline", "pattern"]
)
def test_vaulted_inventory_with_a_password_file(vaulted, state_dir, tmp_path, inventory):
    report = tmp_path / "report.json"
    # a relative password file: the playbook runs elsewhere and gets an absolute path
    password_file = os.path.relpath(vaulted / "pw", ROOT)
    proc = run_cli("doctor", str(vaulted / inventory), "--vault-password-file", password_file,
                   "--report", str(report), "-v")  # fmt: skip
    _assert_ran_on_port_9(proc, report)
    assert _command(state_dir)["command"][1:3] == ["--vault-password-file", str(vaulted / "pw")]
    everything = _everything_written(state_dir, proc.stdout, proc.stderr, report.read_text())
    assert SECRET not in everything and PASSWORD not in everything


def test_vaulted_inventory_with_ansible_vault_password_file(vaulted, state_dir, tmp_path):
    report = tmp_path / "report.json"
    proc = run_cli("doctor", str(vaulted / "pattern/hosts.ini"), "--report", str(report),
                   env={"ANSIBLE_VAULT_PASSWORD_FILE": os.path.relpath(vaulted / "pw", ROOT)})  # fmt: skip
    _assert_ran_on_port_9(proc, report)
    assert _command(state_dir)["env"]["ANSIBLE_VAULT_PASSWORD_FILE"] == str(vaulted / "pw")


def test_an_encrypted_extra_vars_file_is_read_by_the_playbook_itself(vaulted, state_dir, tmp_path):
    report = tmp_path / "report.json"
    proc = run_cli("doctor", str(vaulted / "port10.ini"), "-e", f"@{vaulted / 'extra.yml'}",
                   "--vault-id", f"default@{vaulted / 'pw'}", "--report", str(report))  # fmt: skip
    _assert_ran_on_port_9(proc, report)
    command = _command(state_dir)["command"]
    assert f"@{vaulted / 'extra.yml'}" in command and "--vault-id" in command
    (extravars,) = list(state_dir.glob("runs/*/env/extravars"))
    assert "ansible_port" not in extravars.read_text()  # not copied: the file is passed
    everything = _everything_written(state_dir, proc.stdout, proc.stderr, report.read_text())
    assert SECRET not in everything


@pytest.mark.parametrize(
    "inventory", ["inline.yml", "pattern/hosts.ini"], ids=["inline", "pattern"]
)
def test_without_the_password_one_error_line(vaulted, state_dir, inventory):
    proc = run_cli("install", str(vaulted / inventory))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and lines[0].startswith("Error: ") and lines[1].startswith("Hint: ")
    assert "no vault password was given" in lines[0] and "--vault-password-file" in lines[1]
    assert runs_started(state_dir) == []


def test_a_vaulted_value_in_an_error_is_masked(vaulted, state_dir, tmp_path):
    """A choice refused after rendering `{{ vault_reboot }}`: the Error line names the variable
    and masks the value that came out of vault."""
    (tmp_path / "group_vars/all").mkdir(parents=True)
    (tmp_path / "hosts.ini").write_text("[gpu_nodes]\nn1 ansible_host=127.0.0.1 ansible_port=9\n")
    (tmp_path / "group_vars/all/vars.yml").write_text(
        'nvidia_driver_reboot: "{{ vault_reboot }}"\n'
    )
    secret_vars = tmp_path / "group_vars/all/vault.yml"
    secret_vars.write_text("vault_reboot: Sometimes-5ecret\n")
    subprocess.run([VAULT_BIN, "encrypt", "--vault-password-file", str(vaulted / "pw"),
                    str(secret_vars)], check=True, capture_output=True)  # fmt: skip
    proc = run_cli("install", str(tmp_path / "hosts.ini"), "--vault-password-file",
                   str(vaulted / "pw"))  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "nvidia_driver_reboot=********: value of nvidia_driver_reboot must be one of" in (
        proc.stderr
    )
    assert "Sometimes-5ecret" not in proc.stdout + proc.stderr
    assert runs_started(state_dir) == []


def test_ask_vault_pass_prompts_once_and_the_run_is_answered_from_memory(vaulted, state_dir,
                                                                          tmp_path):  # fmt: skip
    """On a terminal: gpustack asks (ansible-core's own prompt), and ansible-playbook's prompt
    for the same password is answered by ansible-runner from memory, not from a file."""
    import pexpect

    report = tmp_path / "report.json"
    child = pexpect.spawn(sys.executable, ["-m", "gpustack", "doctor", str(vaulted / "inline.yml"),
                                           "--ask-vault-pass", "--report", str(report)],
                          cwd=str(ROOT), env={**os.environ, "GPUSTACK_STATE_DIR": str(state_dir)},
                          encoding="utf-8", timeout=300)  # fmt: skip
    child.expect("Vault password: ")
    child.sendline(PASSWORD)
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 4, child.before
    assert "port 9" in json.loads(report.read_text())["hosts"]["n1"]["unreachable_message"]
    assert "--ask-vault-pass" in _command(state_dir)["command"]
    assert PASSWORD not in _everything_written(state_dir, child.before or "")
