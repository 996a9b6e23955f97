"""One validated invocation per command (gpustack/ansible/invocation.py): the inventory is parsed
once, its variables resolved once, and `upgrade` runs the same role-input checks as install."""

import pytest

from gpustack.ansible import inventory as inventory_module
from gpustack.ansible.invocation import HostOptions, validate
from gpustack.errors import BadInput
from gpustack.k8s.manifests import config_from_inventory
from gpustack.upgrade.command import UpgradeOptions, run_upgrade
from tests.upgrade_doubles import NEW


@pytest.fixture
def parses(monkeypatch):
    """How often Ansible's InventoryManager is built (each build parses the file again)."""
    count = []
    real = inventory_module._ansible_inventory_manager

    def counting(path):
        count.append(path)
        return real(path)

    monkeypatch.setattr(inventory_module, "_ansible_inventory_manager", counting)
    return count


def test_install_with_a_kubeconfig_parses_the_inventory_once(tmp_path, parses):
    inv = tmp_path / "inv.ini"
    inv.write_text(
        "[gpu_nodes]\ng1 ansible_host=10.0.0.1\ng2 ansible_host=10.0.0.2\n"
        "[all:vars]\ngpustack_k8s_time_slicing_replicas=4\nnvidia_driver_branch=580\n"
    )
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\n")
    invocation = validate(HostOptions(inventory=str(inv), kubeconfig=str(kubeconfig)))
    # what install --kubeconfig does next: the cluster settings from group vars, then doctor's
    config = config_from_inventory(invocation.inventory, invocation.extravars)
    assert config.time_slicing_replicas == 4  # [all:vars] seen, as a play sees it
    assert invocation.kubeconfig == str(kubeconfig)
    assert len(parses) == 1


def test_a_second_inventory_object_parses_its_own_file(tmp_path, parses):
    inv = tmp_path / "inv.ini"
    inv.write_text("[gpu_nodes]\ng1\n")
    validate(HostOptions(inventory=str(inv)))
    validate(HostOptions(inventory=str(inv)))
    assert len(parses) == 2  # one per command, never cached across commands


def test_upgrade_checks_the_inventorys_role_inputs_before_anything_runs(tmp_path, state_dir):
    inv = tmp_path / "fleet.ini"
    inv.write_text("[gpu_nodes]\ngpu1 nvidia_driver_source=ppa\n")
    ran = []
    with pytest.raises(BadInput, match="inventory host gpu1: nvidia_driver_source=ppa"):
        run_upgrade(
            UpgradeOptions(inventory=str(inv), driver_version=NEW, yes=True),
            lambda inventory, extravars: ran.append(inventory),
        )
    assert ran == []
    assert not (state_dir / "upgrades").exists()
