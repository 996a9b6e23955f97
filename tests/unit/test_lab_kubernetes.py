"""The lab's Kubernetes pieces that need no cluster: pins, the wrapper module's replaces, the
certificates' subjects, the kubelet and CNI configuration."""

from __future__ import annotations

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from gpustack.errors import LabError
from gpustack.lab import components, kubelets
from gpustack.lab.control_plane import ControlPlane
from gpustack.lab.pki import Pki, kubeconfig

GOMOD = """module k8s.io/kubernetes

go 1.26.0

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tk8s.io/kube-openapi => k8s.io/kube-openapi v0.0.0-2025
)
"""


def test_staging_modules_map_to_their_published_release():
    lines = components._kubernetes_replaces(GOMOD)
    minor_patch = components.KUBERNETES_VERSION.split(".", 1)[1]
    assert lines == [
        f"replace k8s.io/api => k8s.io/api v0.{minor_patch}",
        f"replace k8s.io/client-go => k8s.io/client-go v0.{minor_patch}",
    ]


def test_a_go_mod_without_staging_modules_is_refused():
    with pytest.raises(LabError, match="names no staging module"):
        components._kubernetes_replaces("module k8s.io/kubernetes\n")


def test_versions_are_pinned_once_and_the_cache_is_keyed_by_them(monkeypatch, tmp_path):
    monkeypatch.setenv(components.CACHE_ENV, str(tmp_path))
    assert components.KUBERNETES.version == components.KUBERNETES_VERSION
    where = components.component_dir(components.ETCD, "go1.26.8")
    assert where == tmp_path / f"etcd-{components.ETCD_VERSION}-go1.26.8"
    assert components.cached(components.ETCD, "go1.26.8") is None
    (where / "bin").mkdir(parents=True)
    (where / "bin" / "etcd").write_text("")
    assert components.cached(components.ETCD, "go1.26.8") is None  # no build.json: unfinished
    (where / "build.json").write_text("{}")
    assert components.cached(components.ETCD, "go1.26.8") == where / "bin"
    kwok = components.component_dir(components.KWOK, "go1.26.8")
    (kwok / "bin").mkdir(parents=True)
    (kwok / "bin" / "kwok").write_text("")
    (kwok / "build.json").write_text("{}")
    assert components.cached(components.KWOK, "go1.26.8") is None  # its stage files missing


def test_a_shared_file_added_later_is_copied_from_the_module_without_a_rebuild(
    monkeypatch, tmp_path
):
    monkeypatch.setenv(components.CACHE_ENV, str(tmp_path / "cache"))
    monkeypatch.setattr(components, "go_version", lambda: "go1.26.8")
    module = tmp_path / "module"
    for name in components.KWOK.share:
        (module / name).parent.mkdir(parents=True, exist_ok=True)
        (module / name).write_text(name)
    kwok = components.component_dir(components.KWOK, "go1.26.8")
    (kwok / "bin").mkdir(parents=True)
    (kwok / "bin" / "kwok").write_text("built before")
    (kwok / "build.json").write_text("{}")
    downloads = []

    def module_info(mod, version, cwd, env):
        downloads.append((mod, version))
        return {"Dir": str(module), "GoMod": str(module / "go.mod")}

    def no_go(*args, **kwargs):
        raise AssertionError("rebuilt")

    monkeypatch.setattr(components, "_module_info", module_info)
    monkeypatch.setattr(components, "_go", no_go)
    assert components.build(components.KWOK) == kwok / "bin"
    assert downloads == [(components.KWOK.module, components.KWOK.version)]
    assert (kwok / "bin" / "kwok").read_text() == "built before"
    assert components.cached(components.KWOK, "go1.26.8") == kwok / "bin"


def test_version_ldflags_name_the_pinned_release():
    flags = " ".join(components.KUBERNETES.ldflags)
    assert f"gitVersion=v{components.KUBERNETES_VERSION}" in flags
    assert "gitMajor=1" in flags


def test_certificates_carry_the_subjects_kubernetes_authorizes(tmp_path):
    pki = Pki(tmp_path)
    crt, key = pki.issue("node-a", "system:node:a", ("system:nodes",))
    cert = x509.load_pem_x509_certificate(crt.read_bytes())
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "system:node:a"
    assert cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value == (
        "system:nodes"
    )
    assert cert.issuer == x509.load_pem_x509_certificate(pki.ca_cert.read_bytes()).subject
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    again, _ = Pki(tmp_path).issue("node-a", "system:node:a", ("system:nodes",))
    assert again.read_bytes() == crt.read_bytes()  # kept, not reissued
    path = kubeconfig(tmp_path / "k", "https://10.0.0.1:6443", pki.ca_cert, crt, key, "u")
    assert "https://10.0.0.1:6443" in path.read_text()


