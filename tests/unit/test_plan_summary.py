"""`gpustack plan`'s summary: packages, holds, files, services and reboots from changed tasks."""

import json

from gpustack.ansible.results import RunTracker, TaskChange
from gpustack.fleet.plan_summary import parse_apt_simulation, summarize

# What `apt-get --simulate install nvidia-smi=535.309.01-0+deb12u1 ...` prints (apt 2.6).
SIMULATION = """Reading package lists...
Building dependency tree...
Reading state information...
The following packages will be upgraded:
  libcuda1 nvidia-smi
2 upgraded, 1 newly installed, 1 to remove and 0 not upgraded.
Remv nvidia-legacy-check [535.261.03-1]
Inst libcuda1 [535.261.03-1] (535.309.01-0+deb12u1 Debian-Security:12/stable-security [amd64])
Inst nvidia-smi [535.261.03-1] (535.309.01-0+deb12u1 Debian-Security:12/stable-security [amd64])
Inst nvidia-persistenced (535.171.04-1 Debian:12.11/stable [amd64])
Conf libcuda1 (535.309.01-0+deb12u1 Debian-Security:12/stable-security [amd64])
"""


def test_apt_simulation_is_split_into_install_upgrade_remove():
    install, upgrade, remove = parse_apt_simulation(SIMULATION)
    assert install == ["nvidia-persistenced 535.171.04-1"]
    assert upgrade == [
        "libcuda1 535.261.03-1 -> 535.309.01-0+deb12u1",
        "nvidia-smi 535.261.03-1 -> 535.309.01-0+deb12u1",
    ]
    assert remove == ["nvidia-legacy-check 535.261.03-1"]


# What `apt-get --simulate --no-install-recommends install python3-apt` printed on a fresh Debian 12
# lab node (2026-11-27): roles/dpkg_ready/tasks/python_apt.yml hands it to plan.
PYTHON_APT = """Reading package lists...
Building dependency tree...
Reading state information...
Suggested packages:
  python-apt-doc
Recommended packages:
  lsb-release iso-codes
The following NEW packages will be installed:
  python3-apt
0 upgraded, 1 newly installed, 0 to remove and 16 not upgraded.
Inst python3-apt (2.6.0 Debian:12.15/oldstable [amd64])
Conf python3-apt (2.6.0 Debian:12.15/oldstable [amd64])
"""


def test_a_role_announces_packages_check_mode_cannot_see_through_the_apt_module():
    def announced(simulation):
        msg = {"gpustack_plan": "packages", "simulation": simulation, "what": "python3-apt"}
        return TaskChange("Plan - python3-apt", "dpkg_ready", [], "debug", {"msg": msg})

    plan = summarize([announced(PYTHON_APT)])
    assert plan.install == ["python3-apt 2.6.0"]  # recommends not taken
    assert plan.other == []
    plan = summarize([announced("")])  # lists that do not know python3-apt yet: named, not lost
    assert plan.install == [] and plan.other == ["python3-apt"]


