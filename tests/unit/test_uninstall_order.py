"""uninstall.yml removes in reverse lifecycle order and restores before it removes."""

import yaml

from tests.conftest import ROOT


def test_uninstall_runs_in_reverse_lifecycle_order():
    (play,) = yaml.safe_load((ROOT / "playbooks/uninstall.yml").read_text())
    roles = [
        (
            t["ansible.builtin.include_role"]["name"],
            t["ansible.builtin.include_role"].get("tasks_from"),
        )
        for t in play["tasks"]
        if "ansible.builtin.include_role" in t
    ]
    assert roles == [
        ("gpu_preflight", None),
        ("dpkg_ready", None),  # an interrupted dpkg is finished before any package is removed
        ("nvidia_mig", "uninstall.yml"),
        ("container_runtime", "uninstall.yml"),
        ("nvidia_container_toolkit", "uninstall.yml"),
        ("nvidia_driver", "uninstall.yml"),
    ]
    (site,) = yaml.safe_load((ROOT / "playbooks/site.yml").read_text())
    assert [r["role"] for r in site["roles"]] == ["gpu_preflight"]
    imports = [
        t["ansible.builtin.import_role"]
        for t in site["tasks"]
        if "ansible.builtin.import_role" in t
    ]
    # The driver's refusals first (they promise no change), then the toolkit's source and version
    # (no package changed yet), then the roles in order.
    assert imports[0] == {"name": "nvidia_driver", "tasks_from": "preflight"}
    assert imports[1] == {"name": "nvidia_container_toolkit", "tasks_from": "resolve"}
    install_order = [i["name"] for i in imports[2:]]
    assert all("tasks_from" not in i for i in imports[2:])
    mig, stamps = site["tasks"][-2:]  # MIG included last, only where a layout is set; then stamps
    assert "gpustack.gpustack.gpustack_converged" in stamps
    assert mig["ansible.builtin.include_role"]["name"] == "nvidia_mig"
    assert "nvidia_mig_config" in mig["when"]
    assert [r for r, _ in roles][2:] == ["nvidia_mig", *reversed(install_order)]
    # The MIG boot unit runs nvidia-smi at every boot: it goes with the driver too.
    (remove_mig,) = [t for t in play["tasks"] if t["name"].startswith("Remove gpustack's MIG")]
    assert remove_mig["when"] == "'mig' in __components or 'driver' in __components"


def test_each_component_releases_its_holds_before_removing_packages():
    for role in ("nvidia_container_toolkit", "nvidia_driver"):
        tasks = [  # a block's tasks in their place (the toolkit's removal is one block)
            task
            for top in yaml.safe_load((ROOT / f"roles/{role}/tasks/uninstall.yml").read_text())
            for task in top.get("block", [top])
        ]
        names = [t["name"] for t in tasks]
        release = next(i for i, t in enumerate(tasks) if "ansible.builtin.dpkg_selections" in t)
        remove = next(  # apt-get purge (the driver simulates it first, before the release)
            i
            for i, t in enumerate(tasks)
            if t["name"].startswith("Remove the") and "purge" in str(t)
        )
        assert tasks[release]["ansible.builtin.dpkg_selections"]["selection"] == "install", names
        assert release < remove, names
