"""The preflight module's parsers, loaded from the role as Ansible would ship it."""

import pytest

from tests.unit.host_modules import load, utils

mod = load("plugins/modules/gpustack_host_probe.py", "gpustack_host_probe")
kube = utils("gpustack_kubelet")


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ('version = 2\nroot = "/var/lib/containerd"\n[plugins]\n', 2),
        ("version = 3\n\n[plugins.'io.containerd.cri.v1.runtime']\n", 3),
        ('root = "/var/lib/containerd"\n[plugins.cri]\n  version = 7\n', 1),
        ("# comment\n  version=2\n", 2),
    ],
)
def test_containerd_config_version(tmp_path, text, version):
    path = tmp_path / "config.toml"
    path.write_text(text)
    assert mod.containerd_config_version(str(path)) == version


def test_containerd_config_absent(tmp_path):
    assert mod.containerd_config_version(str(tmp_path / "none.toml")) is None


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.161.07  "
            "Sat Feb 17 22:55:48 UTC 2024\n"
            "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n",
            "535.161.07",
        ),
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
            "(dvs-builder@U16-I3-B03-4-3)  Tue Sep 23 09:53:52 UTC 2025\n",
            "580.95.05",
        ),
        ("", None),
    ],
)
def test_loaded_driver_version(text, version):
    assert mod.parse_nvrm_version(text) == version


@pytest.mark.parametrize(
    ("text", "version"),
    [
        ("containerd github.com/containerd/containerd 1.6.20~ds1 1.6.20~ds1-1+b1\n", "1.6.20~ds1"),
        ("containerd containerd.io v2.1.4 75cb2b7193e4e490e9fbdc236c0e811ccaba3376\n", "2.1.4"),
        ("Docker version 27.3.1, build ce12230\n", "27.3.1"),
        ("k3s version v1.30.4+k3s1 (98262b5d)\ngo version go1.22.5\n", "1.30.4+k3s1"),
        ("crio version 1.30.1\n", "1.30.1"),
        ("Kubernetes v1.31.2\n", "1.31.2"),
    ],
)
def test_runtime_version_strings(text, version):
    assert mod.first_version(text) == version


def test_runtime_unit_is_the_one_that_runs(monkeypatch):
    """k3s runs as k3s.service on a server and k3s-agent.service on an agent (RKE2 likewise):
    the probe reports the active one, else the installed one, else the first."""

    def states(table):
        def answer(units):
            pairs = {u: table.get(u, ("", "inactive")) for u in units}
            return {u: {"enabled": e, "active": a} for u, (e, a) in pairs.items()}

        return answer

    units = ["k3s", "k3s-agent"]
    monkeypatch.setattr(mod, "service_states", states({"k3s-agent.service": ("enabled", "active")}))
    assert mod.runtime_unit(units) == "k3s-agent"
    monkeypatch.setattr(
        mod,
        "service_states",
        states({"k3s.service": ("disabled", "inactive"), "k3s-agent.service": ("", "inactive")}),
    )
    assert mod.runtime_unit(units) == "k3s"
    monkeypatch.setattr(mod, "service_states", states({}))
    assert mod.runtime_unit(["rke2-server", "rke2-agent"]) == "rke2-server"
    assert mod.runtime_unit("containerd") == "containerd"


def test_primary_runtime_precedence(monkeypatch):
    def kinds(*names):
        return [{"kind": n} for n in names]

    monkeypatch.setattr(mod, "which", lambda name: None)
    assert mod.primary_runtime(kinds("containerd", "docker")) == "docker"
    assert mod.primary_runtime(kinds("crio", "containerd")) == "crio"
    assert mod.primary_runtime(kinds("k3s")) == "k3s"
    assert mod.primary_runtime([]) is None
    monkeypatch.setattr(
        mod, "which", lambda name: "/usr/bin/kubelet" if name == "kubelet" else None
    )
    assert mod.primary_runtime(kinds("containerd", "docker")) == "containerd"


