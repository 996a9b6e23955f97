"""Converged-host fast path: the controller's decision (pure), the probe module's comparisons,
and how install merges skipped hosts with the full run (runner replaced by canned results)."""

from __future__ import annotations

import copy
import json
import shutil

import pytest

from gpustack import paths
from gpustack.ansible import converged_run as fastpath
from gpustack.ansible.inventory import Inventory
from gpustack.ansible.results import HostResult, RunResult
from gpustack.commands import HostOptions
from gpustack.fleet import converged
from tests.unit.host_modules import utils
from tests.unit.test_driver_filters import load

module = utils("gpustack_stamps")

OLD, NEW = "535.261.03-1", "535.309.01-0+deb12u1"
TK_OLD, TK_NEW = "1.17.8-1~gpustackfixture", "1.18.0-1~gpustackfixture"
CONTENT = "c0ffee"
RESOLVED = {"nvidia_driver_source": "distro", "gpustack_require_gpu": "false"}


def preflight(kernel="6.1.0-18-amd64", gpus=0, loaded=None):
    return {
        "os": {"id": "debian", "family": "Debian", "version_id": "12", "codename": "bookworm"},
        "arch": "x86_64",
        "kernel": kernel,
        "secure_boot": "disabled",
        "gpus": {"count": gpus, "devices": [{"pci_address": f"0000:0{i}:00.0",
                                             "device_id": "0x2330"} for i in range(gpus)]},
        "nvswitch": {"present": False, "count": 0},
        "driver": {"installed": {"package": "nvidia-kernel-dkms", "version": OLD},
                   "loaded_version": loaded},
        "kernel_headers": {"installed": False},
        "runtime": "containerd",
        "runtimes": [{"kind": "containerd", "binary": "/usr/bin/containerd", "version": "1.6.20",
                      "config_path": "/etc/containerd/config.toml", "config_exists": True,
                      "active": True}],
    }  # fmt: skip


def stamp(role, resolved=RESOLVED, content=CONTENT, facts=None, resolve=None):
    resolves = {
        "nvidia_driver": {"kind": "driver", "package": "nvidia-kernel-dkms", "target": OLD,
                          "version_input": "", "branch": "", "source": "distro"},
        "nvidia_container_toolkit": {"kind": "toolkit", "package": "nvidia-container-toolkit",
                                     "target": TK_NEW, "version_input": ""},
        "container_runtime": {"kind": "none"},
    }  # fmt: skip
    return {
        "stamp": {
            "content": content,
            "inputs": converged.desired_inputs(role, resolved),
            "facts": facts or preflight(),
            "resolve": resolve or resolves[role],
            "published": {f"gpustack_{role}": {"recorded": True}},
        },
        "problems": [],
        "available": {"nvidia_driver": [OLD],
                      "nvidia_container_toolkit": [TK_NEW, TK_OLD]}.get(role, []),
    }  # fmt: skip


def host_facts(resolved=RESOLVED, age=60, pf=None, **changes):
    stamps = {role: stamp(role) for role in converged.HOST_ROLES}
    for role, entry in changes.items():
        stamps[role] = entry
    return {
        "gpustack_preflight": pf or preflight(),
        "gpustack_converged_probe": {"stamps": stamps, "apt_lists_age": age},
        "gpustack_converged_desired": dict(resolved),
    }


def reasons(facts):
    decision = converged.decide("gpu1", facts, CONTENT)
    assert decision.converged is (not decision.reasons)
    return decision.reasons


def test_untouched_host_is_converged_and_hands_back_the_published_facts():
    decision = converged.decide("gpu1", host_facts(), CONTENT)
    assert decision.converged, decision.reasons
    assert decision.published["gpustack_nvidia_driver"] == {"recorded": True}


def test_every_role_needs_a_stamp():
    facts = host_facts()
    del facts["gpustack_converged_probe"]["stamps"]["container_runtime"]
    assert reasons(facts) == ["container_runtime: no stamp (never installed by this gpustack, "
                              "or --check)"]  # fmt: skip
    assert reasons({}) == ["no probe facts"]