def test_summary_sorts_changes_by_kind():
    diff = {"before": "a\n", "after": "b\n", "before_header": "/etc/x", "after_header": "/etc/x"}
    changes = [
        TaskChange("Install the driver", "nvidia_driver", [], "ansible.builtin.apt",
                   {"stdout": SIMULATION}),
        TaskChange("Refresh the package lists", "nvidia_driver", [], "ansible.builtin.apt", {}),
        TaskChange("Hold", "nvidia_driver", [], "ansible.builtin.dpkg_selections",
                   {"items": [{"item": "nvidia-smi", "before": "install", "after": "hold"}]}),
        TaskChange("Pin", "nvidia_driver", [diff], "ansible.builtin.template",
                   {"dest": "/etc/apt/preferences.d/gpustack-nvidia-driver.pref"}),
        TaskChange("Enable", "nvidia_driver", [], "ansible.builtin.systemd_service",
                   {"name": "nvidia-persistenced", "enabled": True}),
        TaskChange("Plan - the runtime would restart", "container_runtime", [],
                   "ansible.builtin.debug", {"msg": {"gpustack_plan": "restart", "service": "containerd"}}),
        TaskChange("Plan - the runtime would restart", "container_runtime", [], "ansible.builtin.debug",
                   {"msg": {"gpustack_plan": "restart", "service": "docker", "verb": "reload"}}),
        TaskChange("Plan - reboot", "nvidia_driver", [], "ansible.builtin.debug",
                   {"msg": {"gpustack_plan": "reboot", "reason": "driver 580.1 must replace 575.2"}}),
        TaskChange("Plan only - sources", "nvidia_driver", [], "ansible.builtin.debug",
                   {"msg": "would refresh the package lists"}),
    ]  # fmt: skip
    plan = summarize(changes)
    assert plan.install == ["nvidia-persistenced 535.171.04-1"]
    assert len(plan.upgrade) == 2 and plan.remove == ["nvidia-legacy-check 535.261.03-1"]
    assert plan.holds == ["nvidia-smi: install -> hold"]
    assert plan.files == [{"path": "/etc/apt/preferences.d/gpustack-nvidia-driver.pref",
                           "task": "nvidia_driver : Pin", "diff": [diff]}]  # fmt: skip
    assert plan.services == [
        "nvidia-persistenced: would be enabled",
        "containerd: would restart",
        "docker: would reload",
    ]
    assert plan.reboots == ["driver 580.1 must replace 575.2"]
    assert plan.other == [
        "nvidia_driver : Refresh the package lists",
        "nvidia_driver : Plan only - sources",
    ]
    assert not plan.empty() and summarize([]).empty()


def test_tracker_keeps_the_details_plan_needs():
    tracker = RunTracker(["n1"])
    tracker.handle({"event": "runner_on_ok", "event_data": {
        "host": "n1", "task": "Hold", "role": "r", "resolved_action": "ansible.builtin.dpkg_selections",
        "res": {"changed": True, "results": [
            {"item": "a", "changed": True, "before": "install", "after": "hold"},
            {"item": "b", "changed": False, "before": "hold", "after": "hold"}]}}})  # fmt: skip
    change = tracker.hosts["n1"].changes[0]
    assert change.action == "ansible.builtin.dpkg_selections"
    assert change.details["items"] == [{"item": "a", "before": "install", "after": "hold"}]


def test_mig_layout_changes_are_their_own_section():
    mig = {"config": "all-balanced", "reason": "would change: GPU 0: create 2 x 1g.10gb"}
    tracker = RunTracker(["n1"])  # the module's result as ansible-runner hands it over
    tracker.handle({"event": "runner_on_ok", "event_data": {
        "host": "n1", "task": "Apply the MIG layout", "role": "nvidia_mig",
        "resolved_action": "gpustack_mig", "res": {"changed": True, "mig": mig}}})  # fmt: skip
    plan = summarize(tracker.hosts["n1"].changes)
    assert plan.mig == ["all-balanced: would change: GPU 0: create 2 x 1g.10gb"]
    assert plan.other == [] and not plan.empty()


def test_a_hold_of_many_packages_in_one_call_is_planned_per_package():
    tracker = RunTracker(["n1"])
    tracker.handle({"event": "runner_on_ok", "event_data": {
        "host": "n1", "task": "Hold", "role": "dpkg_ready", "resolved_action": "gpustack_dpkg_selections",
        "res": {"changed": True, "items": [
            {"item": "nvidia-smi", "before": "install", "after": "hold"},
            {"item": "libcuda1", "before": "not present", "after": "hold"}]}}})  # fmt: skip
    plan = summarize(tracker.hosts["n1"].changes)
    assert plan.holds == ["nvidia-smi: install -> hold", "libcuda1: not present -> hold"]


