"""containerd and Docker merges of the container_runtime role (pure; the lab proves them live)."""

import json
import tomllib

import pytest
import tomlkit

from tests.unit.test_driver_filters import load

cr = load("plugins/filter/container_runtime.py", "container_runtime_filters")
BIN = "/usr/bin/nvidia-container-runtime"

DUMP_16 = """
version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    privileged_without_host_devices = false
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      SystemdCgroup = true
"""
DUMP_21 = DUMP_16.replace("version = 2", "version = 3").replace(
    "io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime"
)

KUBEADM = """# kubeadm-style, with a comment that must survive
version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "registry.k8s.io/pause:3.9"  # keep me
    [plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]
      endpoint = ["https://mirror.example.com"]
"""


def test_containerd_before_2_1_carries_the_whole_cri_table_and_default_runtimes():
    out = cr.containerd_nvidia(KUBEADM, DUMP_16, "1.6.20~ds1")
    assert out["merge"] == "replace" and out["plugin_key"] == "io.containerd.grpc.v1.cri"
    dropin = tomllib.loads(out["dropin"])
    cri = dropin["plugins"]["io.containerd.grpc.v1.cri"]
    assert dropin["version"] == 2
    assert cri["sandbox_image"] == "registry.k8s.io/pause:3.9"
    assert cri["registry"]["mirrors"]["docker.io"]["endpoint"] == ["https://mirror.example.com"]
    runtimes = cri["containerd"]["runtimes"]
    assert runtimes["runc"]["options"]["SystemdCgroup"] is True  # the default runtime survives
    nvidia = runtimes["nvidia"]
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"
    assert nvidia["options"] == {"SystemdCgroup": True, "BinaryName": BIN}
    assert "default_runtime_name" not in cri["containerd"]
    main = out["main"]
    assert main.startswith("# kubeadm-style, with a comment that must survive\nversion = 2\n")
    assert 'imports = ["/etc/containerd/conf.d/*.toml"]' in main
    assert "# keep me" in main


