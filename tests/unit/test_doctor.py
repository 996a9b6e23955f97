import pytest

from gpustack.fleet import doctor


def facts(**over):
    pf = {
        "os": {"id": "debian", "version_id": "12", "family": "Debian", "pretty_name": "Debian 12"},
        "kernel": "6.1.0-18-amd64",
        "gpus": {"count": 2, "devices": [{"model": "GH100 [H100 SXM5 80GB]"}] * 2},
        "nvswitch": {"present": False},
        "secure_boot": "disabled",
        "nouveau_loaded": False,
        "kernel_headers": {
            "package": "linux-headers-6.1.0-18-amd64",
            "installed": True,
            "available": True,
        },
        "driver": {
            "installed": {"package": "nvidia-driver", "version": "535.261.03-1"},
            "loaded_version": "535.261.03",
        },
        "runtime": "containerd",
        "runtimes": [
            {
                "kind": "containerd",
                "version": "1.6.20",
                "config_version": 2,
                "config_exists": True,
                "active": True,
            }
        ],
        "kubelet": {"present": True},
    }
    pf.update(over)
    return {"gpustack_preflight": pf}


def messages(problems):
    return [p.message for p in problems]


def test_healthy_gpu_host_has_no_problems():
    assert doctor.find_problems("h", facts()) == []
    pf = facts()["gpustack_preflight"]
    assert doctor.gpu_summary(pf) == "2× GH100 [H100 SXM5 80GB]"
    assert doctor.driver_state(pf) == "loaded 535.261.03"
    assert doctor.runtime_summary(pf) == "containerd 1.6.20 (config v2)"


def test_missing_gpu_is_never_hidden_and_fatal_only_when_required():
    f = facts(
        gpus={"count": 0, "devices": []},
        driver={"installed": {"version": "535.261.03-1"}, "loaded_version": None},
    )
    assert doctor.driver_state(f["gpustack_preflight"]) == (
        "installed 535.261.03-1, not loaded: no NVIDIA device"
    )
    (warn,) = doctor.find_problems("h", f)
    assert warn.severity == "warning" and "not loaded: no NVIDIA device" in warn.message
    (err,) = doctor.find_problems("h", f, require_gpu=True)
    assert err.severity == "error"


def test_known_pain_points_are_reported_with_hints():
    f = facts(
        nouveau_loaded=True,
        secure_boot="enabled",
        kernel_headers={"package": "linux-headers-6.18-fc", "installed": False, "available": False},
        driver={"installed": {"version": "550.163.01-1"}, "loaded_version": "535.261.03"},
        runtime=None,
        runtimes=[],
    )
    problems = doctor.find_problems("h", f)
    text = " ".join(messages(problems))
    assert "nouveau" in text
    assert "Secure Boot is enabled" in text
    assert "no kernel headers for the running kernel" in text
    assert "reboot required" in text
    assert "kubelet present but no container runtime" in text
    assert all(p.hint for p in problems)


def test_inactive_runtime_and_missing_facts():
    f = facts(runtimes=[{"kind": "containerd", "active": False}])
    assert "containerd is installed but not running" in messages(doctor.find_problems("h", f))
    (p,) = doctor.find_problems("h", {})
    assert p.severity == "error"


def _docker_node(version, runtime_handlers, serves=True):
    return facts(
        runtime="docker",
        runtimes=[{"kind": "docker", "version": "27.3.1", "active": True}],
        kubelet={"present": True, "cri": "cri-dockerd"},
        cri_dockerd={
            "present": True,
            "version": version,
            "serves_kubelet": serves,
            "runtime_handlers": runtime_handlers,
        },
    )


def test_cri_dockerd_before_0_4_is_an_error_with_the_ways_out():
    problems = doctor.find_problems("gpu1", _docker_node("0.3.16", False))
    errors = [p for p in problems if p.severity == "error"]
    assert len(errors) == 1
    assert "cri-dockerd 0.3.16" in errors[0].message
    assert "refuses RuntimeClass handler 'nvidia'" in errors[0].message
    for way_out in ("0.4.0 or later", "containerd", "container_runtime_nvidia_default=true",
                    'gpustack_k8s_runtime_class=""'):  # fmt: skip
        assert way_out in errors[0].hint
    assert errors[0].host == "gpu1"


def test_cri_dockerd_docker_nodes_that_work():
    assert doctor.find_problems("gpu1", _docker_node("0.4.0", True)) == []
    # nvidia as Docker's default runtime and no RuntimeClass: old cri-dockerd is fine
    assert doctor.find_problems("gpu1", _docker_node("0.3.16", False), runtime_class="") == []
    # cri-dockerd installed but the kubelet uses containerd
    assert doctor.find_problems("gpu1", _docker_node("0.3.16", False, serves=False)) == []


def test_cri_dockerd_of_unknown_version_is_a_warning():
    problems = doctor.find_problems("gpu1", _docker_node(None, None))
    assert [p.severity for p in problems] == ["warning"]
    assert "unknown version" in problems[0].message
    assert "cri-dockerd --version" in problems[0].hint