def test_an_apt_source_change_lists_every_file_it_writes():
    """gpustack_apt_source writes the source, the mirror's credentials, the keyring and the key
    in one call; plan listed the source alone (seen on a real GPU host, 2026-11-27). The
    credentials' diff never shows their content."""
    source = "/etc/apt/sources.list.d/gpustack-nvidia-container-toolkit.sources"
    auth = "/etc/apt/auth.conf.d/gpustack-nvidia-container-toolkit.conf"
    keyring = "/usr/share/keyrings/gpustack-nvidia-container-toolkit.gpg"
    pub = "/var/lib/gpustack/nvidia-container-toolkit.pub"
    diff = [
        {"before_header": source, "after_header": source, "before": "", "after": "Types: deb\n"},
        {"before_header": auth, "after_header": auth, "before": "",
         "after": "(new credentials, not shown)\n"},
    ]  # fmt: skip
    tracker = RunTracker(["n1"])
    tracker.handle({"event": "runner_on_ok", "event_data": {
        "host": "n1", "task": "Write the repository source", "role": "apt_signed_repo",
        "resolved_action": "gpustack.gpustack.gpustack_apt_source",
        "res": {"changed": True, "files": sorted([source, auth, keyring, pub]), "diff": diff,
                "pending": True, "refreshed": False}}})  # fmt: skip
    plan = summarize(tracker.hosts["n1"].changes)
    assert [f["path"] for f in plan.files] == sorted([source, auth, keyring, pub])
    by_path = {f["path"]: f["diff"] for f in plan.files}
    assert by_path[source] == [diff[0]] and by_path[auth] == [diff[1]]
    assert by_path[keyring] == [] and by_path[pub] == []
    assert "password" not in json.dumps(plan.to_dict())


def test_the_archive_components_of_the_refresh_call_are_planned_as_the_file_they_change():
    """The driver role's refresh call enables the distro driver's archive components first
    (gpustack_apt_lists' components); in check mode it names the sources file and its diff. A
    refresh alone (no file) stays a line of its own."""
    debian = "/etc/apt/sources.list.d/debian.sources"
    diff = [{"before_header": debian, "after_header": debian, "before": "Components: main\n",
             "after": "Components: main contrib non-free non-free-firmware\n"}]  # fmt: skip
    tracker = RunTracker(["n1"])
    for task, res in (("Refresh the package lists (distro)", {"changed": True, "files": [debian],
                       "diff": diff, "madison_skipped": True}),
                      ("Refresh the package lists (stale)", {"changed": True, "files": []})):  # fmt: skip
        tracker.handle({"event": "runner_on_ok", "event_data": {
            "host": "n1", "task": task, "role": "nvidia_driver",
            "resolved_action": "gpustack.gpustack.gpustack_apt_lists", "res": res}})  # fmt: skip
    plan = summarize(tracker.hosts["n1"].changes)
    assert [(f["path"], f["diff"]) for f in plan.files] == [(debian, diff)]
    assert plan.other == ["nvidia_driver : Refresh the package lists (stale)"]


def test_uninstall_s_loops_and_restarts_are_planned_per_file_and_service():
    """uninstall --check: a file task looping over paths lists each path (it listed the task's
    name), and gpustack_restart's check-mode answer is a planned restart (its would_restart was
    dropped from the details, so none was listed)."""
    tracker = RunTracker(["n1"])
    tracker.handle({"event": "runner_on_ok", "event_data": {
        "host": "n1", "task": "Forget the record", "role": "container_runtime",
        "resolved_action": "ansible.builtin.file",
        "res": {"changed": True, "results": [
            {"item": "/var/lib/gpustack/a.json", "path": "/var/lib/gpustack/a.json", "changed": True},
            {"item": "/var/lib/gpustack/b", "path": "/var/lib/gpustack/b", "changed": False}]}}})  # fmt: skip
    tracker.handle({"event": "runner_on_ok", "event_data": {
        "host": "n1", "task": "Restart containerd", "role": "container_runtime",
        "resolved_action": "gpustack.gpustack.gpustack_restart",
        "res": {"changed": True, "name": "containerd", "would_restart": True, "removed": []}}})  # fmt: skip
    plan = summarize(tracker.hosts["n1"].changes)
    assert [f["path"] for f in plan.files] == ["/var/lib/gpustack/a.json"]
    assert plan.services == ["containerd: would restart"]