def test_a_host_side_problem_is_never_skipped():
    entry = stamp("nvidia_driver")
    entry["problems"] = ["file /etc/modprobe.d/gpustack-blacklist-nouveau.conf removed"]
    assert reasons(host_facts(nvidia_driver=entry)) == [
        "nvidia_driver: file /etc/modprobe.d/gpustack-blacklist-nouveau.conf removed"
    ]


def test_new_gpustack_content_invalidates_every_stamp():
    assert len(converged.decide("gpu1", host_facts(), "other").reasons) == 3


@pytest.mark.parametrize(
    ("name", "value"),
    [("nvidia_driver_version", NEW), ("nvidia_driver_branch", "535"),
     ("nvidia_driver_blacklist_nouveau", False), ("gpustack_require_gpu", "true"),
     ("nvidia_container_toolkit_version", TK_OLD), ("container_runtime_nvidia_default", True),
     ("container_runtime_enable_cdi", "true"), ("gpustack_k8s_gpu_allocation", "dra")],
)  # fmt: skip
def test_any_changed_input_means_a_full_run(name, value):
    found = reasons(host_facts(resolved={**RESOLVED, name: value}))
    assert any(f"input {name} is" in r for r in found), found


def test_an_input_set_to_its_default_value_is_no_change():
    assert reasons(host_facts(resolved={**RESOLVED, "nvidia_driver_reboot": "never"})) == []


def test_host_facts_the_roles_branch_on():
    assert "nvidia_driver: host fact kernel changed" in reasons(
        host_facts(pf=preflight(kernel="6.1.0-99-amd64"))
    )
    volatile = preflight()
    volatile["driver"]["installed"]["version"] = NEW  # checked through packages, not facts
    volatile["kernel_headers"]["installed"] = True
    volatile["runtimes"][0]["active"] = False  # services are compared by the probe
    volatile["runtimes"][0]["config_exists"] = False
    assert reasons(host_facts(pf=volatile)) == []


def test_newest_version_needs_fresh_lists_and_the_same_pick():
    assert "package lists are over an hour old" in " ".join(reasons(host_facts(age=3600)))
    assert "package lists are over an hour old" in " ".join(reasons(host_facts(age=None)))
    entry = stamp("nvidia_driver")
    entry["available"] = [NEW, OLD]
    assert reasons(host_facts(nvidia_driver=entry)) == [
        f"nvidia_driver: newest available is {NEW}, installed {OLD}"
    ]
    entry = stamp("nvidia_container_toolkit")
    entry["stamp"]["resolve"]["target"] = TK_OLD
    assert "newest available is" in reasons(host_facts(nvidia_container_toolkit=entry))[0]


def test_exact_versions_do_not_depend_on_the_lists():
    resolved = {**RESOLVED, "nvidia_driver_version": OLD}
    entry = stamp("nvidia_driver", resolved=resolved)
    entry["stamp"]["resolve"]["version_input"] = OLD
    entry["available"] = []
    tk = stamp("nvidia_container_toolkit", resolved=resolved)
    tk["stamp"]["resolve"]["version_input"] = TK_NEW
    found = reasons(host_facts(resolved=resolved, age=None, nvidia_driver=entry,
                               nvidia_container_toolkit=tk))  # fmt: skip
    assert found == []


def test_a_pending_driver_reload_is_not_converged():
    pf = preflight(gpus=2, loaded="535.200.01")
    assert "reload or reboot pending" in " ".join(reasons(host_facts(pf=pf)))
    pf = preflight(gpus=0, loaded=None)  # a GPU required but none loaded: full run fails it
    required = {**RESOLVED, "gpustack_require_gpu": "true"}
    facts = host_facts(resolved=required, pf=pf,
                       nvidia_driver=stamp("nvidia_driver", resolved=required))  # fmt: skip
    assert "reload or reboot pending" in " ".join(reasons(facts))
    pf = preflight(gpus=1, loaded="535.261.03")
    same = {role: stamp(role, facts=pf) for role in converged.HOST_ROLES}
    assert reasons(host_facts(pf=pf, **same)) == []


