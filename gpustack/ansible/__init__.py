"""The Ansible side: inventory, role inputs, the one ansible-runner user, results, host locks."""

import os

# How inventory.py reads inventories with Ansible's InventoryManager: with the INI and YAML
# plugins only (never an executable inventory script) and an unparsable source an error.
# ansible-core reads its settings once, from the environment, when `ansible.constants` is first
# imported: they are set here, before any module of this package imports ansible (inventory.py
# checks that they took effect). ansible-playbook, started by runner.py, inherits them.
INVENTORY_ENVIRONMENT = {
    "ANSIBLE_INVENTORY_ENABLED": "ini,yaml",
    "ANSIBLE_INVENTORY_UNPARSED_FAILED": "True",
}
os.environ.update(INVENTORY_ENVIRONMENT)