def test_kubelet_and_cni_configuration():
    config = kubelets.kubelet_config("10.244.3.0/24")
    assert config["kind"] == "KubeletConfiguration"
    assert config["authentication"]["anonymous"]["enabled"] is False
    assert config["authorization"]["mode"] == "Webhook"
    assert config["cgroupDriver"] == "cgroupfs" and config["failCgroupV1"] is False
    assert config["staticPodPath"] == "/etc/kubernetes/manifests"
    cni = kubelets.cni_config("10.244.3.0/24")
    assert cni["plugins"][0]["ipam"]["ranges"] == [[{"subnet": "10.244.3.0/24"}]]
    assert cni["plugins"][0]["ipMasq"] is False


def test_pods_reach_the_api_server_through_the_kubernetes_service():
    """No kube-proxy in the lab: the node's netfilter sends the `kubernetes` Service's
    ClusterIP:443 to the API server (pods and the node), masquerading pod traffic to it only;
    each rule is checked before it is added, and the kubelet's unit runs the script first."""
    script = kubelets.service_route("https://10.88.0.1:39303")
    dnat = "-d 10.96.0.1/32 -p tcp --dport 443 -j DNAT --to-destination 10.88.0.1:39303"
    masq = "-s 10.244.0.0/16 -d 10.88.0.1/32 -p tcp --dport 39303 -j MASQUERADE"
    for chain, rule in (("PREROUTING", dnat), ("OUTPUT", dnat), ("POSTROUTING", masq)):
        line = f"iptables -t nat -C {chain} {rule} 2>/dev/null || iptables -t nat -A {chain} {rule}"
        assert line in script.splitlines(), script
    unit = kubelets.UNIT.format(version="1", node="n", lab="l", route=kubelets.SERVICE_ROUTE)
    assert f"ExecStartPre=/bin/sh {kubelets.SERVICE_ROUTE}" in unit


def test_prometheus_operators_crds_are_generated_once_and_then_read_from_the_cache(
    monkeypatch, tmp_path
):
    monkeypatch.setenv(components.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(components, "build", lambda component, log=None: tmp_path / "bin")
    target = tmp_path / (
        f"prometheus-operator-crds-{components.PROMETHEUS_OPERATOR_APIS_VERSION}"
        f"-controller-gen-{components.CONTROLLER_TOOLS_VERSION}"
    )
    target.mkdir()
    (target / "monitoring.coreos.com_servicemonitors.yaml").write_text(
        "kind: CustomResourceDefinition\n"
    )

    def no_go(*args, **kwargs):
        raise AssertionError("generated again")

    monkeypatch.setattr(components, "_go", no_go)
    assert components.prometheus_operator_crds() == target


def test_a_control_planes_extra_flags_replace_theirs_or_are_appended(tmp_path):
    state = {"ports": {"apiserver": 6443, "etcd": 2379, "etcd_peer": 2380}}
    bins = {"kubernetes": tmp_path, "etcd": tmp_path}
    default = ControlPlane(tmp_path)._commands(state, bins)
    changed = ControlPlane(
        tmp_path,
        apiserver_args=("--runtime-config=resource.k8s.io/v1=false", "--authorization-mode=RBAC"),
        scheduler_args=("--emulated-version=1.33",),
    )._commands(state, bins)
    assert "--authorization-mode=Node,RBAC" in default["kube-apiserver"]
    assert not [a for a in default["kube-apiserver"] if a.startswith("--runtime-config")]
    api = changed["kube-apiserver"]
    assert [a for a in api if a.startswith("--authorization-mode=")] == [
        "--authorization-mode=RBAC"
    ]
    assert api.index("--authorization-mode=RBAC") == default["kube-apiserver"].index(
        "--authorization-mode=Node,RBAC"
    )
    assert api[-1] == "--runtime-config=resource.k8s.io/v1=false"
    assert api[:-1] == [
        "--authorization-mode=RBAC" if a == "--authorization-mode=Node,RBAC" else a
        for a in default["kube-apiserver"]
    ]
    assert changed["kube-scheduler"] == [*default["kube-scheduler"], "--emulated-version=1.33"]
    assert changed["kube-controller-manager"] == default["kube-controller-manager"]
    assert changed["etcd"] == default["etcd"]