def test_a_kubelet_behind_cri_dockerd_makes_docker_the_runtime_to_wire(monkeypatch):
    """Docker, Docker's containerd and a kubelet: which one to configure depends on the
    kubelet's CRI endpoint (before: always containerd, which such a kubelet never uses)."""
    monkeypatch.setattr(
        mod, "which", lambda name: "/usr/bin/kubelet" if name == "kubelet" else None
    )
    found = [{"kind": "containerd"}, {"kind": "docker"}]
    assert mod.primary_runtime(found, "cri-dockerd") == "docker"
    assert mod.primary_runtime(found, "containerd") == "containerd"
    assert mod.primary_runtime(found, None) == "containerd"
    assert mod.primary_runtime([{"kind": "crio"}, {"kind": "docker"}], "cri-dockerd") == "crio"


@pytest.mark.parametrize(
    ("args", "name", "value"),
    [
        (
            ["--container-runtime-endpoint=unix:///run/cri-dockerd.sock"],
            "container-runtime-endpoint",
            "unix:///run/cri-dockerd.sock",
        ),
        (
            ["--v", "2", "--container-runtime-endpoint", "unix:///x.sock"],
            "container-runtime-endpoint",
            "unix:///x.sock",
        ),
        (["--config=/a", "--config=/b"], "config", "/b"),
        (["--container-runtime-endpoint"], "container-runtime-endpoint", None),
        ([], "config", None),
    ],
)
def test_flag_value(args, name, value):
    assert kube.flag_value(args, name) == value


def test_kubelet_endpoint_from_a_kubeadm_flags_file():
    files = {
        "/var/lib/kubelet/kubeadm-flags.env": (
            'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint=unix:///var/run/cri-dockerd.sock '
            '--pod-infra-container-image=registry.k8s.io/pause:3.10"\n'
        )
    }
    endpoint, source = kube.kubelet_runtime_endpoint(None, files.get)
    assert endpoint == "unix:///var/run/cri-dockerd.sock"
    assert source == "/var/lib/kubelet/kubeadm-flags.env"
    assert kube.cri_of(endpoint) == "cri-dockerd"


def test_kubelet_endpoint_precedence_process_then_its_config_then_files():
    files = {
        "/etc/kubelet.yaml": "kind: KubeletConfiguration\ncontainerRuntimeEndpoint: 'unix:///run/containerd/containerd.sock'\n",
        "/etc/default/kubelet": "KUBELET_EXTRA_ARGS=--container-runtime-endpoint=unix:///run/cri-dockerd.sock\n",
        "/var/lib/kubelet/config.yaml": "containerRuntimeEndpoint: unix:///var/run/crio/crio.sock\n",
    }
    running = ["--container-runtime-endpoint=unix:///run/k3s/containerd/containerd.sock"]
    assert kube.kubelet_runtime_endpoint(running, files.get) == (
        "unix:///run/k3s/containerd/containerd.sock",
        "kubelet process",
    )
    assert kube.kubelet_runtime_endpoint(["--config=/etc/kubelet.yaml"], files.get) == (
        "unix:///run/containerd/containerd.sock",
        "/etc/kubelet.yaml",
    )
    assert kube.kubelet_runtime_endpoint(["--v=2"], files.get) == (
        "unix:///run/cri-dockerd.sock",
        "/etc/default/kubelet",
    )
    only_config = {"/var/lib/kubelet/config.yaml": files["/var/lib/kubelet/config.yaml"]}
    endpoint, _ = kube.kubelet_runtime_endpoint(None, only_config.get)
    assert kube.cri_of(endpoint) == "crio"
    assert kube.kubelet_runtime_endpoint(None, {}.get) == (None, None)


@pytest.mark.parametrize(
    ("endpoint", "cri"),
    [
        ("unix:///run/cri-dockerd.sock", "cri-dockerd"),
        ("unix:///var/run/dockershim.sock", "dockershim"),
        ("unix:///var/run/crio/crio.sock", "crio"),
        ("unix:///run/containerd/containerd.sock", "containerd"),
        ("unix:///run/k3s/containerd/containerd.sock", "containerd"),
        ("unix:///run/other.sock", "other"),
        (None, None),
    ],
)
def test_cri_of(endpoint, cri):
    assert kube.cri_of(endpoint) == cri