def test_configurations_without_a_fast_path():
    entry = stamp("nvidia_container_toolkit")
    entry["stamp"]["resolve"] = {"kind": "unsupported", "why": "local package files"}
    assert reasons(host_facts(nvidia_container_toolkit=entry)) == [
        "nvidia_container_toolkit: local package files"
    ]


def test_content_hash_covers_every_role_file(tmp_path, monkeypatch):
    for top in ("playbooks", "plugins", "roles"):
        shutil.copytree(paths.content_root() / top, tmp_path / top)
    monkeypatch.setattr(paths, "content_root", lambda: tmp_path)
    converged.content_hash.cache_clear()
    try:
        before = converged.content_hash()
        converged.content_hash.cache_clear()
        assert converged.content_hash() == before
        target = tmp_path / "roles/nvidia_driver/templates/blacklist-nouveau.conf.j2"
        target.write_text(target.read_text() + "# edited\n")
        converged.content_hash.cache_clear()
        edited = converged.content_hash()
        assert edited != before
        # The roles' modules live in the collection's plugins/: editing one is a content change.
        module = tmp_path / "plugins/modules/gpustack_host_probe.py"
        module.write_text(module.read_text() + "# edited\n")
        converged.content_hash.cache_clear()
        assert converged.content_hash() != edited
    finally:
        converged.content_hash.cache_clear()


def test_extravars_turn_recording_on_only_when_asked():
    assert converged.CONTENT_VAR not in converged.extravars(record=False)
    with_record = converged.extravars(record=True)
    assert with_record[converged.CONTENT_VAR] == converged.content_hash()
    names = with_record[converged.INPUTS_VAR]
    assert "nvidia_driver_version" in names["nvidia_driver"]
    assert "gpustack_require_gpu" in names["nvidia_driver"]
    assert "container_runtime_nvidia_name" in names["container_runtime"]
    assert "gpustack_k8s_gpu_allocation" in names["container_runtime"]  # enable_cdi auto reads it


# --- the probe module (runs on the host) ---


def test_canonical_dump_ignores_go_map_order():
    one = 'imports = ["/a.toml", "/b.toml"]\nversion = 2\n[plugins.x]\n  a = 1\n  b = 2\n[p.y]\n'
    shuffled = (
        'version = 2\nimports = ["/b.toml", "/a.toml"]\n[p.y]\n[plugins.x]\n  b = 2\n  a = 1\n'
    )
    assert module.canonical_dump(one) == module.canonical_dump(shuffled)
    assert module.canonical_dump(one) != module.canonical_dump(one.replace("b = 2", "b = 3"))
    moved = 'imports = ["/a.toml", "/b.toml"]\nversion = 2\n[plugins.x]\n  a = 1\n[p.y]\n  b = 2\n'
    assert module.canonical_dump(one) != module.canonical_dump(moved)


def test_probe_problems_name_each_difference():
    recorded = {
        "files": {"/etc/a": "1", "/etc/gone": "2", "/etc/absent": None},
        "packages": {"nvidia-smi": OLD, "libcuda1": OLD},
        "holds": ["nvidia-smi", "libcuda1"],
        "services": {"containerd": {"enabled": "enabled", "active": "active"}},
        "runtime": {"spec": {"kind": "containerd", "name": "nvidia"}, "dump_sha256": "d1"},
    }
    now = {
        "files": {"/etc/a": "1", "/etc/gone": None, "/etc/absent": None, "/etc/new.sources": "3"},
        "packages": {"nvidia-smi": NEW, "libcuda1": OLD},
        "services": {"containerd": {"enabled": "enabled", "active": "inactive"}},
        "runtime": {"dump_sha256": "d2", "wired": False},
    }
    assert module.problems(recorded, now, {"libcuda1"}) == [
        "file /etc/gone removed",
        "file /etc/new.sources appeared",
        f"package nvidia-smi {NEW}, recorded {OLD}",
        "package nvidia-smi not held",
        "service containerd active 'inactive', recorded 'active'",
        "containerd: runtime 'nvidia' not in the effective configuration",
        "containerd: effective configuration changed",
    ]
    same = copy.deepcopy(now)
    same.update(files={"/etc/a": "1", "/etc/gone": "2", "/etc/absent": None},
                packages={"nvidia-smi": OLD, "libcuda1": OLD},
                services=recorded["services"], runtime={"dump_sha256": "d1", "wired": True})  # fmt: skip
    assert module.problems(recorded, same, {"libcuda1", "nvidia-smi"}) == []


