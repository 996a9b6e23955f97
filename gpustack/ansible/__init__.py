"""The Ansible side: inventory, role inputs, the one ansible-runner user, results, host locks."""

import os
import sys

# How inventory.py reads inventories with Ansible's InventoryManager: with the INI and YAML
# plugins only (never an executable inventory script) and an unparsable source an error.
# ansible-core reads its settings once, from the environment, when `ansible.constants` is first
# imported: it is imported here with them, before any module of this package imports ansible
# (inventory.py checks that they took effect), and the environment is put back as it was, so
# that the processes gpustack starts (ansible-playbook) do not inherit them.
INVENTORY_ENVIRONMENT = {
    "ANSIBLE_INVENTORY_ENABLED": "ini,yaml",
    "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
}


def _load_ansible_settings() -> None:
    if "ansible.constants" in sys.modules:
        return
    saved = {name: os.environ.get(name) for name in INVENTORY_ENVIRONMENT}
    os.environ.update(INVENTORY_ENVIRONMENT)
    try:
        import ansible.constants  # noqa: F401  (reads the environment, once)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


_load_ansible_settings()