@pytest.mark.parametrize(
    ("version", "handlers"),
    [
        ("0.3.16", False),
        ("0.3.25", False),
        ("0.4.0", True),
        ("0.4.3", True),
        ("1.0.0", True),
        (None, None),
        ("dev", None),
    ],
)
def test_cri_dockerd_runs_runtime_class_handlers_from_0_4_0(version, handlers):
    assert kube.runtime_handlers(version) is handlers


def test_cri_dockerd_facts_from_its_binary(monkeypatch, tmp_path):
    shim = tmp_path / "cri-dockerd"
    shim.write_text("#!/bin/sh\necho 'cri-dockerd 0.3.16 (d5bd4c7)'\n")
    shim.chmod(0o755)
    monkeypatch.setattr(kube, "which", lambda name: str(shim) if name == "cri-dockerd" else None)
    facts = kube.cri_dockerd("cri-dockerd", True)
    assert facts["version"] == "0.3.16"
    assert facts["serves_kubelet"] is True and facts["runtime_handlers"] is False
    # endpoint unknown: a kubelet next to cri-dockerd uses it; a known other endpoint wins
    assert kube.cri_dockerd(None, True)["serves_kubelet"] is True
    assert kube.cri_dockerd("containerd", True)["serves_kubelet"] is False
    monkeypatch.setattr(kube, "which", lambda name: None)
    monkeypatch.setattr(kube, "CRI_DOCKERD_SOCKETS", ())
    assert kube.cri_dockerd(None, True) == {
        "present": False,
        "binary": None,
        "version": None,
        "socket": None,
        "active": None,
        "serves_kubelet": False,
        "runtime_handlers": None,
    }


@pytest.fixture
def apt_lists(monkeypatch):
    """apt-cache on PATH and package lists present: the probe may ask apt about the headers."""
    monkeypatch.setattr(mod, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(mod.glob, "glob", lambda pattern: ["/var/lib/apt/lists/x_Packages"])


@pytest.mark.parametrize("installed", [True, False])
def test_kernel_headers_asks_apt_only_when_they_are_missing(monkeypatch, apt_lists, installed):
    calls = []

    def run(argv):
        calls.append(argv)
        return 0, "linux-headers-6.1.0-28-amd64:\n  Installed: (none)\n  Candidate: 6.1.119-1\n", ""

    monkeypatch.setattr(mod, "run", run)
    monkeypatch.setattr(mod.os.path, "isdir", lambda path: installed or "build" not in path)
    found = mod.kernel_headers("6.1.0-28-amd64", "Debian")
    assert found["installed"] is installed
    assert found["available"] is True
    assert found["package"] == "linux-headers-6.1.0-28-amd64"
    assert calls == ([] if installed else [["apt-cache", "policy", "linux-headers-6.1.0-28-amd64"]])


def test_kernel_headers_are_asked_of_apt_only_with_section_headers(monkeypatch, apt_lists):
    """install, status and the converged check do not use `available`: no apt-cache there."""
    calls = []
    monkeypatch.setattr(mod, "run", lambda argv: calls.append(argv) or (0, "", ""))
    monkeypatch.setattr(mod.os.path, "isdir", lambda path: False)
    found = mod.kernel_headers("6.18.44-fc", "Debian", ask=False)
    assert found["available"] is None and found["installed"] is False
    assert calls == []


def test_kernel_headers_missing_and_not_in_the_package_lists(monkeypatch, apt_lists):
    monkeypatch.setattr(mod, "run", lambda argv: (0, "N: Unable to locate package x\n", ""))
    monkeypatch.setattr(mod.os.path, "isdir", lambda path: False)
    assert mod.kernel_headers("6.18.44-fc", "Debian")["available"] is False


def test_k3s_template_check_reads_the_template_k3s_reads(tmp_path):
    """doctor's view of a k3s node's containerd templates (install refuses the same)."""
    generated = tmp_path / "config.toml"
    generated.write_text("version = 2\n")
    assert mod.k3s_template_check(str(generated), 2, "nvidia") == {
        "template": None,
        "error": "",
        "hint": "",
    }
    (tmp_path / "config.toml.tmpl").write_text(
        '{{ template "base" . }}\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]\n'
    )
    check = mod.k3s_template_check(str(generated), 2, "nvidia")
    assert check["template"] == str(tmp_path / "config.toml.tmpl")
    assert "table twice" in check["error"] and check["hint"]