def test_stamps_keep_only_the_facts_the_decision_compares():
    """A first install's stamps were written with the facts probed before the driver was
    installed; a full re-run probes it installed. Stamps keep only what fact_subset compares,
    so the re-run writes the same stamp (no change), and the decision is unchanged."""
    before = preflight(gpus=2)
    before["driver"] = {"installed": {"package": None, "version": None}, "loaded_version": None}
    after = preflight(gpus=2, loaded=OLD)
    after["kernel_headers"] = {"installed": True, "available": True}
    after["runtimes"][0]["active"] = False
    assert module.recorded_facts(before) == module.recorded_facts(after)
    assert converged.fact_subset(module.recorded_facts(after)) == converged.fact_subset(after)
    moved = preflight(kernel="6.1.0-28-amd64", gpus=1)
    assert converged.fact_subset(module.recorded_facts(moved)) != converged.fact_subset(after)


def test_probe_reads_stamps_and_files(tmp_path):
    managed = tmp_path / "blacklist.conf"
    managed.write_text("blacklist nouveau\n")
    digest = module.sha256(str(managed))
    (tmp_path / "converged").mkdir()
    record = {"schema": 1, "content": "x", "files": {str(managed): digest}, "resolve": {}}
    (tmp_path / "converged/nvidia_driver.json").write_text(json.dumps(record))
    (tmp_path / "converged/broken.json").write_text("{")
    found = module.probe({"dir": str(tmp_path / "converged")})["stamps"]
    assert found["nvidia_driver"]["problems"] == []
    assert found["broken"]["problems"][0].startswith("stamp unreadable")
    managed.write_text("# emptied by hand\n")
    found = module.probe({"dir": str(tmp_path / "converged")})["stamps"]
    assert found["nvidia_driver"]["problems"] == [f"file {managed} changed"]