def test_containerd_2_1_merges_deeply_so_the_dropin_is_minimal():
    v3 = 'version = 3\n[plugins."io.containerd.cri.v1.images".pinned_images]\n  sandbox = "pause:3.10"\n'
    out = cr.containerd_nvidia(v3, DUMP_21, "2.1.4")
    dropin = tomllib.loads(out["dropin"])
    assert out["merge"] == "deep"
    assert list(dropin["plugins"]) == ["io.containerd.cri.v1.runtime"]
    assert list(dropin["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]["runtimes"]) == [
        "nvidia"
    ]


def test_version_1_config_uses_the_cri_key_and_no_version_line():
    out = cr.containerd_nvidia('[plugins.cri]\n  sandbox_image = "pause:3.6"\n', DUMP_16, "1.6.20")
    assert out["config_version"] == 1 and out["plugin_key"] == "cri"
    dropin = tomllib.loads(out["dropin"])
    assert "version" not in dropin
    assert dropin["plugins"]["cri"]["sandbox_image"] == "pause:3.6"


def test_no_config_file_creates_a_minimal_one():
    out = cr.containerd_nvidia("", DUMP_21, "2.1.9+unknown", main_exists=False)
    assert tomllib.loads(out["main"]) == {
        "version": 3,
        "imports": ["/etc/containerd/conf.d/*.toml"],
    }


def test_existing_imports_are_kept_and_the_merge_is_idempotent():
    main = 'version = 2\nimports = ["/etc/containerd/extra.toml"]\n'
    first = cr.containerd_nvidia(main, DUMP_16, "1.7.24")
    assert tomllib.loads(first["main"])["imports"] == [
        "/etc/containerd/extra.toml", "/etc/containerd/conf.d/*.toml"]  # fmt: skip
    second = cr.containerd_nvidia(first["main"], DUMP_16, "1.7.24")
    assert second == first


def test_gpu_operator_leftover_nvidia_runtime_is_repointed_not_duplicated():
    main = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "nvidia"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
    runtime_type = "io.containerd.runc.v2"
    privileged_without_host_devices = true
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
      BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime"
"""
    out = cr.containerd_nvidia(main, DUMP_16, "1.6.20")
    containerd = tomllib.loads(out["dropin"])["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert containerd["default_runtime_name"] == "nvidia"  # the user's choice stays
    assert containerd["runtimes"]["nvidia"]["privileged_without_host_devices"] is True
    assert containerd["runtimes"]["nvidia"]["options"]["BinaryName"] == BIN


def test_default_runtime_only_when_asked_and_extra_keys():
    out = cr.containerd_nvidia(KUBEADM, DUMP_21, "2.1.0", set_default=True,
                               extra={"options": {"ConfigPath": "/etc/nvidia/cfg.toml"}})  # fmt: skip
    containerd = tomllib.loads(out["dropin"])["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]
    assert containerd["default_runtime_name"] == "nvidia"
    assert containerd["runtimes"]["nvidia"]["options"]["ConfigPath"] == "/etc/nvidia/cfg.toml"


def test_broken_config_is_refused():
    with pytest.raises(cr.AnsibleFilterError, match="cannot parse the containerd config"):
        cr.containerd_nvidia("version = = 2", DUMP_16, "1.6.20")


def test_undo_takes_out_only_the_import():
    out = cr.containerd_nvidia(KUBEADM, DUMP_16, "1.6.20")
    assert cr.containerd_without_nvidia(out["main"]) == KUBEADM


DAEMON = """{
    "log-driver": "json-file",
    "runtimes": {
        "crun": {
            "path": "/usr/bin/crun"
        }
    },
    "data-root": "/srv/docker"
}
"""


def test_docker_merge_keeps_every_key_order_and_indent():
    text = cr.docker_daemon_nvidia(DAEMON, BIN)
    data = json.loads(text)
    assert list(data) == ["log-driver", "runtimes", "data-root"]
    assert data["runtimes"] == {
        "crun": {"path": "/usr/bin/crun"},
        "nvidia": {"path": BIN, "args": []},
    }
    assert '\n    "log-driver"' in text  # 4-space indent kept
    assert "default-runtime" not in data
    assert cr.docker_daemon_nvidia(text, BIN) == text  # second run: byte for byte
    assert (
        json.loads(cr.docker_daemon_nvidia(DAEMON, BIN, set_default=True))["default-runtime"]
        == "nvidia"
    )


def test_docker_merge_from_nothing_and_undo():
    text = cr.docker_daemon_nvidia("", BIN)
    assert json.loads(text) == {"runtimes": {"nvidia": {"path": BIN, "args": []}}}
    assert cr.docker_daemon_restore(text, None) is None  # gpustack created it: the file goes
    merged = cr.docker_daemon_nvidia(DAEMON, BIN, True)
    assert cr.docker_daemon_restore(merged, DAEMON) == DAEMON  # the user's bytes back


def test_docker_restore_keeps_what_the_user_changed_since():
    merged = json.loads(cr.docker_daemon_nvidia(DAEMON, BIN, True))
    merged["log-level"] = "debug"  # edited after install
    merged["runtimes"]["kata"] = {"path": "/usr/bin/kata-runtime"}
    undone = json.loads(cr.docker_daemon_restore(json.dumps(merged, indent=4), DAEMON))
    assert undone["log-level"] == "debug"
    assert set(undone["runtimes"]) == {"crun", "kata"}
    assert "default-runtime" not in undone


def test_docker_restore_gives_back_the_users_own_nvidia_entry_and_default():
    original = json.dumps(
        {"runtimes": {"nvidia": {"path": "/opt/nv/runtime"}}, "default-runtime": "nvidia"}
    )
    merged = cr.docker_daemon_nvidia(original, BIN, True)
    assert json.loads(merged)["runtimes"]["nvidia"]["path"] == BIN
    edited = json.loads(merged) | {"debug": True}
    undone = json.loads(cr.docker_daemon_restore(json.dumps(edited), original))
    assert undone == json.loads(original) | {"debug": True}


def test_docker_restore_leaves_a_default_runtime_the_user_chose_since():
    merged = json.loads(cr.docker_daemon_nvidia(DAEMON, BIN, True)) | {"default-runtime": "crun"}
    undone = json.loads(cr.docker_daemon_restore(json.dumps(merged), DAEMON))
    assert undone["default-runtime"] == "crun" and "nvidia" not in undone["runtimes"]


def test_docker_restore_of_a_file_without_gpustacks_keys_is_byte_for_byte():
    text = '{"debug": true}\n'
    assert cr.docker_daemon_restore(text, '{"debug": false}') == text
    with pytest.raises(cr.AnsibleFilterError, match=r"daemon\.json"):
        cr.docker_daemon_restore("{", DAEMON)


@pytest.mark.parametrize("bad", ["{", "[1, 2]"])
def test_docker_invalid_daemon_json_is_refused(bad):
    with pytest.raises(cr.AnsibleFilterError, match=r"daemon\.json"):
        cr.docker_daemon_nvidia(bad, BIN)
    assert "/etc/docker/daemon.json" in cr.docker_daemon_error(bad)
    assert cr.docker_daemon_error(DAEMON) == "" and cr.docker_daemon_error("") == ""


def test_restore_gives_back_the_original_bytes_unless_edited_since():
    original = 'version = 2\n# kubeadm-style\n[plugins."io.containerd.grpc.v1.cri"]\n  sandbox_image = "p:1"\n'
    merged = cr.containerd_nvidia(original, DUMP_16, "1.6.20")["main"]
    assert cr.containerd_restore(merged, original) == original
    edited = merged.replace('"p:1"', '"p:2"')
    restored = cr.containerd_restore(edited, original)
    assert '"p:2"' in restored and "conf.d" not in restored


@pytest.mark.parametrize("release, version", [("1.6.20", 2), ("2.1.1", 3)])
def test_restore_removes_a_created_file_only_while_nothing_else_is_in_it(release, version):
    """Where no main configuration existed, gpustack wrote `version` and its import: uninstall
    removes that file, but one the user has since added settings to stays, without the import."""
    created = cr.containerd_nvidia("", DUMP_16, release, main_exists=False)["main"]
    assert cr.containerd_restore(created, None, created=True) is None
    mirrors = '\n[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "/etc/containerd/certs.d"\n'
    restored = cr.containerd_restore(created + mirrors, None, created=True)
    assert restored is not None and "conf.d" not in restored
    assert tomlkit.parse(restored).unwrap()["version"] == version
    assert "certs.d" in restored
    # not created by gpustack (the kept original lost): never removed, the import taken out
    assert cr.containerd_restore(created, None) == f"version = {version}\n"


def test_a_main_configuration_that_is_not_toml_is_named_before_uninstall_changes_anything():
    assert cr.containerd_config_error("version = 2\n") == ""
    assert cr.containerd_config_error("") == ""
    error = cr.containerd_config_error("version = \n[plugins")
    assert error.startswith("/etc/containerd/config.toml is not valid TOML: "), error


def test_dumps_compare_by_content_not_by_map_order():
    a = 'imports = ["/a", "/b"]\n[x.runtimes.runc]\nt = 1\n[x.runtimes.nvidia]\nt = 2\n'
    b = 'imports = ["/b", "/a"]\n[x.runtimes.nvidia]\nt = 2\n[x.runtimes.runc]\nt = 1\n'
    assert cr.toml_canonical(a) == cr.toml_canonical(b)
    assert cr.toml_canonical(a) != cr.toml_canonical(a.replace("t = 2", "t = 3"))


def _info(runtimes, default="runc", rc=0):
    return {"rc": rc, "stdout": json.dumps({"runtimes": runtimes, "default": default})}


WANT = {"name": "nvidia", "binary": BIN, "default": False}


def test_docker_loaded_reads_what_the_running_daemon_has():
    # `docker info` of Debian's docker.io 20.10.24 on a lab node, after gpustack's reload
    loaded = {"nvidia": {"path": BIN}, "runc": {"path": "runc"}}
    assert cr.docker_loaded(_info(loaded), WANT)
    assert not cr.docker_loaded(_info(loaded), WANT | {"default": True})
    assert cr.docker_loaded(_info(loaded, default="nvidia"), WANT | {"default": True})
    assert not cr.docker_loaded(_info({"nvidia": {"path": "/opt/other"}}), WANT)
    assert not cr.docker_loaded(_info({"runc": {"path": "runc"}}), WANT)
    assert not cr.docker_loaded(_info(loaded, rc=1), WANT)  # Docker not answering
    assert not cr.docker_loaded({"rc": 0, "stdout": "not json"}, WANT)
    assert cr.docker_info({"rc": 127, "stdout": ""})["answered"] is False


# --- a version-1 file with the deprecated `default_runtime` table ---------------------------------
V1_LEGACY = """[plugins.cri]
  sandbox_image = "registry.k8s.io/pause:3.6"
  [plugins.cri.containerd]
    [plugins.cri.containerd.default_runtime]
      runtime_type = "io.containerd.runc.v2"
      [plugins.cri.containerd.default_runtime.options]
        SystemdCgroup = true
"""
# containerd 1.6's dump of such a file: the table as it is, runc built in with SystemdCgroup false
DUMP_16_LEGACY = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
  [plugins."io.containerd.grpc.v1.cri".containerd.default_runtime]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.default_runtime.options]
      SystemdCgroup = true
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
      BinaryName = ""
      SystemdCgroup = false
"""


@pytest.mark.parametrize("release", ["1.6.20~ds1", "1.7.24~ds1"])
def test_a_legacy_default_runtime_is_kept_and_lends_nvidia_its_cgroup_setting(release):
    out = cr.containerd_nvidia(V1_LEGACY, DUMP_16_LEGACY, release)
    containerd = tomllib.loads(out["dropin"])["plugins"]["cri"]["containerd"]
    # the user's table stays in force (the drop-in replaces the main file's CRI table)
    assert containerd["default_runtime"] == tomllib.loads(V1_LEGACY)["plugins"]["cri"][
        "containerd"]["default_runtime"]  # fmt: skip
    assert "default_runtime_name" not in containerd
    nvidia = containerd["runtimes"]["nvidia"]
    assert nvidia["options"]["SystemdCgroup"] is True  # as the pods that run by default
    assert nvidia["options"]["BinaryName"] == BIN
    assert containerd["runtimes"]["runc"]["options"]["SystemdCgroup"] is False  # runc as it was
    # the main file: the import added, every line of the user's kept
    assert out["main"] == 'imports = ["/etc/containerd/conf.d/*.toml"]\n\n' + V1_LEGACY


def test_the_legacy_merge_is_the_same_on_the_second_run():
    """The second run's dump has nvidia (and, with nvidia as the default, "default") in it."""
    for set_default in (False, True):
        first = cr.containerd_nvidia(V1_LEGACY, DUMP_16_LEGACY, "1.6.20", set_default=set_default)
        cri = tomllib.loads(first["dropin"])["plugins"]["cri"]
        dump_after = tomlkit.dumps({"version": 2, "plugins": {"io.containerd.grpc.v1.cri": cri}})
        again = cr.containerd_nvidia(first["main"], dump_after, "1.6.20", set_default=set_default)
        assert again == first, set_default


def test_nvidia_as_default_over_a_legacy_default_runtime_moves_the_table_to_runtimes():
    """containerd 1.x makes a typed `default_runtime` the default whatever default_runtime_name
    says: the drop-in carries it as the runtime "default" (as containerd loads it) instead."""
    out = cr.containerd_nvidia(V1_LEGACY, DUMP_16_LEGACY, "1.7.24", set_default=True)
    containerd = tomllib.loads(out["dropin"])["plugins"]["cri"]["containerd"]
    assert "default_runtime" not in containerd
    assert containerd["default_runtime_name"] == "nvidia"
    assert containerd["runtimes"]["default"] == {
        "runtime_type": "io.containerd.runc.v2", "options": {"SystemdCgroup": True}}  # fmt: skip
    assert containerd["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True


def test_containerd_2_1_reads_no_version_1_cri_table_so_the_dropin_is_version_3():
    """containerd 2.0-2.2 ignore the whole CRI table of a version-1 file (its plugin migration
    never runs for it), a version-1 drop-in's too: the drop-in is written in version 3, holding
    only the nvidia entry (2.1 merges deeply). The legacy table has no effect there: nvidia
    copies runc, and nvidia as the default needs nothing moved."""
    out = cr.containerd_nvidia(V1_LEGACY, DUMP_21, "2.1.9+unknown", set_default=True)
    dropin = tomllib.loads(out["dropin"])
    assert out["config_version"] == 1 and out["dropin_version"] == 3
    assert out["plugin_key"] == "io.containerd.cri.v1.runtime"
    assert dropin["version"] == 3 and list(dropin["plugins"]) == ["io.containerd.cri.v1.runtime"]
    containerd = dropin["plugins"]["io.containerd.cri.v1.runtime"]["containerd"]
    assert list(containerd["runtimes"]) == ["nvidia"]
    assert containerd["runtimes"]["nvidia"]["options"]["SystemdCgroup"] is True  # runc's, DUMP_21
    assert containerd["default_runtime_name"] == "nvidia"
    assert out["main"] == 'imports = ["/etc/containerd/conf.d/*.toml"]\n\n' + V1_LEGACY
    legacy = tomllib.loads(V1_LEGACY)["plugins"]["cri"]
    assert cr.legacy_default_runtime(legacy, (2, 0)) is None
    assert cr.legacy_default_runtime(legacy, (1, 7))["runtime_type"] == "io.containerd.runc.v2"


def test_containerd_2_0_carries_the_built_in_runtimes_not_the_ignored_version_1_table():
    out = cr.containerd_nvidia(V1_LEGACY, DUMP_21, "2.0.7")
    cri = tomllib.loads(out["dropin"])["plugins"]["io.containerd.cri.v1.runtime"]
    assert set(cri) == {"containerd"}  # no sandbox_image: the v1 table is not in this schema
    assert sorted(cri["containerd"]["runtimes"]) == ["nvidia", "runc"]


@pytest.mark.parametrize(
    ("main_version", "release", "expected"),
    [(1, (1, 6), 1), (1, (1, 7), 1), (1, (2, 0), 3), (1, (2, 1), 3), (1, (2, 2), 3),
     (1, (2, 3), 1), (2, (2, 1), 2), (3, (2, 1), 3), (2, (1, 7), 2)],
)  # fmt: skip
def test_the_dropin_keeps_the_main_files_version_except_v1_on_containerd_2_0_to_2_2(
    main_version, release, expected
):
    assert cr.dropin_config_version(main_version, release) == expected


def test_an_untyped_or_non_runc_legacy_table_lends_nothing():
    untyped = V1_LEGACY.replace('runtime_type = "io.containerd.runc.v2"', 'runtime_type = ""')
    assert cr.legacy_default_runtime(tomllib.loads(untyped)["plugins"]["cri"], (1, 6)) is None
    out = cr.containerd_nvidia(untyped, DUMP_16_LEGACY, "1.6.20")
    nvidia = tomllib.loads(out["dropin"])["plugins"]["cri"]["containerd"]["runtimes"]["nvidia"]
    assert nvidia["options"]["SystemdCgroup"] is False  # runc's
    kata = V1_LEGACY.replace("io.containerd.runc.v2", "io.containerd.kata.v2")
    out = cr.containerd_nvidia(kata, DUMP_16_LEGACY, "1.6.20")
    nvidia = tomllib.loads(out["dropin"])["plugins"]["cri"]["containerd"]["runtimes"]["nvidia"]
    assert nvidia["options"]["SystemdCgroup"] is False
    assert nvidia["runtime_type"] == "io.containerd.runc.v2"


# --- containerd's verify failure names what failed -------------------------------------------------
WIRED = {"wired": True, "container_check": "passed"}


@pytest.mark.parametrize(
    ("runtime", "loaded", "expected"),
    [
        (WIRED, {"restart_pending": False, "differences": []}, []),
        ({"wired": "True", "container_check": "skipped: no verify image"}, {}, []),
        ({**WIRED, "wired": False}, {},
         ["the nvidia runtime with BinaryName /usr/bin/nvidia-container-runtime is not in the "
          "effective configuration (`containerd --config /etc/containerd/config.toml config dump`)"]),
        (WIRED, {"restart_pending": True, "differences": []},
         ["gpustack's restart-pending marker is still there (containerd was not restarted after "
          "gpustack changed its files)"]),
        (WIRED, {"differences": ["runtime 'default' is loaded but no longer in the files"]},
         ["the running containerd differs from its files (runtime 'default' is loaded but no "
          "longer in the files)"]),
        ({**WIRED, "container_check": "failed: ctr: image not found"}, {},
         ["the test container failed (ctr: image not found)"]),
        ({**WIRED, "container_check": "failed: the running containerd has no nvidia runtime handler"},
         {"differences": ["runtime 'nvidia' is in the files but not loaded"]},
         ["the running containerd differs from its files (runtime 'nvidia' is in the files but not "
          "loaded)", "the test container failed (the running containerd has no nvidia runtime handler)"]),
    ],
)  # fmt: skip
def test_the_verify_failure_names_only_the_conditions_that_failed(runtime, loaded, expected):
    problems = cr.containerd_verify_problems(runtime, loaded, "nvidia", BIN,
                                             "/etc/containerd/config.toml")  # fmt: skip
    assert problems == expected
    assert not any("passed" in p for p in problems)


# CDI (container_runtime_enable_cdi; NVIDIA's DRA driver hands devices to containerd as CDI names)
def _cdi_table(out):
    return tomllib.loads(out["dropin"])["plugins"][out["plugin_key"]]


def test_cdi_on_containerd_1_7_goes_into_the_cri_plugin_table_with_the_user_settings_kept():
    out = cr.containerd_nvidia(KUBEADM, DUMP_16, "1.7.24", cdi=True)
    cri = _cdi_table(out)
    assert out["cdi"] is True and out["plugin_key"] == "io.containerd.grpc.v1.cri"
    assert cri["enable_cdi"] is True
    assert cri["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    assert "enable_cdi" not in cri["containerd"]  # the plugin's key, not the containerd table's
    assert cri["sandbox_image"] == "registry.k8s.io/pause:3.9"  # still carried
    assert cri["containerd"]["runtimes"]["nvidia"]["options"]["BinaryName"] == BIN
    assert "enable_cdi" not in out["main"]  # the user's file only gets the import
    # without cdi nothing of it is written (existing installs keep their drop-in byte for byte)
    plain = cr.containerd_nvidia(KUBEADM, DUMP_16, "1.7.24")
    assert "cdi" not in plain["dropin"]


def test_cdi_is_idempotent_and_the_users_spec_dirs_are_kept():
    main = KUBEADM.replace(
        "    sandbox_image", '    cdi_spec_dirs = ["/opt/cdi"]\n    sandbox_image'
    )
    first = cr.containerd_nvidia(main, DUMP_16, "1.7.24", cdi=True)
    assert _cdi_table(first)["cdi_spec_dirs"] == ["/opt/cdi"]
    second = cr.containerd_nvidia(first["main"], DUMP_16, "1.7.24", cdi=True)
    assert second == first


def test_cdi_turned_off_by_the_user_is_turned_on_by_the_dropin_the_main_file_keeps_it():
    main = KUBEADM.replace("    sandbox_image", "    enable_cdi = false\n    sandbox_image")
    out = cr.containerd_nvidia(main, DUMP_16, "1.7.24", cdi=True)
    assert _cdi_table(out)["enable_cdi"] is True
    assert "enable_cdi = false" in out["main"]


def test_cdi_on_containerd_2_x_version_3_table():
    v3 = 'version = 3\n[plugins."io.containerd.cri.v1.runtime"]\n  enable_cdi = false\n'
    deep = cr.containerd_nvidia(v3, DUMP_21, "2.1.9", cdi=True)
    cri = _cdi_table(deep)
    assert deep["plugin_key"] == "io.containerd.cri.v1.runtime" and deep["merge"] == "deep"
    # deep merge: the drop-in's true wins over the main file's false
    assert cri["enable_cdi"] is True and cri["cdi_spec_dirs"] == ["/etc/cdi", "/var/run/cdi"]
    # a deep merge keeps the main file's directories in force: not written again
    dirs = v3 + '  cdi_spec_dirs = ["/opt/cdi"]\n'
    assert "cdi_spec_dirs" not in _cdi_table(cr.containerd_nvidia(dirs, DUMP_21, "2.1.9", cdi=True))
    replace = cr.containerd_nvidia(v3, DUMP_21, "2.0.5", cdi=True)
    assert replace["merge"] == "replace" and _cdi_table(replace)["enable_cdi"] is True


def test_cdi_on_a_version_1_file_uses_the_cri_plugin_table():
    out = cr.containerd_nvidia('[plugins.cri]\n  sandbox_image = "pause:3.6"\n', DUMP_16, "1.7.24",
                               cdi=True)  # fmt: skip
    cri = tomllib.loads(out["dropin"])["plugins"]["cri"]
    assert cri["enable_cdi"] is True and cri["sandbox_image"] == "pause:3.6"


def test_cdi_on_containerd_1_6_is_refused():
    with pytest.raises(cr.AnsibleFilterError, match=r"containerd 1\.6 has no CDI support"):
        cr.containerd_nvidia(KUBEADM, DUMP_16, "1.6.20~ds1", cdi=True)
