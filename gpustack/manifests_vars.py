"""The `gpustack_k8s_*` variables an inventory sets, resolved the way Ansible resolves them.

`Inventory.hostvars` holds only host variables; cluster settings usually live in
`[all:vars]`, `group_vars/all.yml` or `host_vars/`, so this asks Ansible's own
VariableManager (the same precedence a playbook run sees, without templating).
"""

from __future__ import annotations

from typing import Any

from gpustack.errors import BadInput
from gpustack.inventory import Inventory, _ansible_inventory_manager
from gpustack.manifests_config import VAR_PREFIX


def _plain(value: Any) -> Any:
    """Ansible's tagged str/int/float values as plain Python values."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def inventory_k8s_vars(inventory: Inventory) -> dict[str, dict[str, Any]]:
    """{host: {gpustack_k8s_*: value}} for the inventory's target hosts."""
    from ansible.vars.manager import VariableManager

    manager = _ansible_inventory_manager(inventory.path)
    variables = VariableManager(loader=manager._loader, inventory=manager)
    found: dict[str, dict[str, Any]] = {}
    for name in inventory.hosts:
        host_vars = variables.get_vars(host=manager.get_host(name), include_hostvars=False)
        mine = {k: _plain(v) for k, v in host_vars.items() if k.startswith(VAR_PREFIX)}
        for key, value in mine.items():
            if isinstance(value, str) and ("{{" in value or "{%" in value):
                raise BadInput(
                    f"{key} on {name} is a Jinja2 template ({value!r})",
                    "gpustack reads gpustack_k8s_* before any play runs: give a literal value",
                )
        found[name] = mine
    return found