def test_probe_asks_dpkg_systemctl_and_apt_once_for_all_stamps(tmp_path, monkeypatch):
    """Every stamp's packages, units and offered versions come from one call each (each call
    is a process on the node; apt-cache loads the whole package cache)."""
    host = utils("gpustack_host")
    calls = []
    replies = {
        "dpkg-query": f"nvidia-smi {OLD} hi\nnvidia-container-toolkit {TK_OLD} hi\n",
        "systemctl": "Id=containerd.service\nUnitFileState=enabled\nActiveState=active\n\n"
        "Id=nvidia-persistenced.service\nUnitFileState=enabled\nActiveState=inactive\n",
        "apt-cache": f" nvidia-driver | {NEW} | deb.debian.org bookworm-updates/non-free\n"
        f" nvidia-driver | {OLD} | deb.debian.org bookworm/non-free\n"
        f" nvidia-container-toolkit | {TK_NEW} | file:/srv/repo\n",
        "apt-mark": "nvidia-smi\nnvidia-container-toolkit\n",
    }

    def run(argv):
        calls.append(argv)
        return 0, replies.get(argv[0], ""), ""

    monkeypatch.setattr(host, "run", run)
    monkeypatch.setattr(module, "run", run)
    monkeypatch.setattr(host, "which", lambda name: f"/usr/bin/{name}")
    (tmp_path / "converged").mkdir()
    stamps = {
        "nvidia_driver": {
            "packages": {"nvidia-smi": OLD},
            "holds": ["nvidia-smi"],
            "services": {"nvidia-persistenced.service": {"enabled": "enabled", "active": "active"}},
            "resolve": {"kind": "driver", "package": "nvidia-driver"},
        },
        "nvidia_container_toolkit": {
            "packages": {"nvidia-container-toolkit": TK_OLD},
            "holds": ["nvidia-container-toolkit"],
            "services": {"containerd.service": {"enabled": "enabled", "active": "active"}},
            "resolve": {"kind": "toolkit", "package": "nvidia-container-toolkit"},
        },
    }
    for role, stamp in stamps.items():
        stamp.update(schema=1, content="x", files={})
        (tmp_path / f"converged/{role}.json").write_text(json.dumps(stamp))
    found = module.probe({"dir": str(tmp_path / "converged")})["stamps"]
    assert sorted(argv[0] for argv in calls) == ["apt-cache", "apt-mark", "dpkg-query", "systemctl"]
    assert [argv for argv in calls if argv[0] == "apt-cache"] == [
        ["apt-cache", "madison", "nvidia-container-toolkit", "nvidia-driver"]
    ]
    assert found["nvidia_driver"]["available"] == [NEW, OLD]
    assert found["nvidia_container_toolkit"]["available"] == [TK_NEW]
    assert found["nvidia_container_toolkit"]["problems"] == []
    assert found["nvidia_driver"]["problems"] == [
        "service nvidia-persistenced.service active 'inactive', recorded 'active'"
    ]


# --- install's merge of skipped and fully run hosts ---


def _result(hosts, playbook, status="successful"):
    return RunResult(playbook, status, 0, f"/runs/{playbook}", hosts)


def _filter_decide():
    """The play's decision filter (plugins/filter/gpu_converged.py)."""
    plugin = load("plugins/filter/gpu_converged.py", "gc_decide_filters")
    return plugin.FilterModule().filters()["gpu_converged_decide"]


def test_the_plays_filter_decides_as_the_controller_and_hands_back_the_published_facts():
    decide = _filter_decide()
    assert decide(host_facts(), CONTENT) == {
        "converged": True,
        "reasons": [],
        "published": converged.decide("x", host_facts(), CONTENT).published,
    }
    stale = decide(host_facts(), "other")
    assert (stale["converged"], len(stale["reasons"]), stale["published"]) == (False, 3, {})
    assert decide({}, CONTENT) == {"converged": False, "reasons": ["no probe facts"],
                                   "published": {}}  # fmt: skip


def test_install_runs_site_once_and_reports_the_hosts_the_play_proved_converged(monkeypatch):
    inventory = Inventory(path=paths.content_root(), target_group="all", hosts=["a", "b", "c"])
    calls = []
    decide = _filter_decide()
    probed = {"a": host_facts(), "b": host_facts(age=None)}

    def play(playbook, inv, variables, opts, title, check=False, diff=False):
        calls.append((playbook, list(inv.hosts), variables.get(fastpath.CHECK_VAR)))
        hosts = {
            h: HostResult(h, ok=ok, changed=changed, started=True,
                          facts={**facts, "gpustack_converged": decide(facts, CONTENT)})
            for h, facts, ok, changed in (("a", probed["a"], 4, 0), ("b", probed["b"], 90, 1))
        }  # fmt: skip
        hosts["c"] = HostResult("c", unreachable=True, unreachable_message="no route", started=True)
        return _result(hosts, playbook, "failed")

    monkeypatch.setattr(fastpath, "_play", play)
    monkeypatch.setattr(converged, "content_hash", lambda: CONTENT)
    result = fastpath.run_site(HostOptions("inv"), (inventory, {}, None), "t")
    assert calls == [("site.yml", ["a", "b", "c"], CONTENT)]  # one run, the check on
    a, b, c = result.hosts["a"], result.hosts["b"], result.hosts["c"]
    assert (a.status, a.converged, a.changed) == ("ok", True, 0)
    assert a.facts["gpustack_converged"] == {"converged": True, "reasons": []}
    assert a.facts["gpustack_nvidia_driver"] == {"recorded": True}  # published, from the stamp
    assert "gpustack_converged_probe" not in a.facts
    assert (b.converged, b.ok, b.facts["gpustack_converged"]["converged"]) == (False, 90, False)
    assert "published" not in b.facts["gpustack_converged"]
    assert not {"gpustack_converged_probe", "gpustack_runtime_loaded"} & set(b.facts)
    assert c.unreachable and not c.converged
    assert int(result.exit_code) == 4


