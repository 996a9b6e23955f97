"""uninstall.yml removes in reverse lifecycle order and restores before it removes."""

import re

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
        # before any change: the toolkit alone does not go while nvidia is the default runtime
        ("container_runtime", "toolkit_guard"),
        ("dpkg_ready", None),  # an interrupted dpkg is finished before any package is removed
        ("nvidia_mig", "uninstall"),
        ("container_runtime", "uninstall"),
        ("nvidia_container_toolkit", "uninstall"),
        ("nvidia_driver", "uninstall"),
    ]
    (site,) = yaml.safe_load((ROOT / "playbooks/site.yml").read_text())
    assert "roles" not in site
    imports = [
        t["ansible.builtin.import_role"]
        for t in _flatten(site["tasks"])
        if "ansible.builtin.import_role" in t
    ]
    # The probe, the converged check (a converged host ends there) and the refusals; the driver's
    # refusals (they promise no change), then the toolkit's source and version (no package
    # changed yet), then the roles in order.
    assert [(i["name"], i.get("tasks_from")) for i in imports[:5]] == [
        ("gpu_preflight", "probe"),
        ("gpu_converged", "check"),
        ("gpu_preflight", "refuse"),
        ("nvidia_driver", "preflight"),
        ("nvidia_container_toolkit", "resolve"),
    ]
    # Then the roles in order, the driver in two parts with containerd wired between them while
    # the driver's package transaction runs (container_runtime's early part; its main verifies).
    rest = [(i["name"], i.get("tasks_from")) for i in imports[5:]]
    assert rest == [
        ("nvidia_driver", "start"),
        ("container_runtime", "early"),
        ("nvidia_driver", "finish"),
        ("nvidia_container_toolkit", None),
        ("container_runtime", None),
    ]
    install_order = [name for name, part in rest if part in (None, "finish")]
    mig, stamps = site["tasks"][-2:]  # MIG included last, only where a layout is set; then stamps
    assert "gpustack.gpustack.gpustack_converged" in stamps
    assert mig["ansible.builtin.include_role"]["name"] == "nvidia_mig"
    assert "nvidia_mig_config" in mig["when"]
    assert [r for r, _ in roles][3:] == ["nvidia_mig", *reversed(install_order)]
    # The MIG boot unit runs nvidia-smi at every boot: it goes with the driver too.
    (remove_mig,) = [t for t in play["tasks"] if t["name"].startswith("Remove gpustack's MIG")]
    assert remove_mig["when"] == "'mig' in __components or 'driver' in __components"


def _flatten(tasks):
    for task in tasks:
        yield task
        for key in ("block", "rescue"):
            yield from _flatten(task.get(key, []))


def test_each_component_purges_held_packages_in_one_call_and_holds_again_on_failure():
    """apt releases the holds before dpkg runs: a failed purge re-holds what it left installed."""
    for role in ("nvidia_container_toolkit", "nvidia_driver"):
        top = yaml.safe_load((ROOT / f"roles/{role}/tasks/uninstall.yml").read_text())
        tasks = list(_flatten(top))
        assert not [t["name"] for t in tasks if "ansible.builtin.dpkg_selections" in t]
        (guard,) = [t for t in tasks if "rescue" in t]
        (purge,) = guard["block"]
        argv = str(purge["ansible.builtin.command"]["argv"])
        assert "'--allow-change-held-packages', 'purge']" in argv, argv
        (restore,) = guard["rescue"]
        assert restore["ansible.builtin.include_role"] == {
            "name": "dpkg_ready",
            "tasks_from": "after_failed_purge",
        }
        assert restore["vars"]["dpkg_ready_packages"] in (
            "{{ __held }}",
            "{{ __nvidia_driver_remove_held }}",
        )
        assert restore["vars"]["dpkg_ready_failed"] == "{{ ansible_failed_result }}"
    shared = yaml.safe_load((ROOT / "roles/dpkg_ready/tasks/after_failed_purge.yml").read_text())
    assert "Hint:" in shared[-1]["ansible.builtin.fail"]["msg"]  # ends the run, with apt's error


def test_after_a_failed_purge_only_the_packages_dpkg_still_has_installed_are_marked_again():
    tasks = yaml.safe_load((ROOT / "roles/dpkg_ready/tasks/after_failed_purge.yml").read_text())
    (keep,) = [t for t in tasks if "ansible.builtin.set_fact" in t]
    pattern = re.search(r"select\('search', '([^']+)'\)", keep["vars"]["__left"])[1]
    lines = ["a ii ", "b hi ", "c iF ", "d iU ", "e hH ", "f un ", "g rc ", "h pn ", "i ri "]
    kept = [line.split()[0] for line in lines if re.search(pattern, line)]
    assert kept == ["a", "b", "c", "d", "e", "i"]