def test_a_k3s_template_that_install_refuses_is_an_error_with_its_hint():
    """The probe's template_check (module_utils/gpustack_k3s.py) on a k3s agent node."""
    path = "/var/lib/rancher/k3s/agent/etc/containerd/config.toml.tmpl"
    check = {"template": path, "error": "it includes k3s's base template and ...", "hint": "remove"}
    entry = {"kind": "k3s", "active": False, "service": "k3s-agent", "template_check": check}
    found = doctor.find_problems("h", facts(runtime="k3s", runtimes=[entry]))
    (problem,) = [p for p in found if p.severity == "error"]
    assert problem.message.startswith(path + ": it includes") and problem.hint == "remove"
    (stopped,) = [p for p in found if "not running" in p.message]
    assert stopped.hint == "start it: systemctl enable --now k3s-agent"
    entry["template_check"] = {"template": None, "error": "", "hint": ""}
    found = doctor.find_problems("h", facts(runtime="k3s", runtimes=[entry]))
    assert not [p for p in found if p.severity == "error"]


def test_a_runtime_on_a_host_without_systemd_is_an_error_install_refuses():
    """As on the lent H100 VM (2026-11-27): containerd started by hand, another init."""
    (err,) = doctor.find_problems("h", facts(systemd=False))
    assert err.severity == "error"
    assert "does not run systemd" in err.message and "containerd" in err.message
    assert "--skip-tags container_runtime" in err.hint
    assert doctor.find_problems("h", facts(systemd=True)) == []
    assert doctor.find_problems("h", facts()) == []  # a probe of before the key: no claim
    bare = facts(systemd=False, runtime=None, runtimes=[], kubelet={"present": False})
    assert "does not run systemd" not in " ".join(messages(doctor.find_problems("h", bare)))


@pytest.mark.parametrize(
    ("version", "config_version", "warned"),
    [("2.1.9", 1, True), ("2.0.7", 1, True), ("2.2.1", 1, True), ("2.3.0", 1, False),
     ("1.7.24", 1, False), ("1.6.20", 1, False), ("2.1.9", 2, False), ("2.1.9", 3, False),
     ("2.1.9", None, False), (None, 1, False)],
)  # fmt: skip
def test_containerd_2_0_to_2_2_on_a_version_1_file_is_a_warning(version, config_version, warned):
    """containerd 2.1.9 on a lab node ignored a version-1 file's pause image and registry mirror
    (tests/fixtures/containerd-v1-schema)."""
    entry = {"kind": "containerd", "version": version, "config_version": config_version,
             "config_exists": True, "active": True}  # fmt: skip
    problems = doctor.find_problems("h", facts(runtimes=[entry]))
    found = [p for p in problems if "version-1 config.toml" in p.message]
    assert bool(found) is warned, messages(problems)
    if warned:
        assert (
            found[0].severity == "warning" and f"containerd {version} ignores" in found[0].message
        )
        assert "version = 3" in found[0].hint


def _containerd_node(version):
    node = facts()
    node["gpustack_preflight"]["runtimes"][0]["version"] = version
    return node


def test_cdi_needed_follows_the_roles_decision():
    assert doctor.cdi_needed({"gpustack_k8s_gpu_allocation": "dra"}) == (
        "gpustack_k8s_gpu_allocation=dra"
    )
    assert doctor.cdi_needed({"container_runtime_enable_cdi": True}) == (
        "container_runtime_enable_cdi=true"
    )
    assert doctor.cdi_needed({}) == ""
    assert doctor.cdi_needed({"gpustack_k8s_gpu_allocation": "device-plugin"}) == ""
    off = {"gpustack_k8s_gpu_allocation": "dra", "container_runtime_enable_cdi": "false"}
    assert doctor.cdi_needed(off) == ""


def test_dra_on_containerd_1_6_is_the_error_install_refuses_with():
    dra = "gpustack_k8s_gpu_allocation=dra"
    problems = doctor.find_problems("gpu1", _containerd_node("1.6.20~ds1"), cdi=dra)
    errors = [p for p in problems if p.severity == "error"]
    assert len(errors) == 1 and errors[0].host == "gpu1"
    assert "containerd 1.6.20~ds1 has no CDI support, which gpustack_k8s_gpu_allocation=dra" in (
        errors[0].message
    )
    assert "upgrade containerd to 1.7 or newer" in errors[0].hint
    assert "gpustack_k8s_gpu_allocation=device-plugin" in errors[0].hint
    # containerd with CDI, no CDI needed, or a version preflight could not read: nothing
    assert doctor.find_problems("gpu1", _containerd_node("1.7.24~ds1"), cdi=dra) == []
    assert doctor.find_problems("gpu1", _containerd_node("1.6.20~ds1")) == []
    assert doctor.find_problems("gpu1", _containerd_node(None), cdi=dra) == []