def test_full_and_tags_run_site_on_every_host(monkeypatch):
    inventory = Inventory(path=paths.content_root(), target_group="all", hosts=["a", "b"])
    calls = []

    def play(playbook, inv, variables, opts, title, check=False, diff=False):
        calls.append((playbook, list(inv.hosts), converged.CONTENT_VAR in variables))
        assert fastpath.CHECK_VAR not in variables  # no converged check: every host runs
        return _result({h: HostResult(h, started=True) for h in inv.hosts}, playbook)

    monkeypatch.setattr(fastpath, "_play", play)
    fastpath.run_site(HostOptions("inv"), (inventory, {}, None), "t", full=True)
    fastpath.run_site(HostOptions("inv", tags="nvidia_driver"), (inventory, {}, None), "t")
    fastpath.run_site(HostOptions("inv"), (inventory, {}, None), "t", check=True, full=True)
    # --tags: no stamp is written (a partial run proves nothing); check mode writes none either
    assert calls == [("site.yml", ["a", "b"], True), ("site.yml", ["a", "b"], False),
                     ("site.yml", ["a", "b"], False)]  # fmt: skip


def test_a_mig_layout_set_means_a_full_run_and_unset_keeps_the_fast_path():
    """nvidia_mig records no stamp: a host with nvidia_mig_config set is never proven converged
    (its GPUs' layout is checked by the full run); empty or unset leaves the fast path alone."""
    assert reasons(host_facts({**RESOLVED, "nvidia_mig_config": "all-1g.10gb"})) == [
        "nvidia_mig: nvidia_mig_config=all-1g.10gb (no stamp: a full run checks the GPUs)"
    ]
    assert reasons(host_facts({**RESOLVED, "nvidia_mig_config": ""})) == []
    assert reasons(host_facts({**RESOLVED, "nvidia_mig_config": converged.UNSET})) == []
    assert (
        "nvidia_mig_config" in converged.extravars(record=False)[converged.INPUTS_VAR]["nvidia_mig"]
    )


def test_docker_stamp_needs_the_runtime_loaded_by_the_running_daemon(monkeypatch):
    spec = {"kind": "docker", "name": "nvidia", "binary": "/usr/bin/ncr"}
    recorded = {"runtime": {"spec": spec}}
    loaded = {"runtimes": {"nvidia": {"path": "/usr/bin/ncr"}, "runc": {"path": "runc"}}}
    answers = [(0, json.dumps(loaded), ""), (0, json.dumps({"runtimes": {}}), ""), (1, "", "x")]

    def run(argv, data=None, env=None):
        assert argv[:3] == ["docker", "info", "--format"]
        return answers.pop(0)

    monkeypatch.setattr(module, "run", run)

    def now():
        return {"files": {}, "packages": {}, "services": {}, "runtime": module.runtime_state(spec)}

    assert module.problems(recorded, now(), set()) == []
    lost = ["docker: runtime 'nvidia' not loaded by the running daemon"]
    assert module.problems(recorded, now(), set()) == lost  # a reload lost after the write
    assert module.problems(recorded, now(), set()) == lost  # Docker not answering


def test_the_role_asks_docker_info_with_the_same_format():
    text = (paths.content_root() / "roles/container_runtime/vars/main.yml").read_text()
    assert f"__container_runtime_docker_info_format: !unsafe '{module.DOCKER_INFO_FORMAT}'" in text
