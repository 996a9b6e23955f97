"""The `gpustack_k8s_*` variables an inventory sets, resolved the way Ansible resolves them.

`Inventory.hostvars` holds only host variables; cluster settings usually live in
`[all:vars]`, `group_vars/all.yml` or `host_vars/`, so this asks Ansible's own
VariableManager (the same precedence a playbook run sees, without templating).
"""

from __future__ import annotations

from typing import Any

from gpustack.ansible.inventory import Inventory, resolved_vars, templated
from gpustack.errors import BadInput
from gpustack.k8s.manifests_config import VAR_PREFIX


def inventory_k8s_vars(
    inventory: Inventory, also: tuple[str, ...] = (), extravars: dict[str, Any] | None = None
) -> dict[str, dict[str, Any]]:
    """{host: {gpustack_k8s_*: value}} for the inventory's target hosts, plus the variables
    named in `also` (host settings the cluster side must agree with; not checked here).
    Templates are rendered with Ansible's Templar over the host's variables and `extravars`
    (a vaulted value included); one that needs what only a play has (facts) is refused."""
    found = resolved_vars(
        inventory, lambda name: name.startswith(VAR_PREFIX) or name in also, extravars
    )
    for name, mine in found.items():
        for key, value in mine.items():
            if not key.startswith(VAR_PREFIX):
                continue
            if templated(value):
                raise BadInput(
                    f"{key} on {name} is a template that needs what only a play has ({value!r})",
                    "gpustack reads gpustack_k8s_* before any play runs: use inventory "
                    "variables, vaulted values or -e in it, not facts",
                )
    return found