def test_the_driver_transaction_module_is_planned_from_its_simulation():
    """gpustack_apt_install (the driver's and the toolkit's transactions) returns apt-get
    --simulate's output as the apt module does."""
    change = TaskChange("Install the driver packages", "nvidia_driver", [],
                        "gpustack.gpustack.gpustack_apt_install", {"stdout": SIMULATION})  # fmt: skip
    by_apt = TaskChange(
        "Install", "nvidia_driver", [], "ansible.builtin.apt", {"stdout": SIMULATION}
    )
    assert summarize([change]).install == summarize([by_apt]).install != []


def test_the_transaction_call_plans_its_packages_holds_and_record_from_its_result():
    """gpustack_apt_install with the driver role's steps around it: the simulation, the holds its
    call sets, and the record it writes, from the task result as ansible-runner hands it over."""
    tracker = RunTracker(["n1"])
    tracker.handle({"event": "runner_on_ok", "event_data": {
        "host": "n1", "task": "Install the driver packages", "role": "nvidia_driver",
        "resolved_action": "gpustack.gpustack.gpustack_apt_install",
        "res": {"changed": True, "stdout": SIMULATION, "recorded": True, "holds": [
            {"item": "nvidia-smi", "before": "not present", "after": "hold"}]}}})  # fmt: skip
    plan = summarize(tracker.hosts["n1"].changes)
    assert plan.install != [] and plan.holds == ["nvidia-smi: not present -> hold"]
    assert plan.other == [
        "would record the packages installed before gpustack's first driver install "
        "(uninstall restores that set)"
    ]
    only_holds = TaskChange("Install the driver packages", "nvidia_driver", [],
                            "gpustack.gpustack.gpustack_apt_install",
                            {"holds": [{"item": "libcuda1", "before": "install", "after": "hold"}]})  # fmt: skip
    plan = summarize([only_holds])
    assert plan.holds == ["libcuda1: install -> hold"] and plan.other == []


def test_the_transaction_call_plans_the_pins_it_writes_as_files_with_their_own_diff():
    """The driver's pins and nouveau blacklist are written in its transaction call (O(files)):
    plan lists each file with its part of the call's diff, next to the packages and holds."""
    pin, blacklist = "/etc/apt/preferences.d/gpustack-nvidia-driver", "/etc/modprobe.d/b.conf"
    tracker = RunTracker(["n1"])
    tracker.handle({"event": "runner_on_ok", "event_data": {
        "host": "n1", "task": "Install the driver packages", "role": "nvidia_driver",
        "resolved_action": "gpustack.gpustack.gpustack_apt_install",
        "res": {"changed": True, "stdout": SIMULATION,
                "changes": [{"path": pin, "action": "created"},
                            {"path": blacklist, "action": "updated"}],
                "diff": [{"before_header": pin, "after_header": pin, "before": "", "after": "P\n"},
                         {"before_header": blacklist, "after_header": blacklist, "before": "a\n",
                          "after": "b\n"},
                         {"before": "nvidia-smi install\n", "after": "nvidia-smi hold\n"}]}}})  # fmt: skip
    plan = summarize(tracker.hosts["n1"].changes)
    assert plan.install != []
    assert [(f["path"], [d["after"] for d in f["diff"]]) for f in plan.files] == [
        (pin, ["P\n"]),
        (blacklist, ["b\n"]),
    ]
    only_pin = TaskChange("Install the driver packages", "nvidia_driver", [],
                          "gpustack.gpustack.gpustack_apt_install",
                          {"changes": [{"path": pin, "action": "updated"}]})  # fmt: skip
    plan = summarize([only_pin])
    assert [f["path"] for f in plan.files] == [pin] and plan.other == []
