"""A real kubelet on a lab node, talking to that node's own containerd.

What a node gets (each step is idempotent; `join` can run again on a joined node):
- Debian's containerd, runc and containernetworking-plugins (CNI) from Debian's archive;
- a CNI `bridge` network of its own (10.244.<index>.0/24; no traffic between nodes is needed:
  the lab's pods talk to their node, and to the API server through the `kubernetes` Service,
  which the node's netfilter routes as kube-proxy would: `service_route`);
- the pause image: Kubernetes' own build/pause/linux/pause.c, compiled here (no registry is
  reachable; operand_images.pause_image), also named as the sandbox image the node's containerd
  asks for, so that containerd's configuration stays the user's;
- the kubelet built by components.py, with its own client certificate (CN=system:node:NAME,
  O=system:nodes: the Node authorizer and NodeRestriction apply), webhook authentication and
  authorization, the cgroupfs driver (Debian's containerd runs runc without SystemdCgroup), as
  a systemd unit.

The node's /var/lib/containerd is a podman volume (not the node's overlay root), so containerd's
default overlayfs snapshotter works as on a real machine.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import tempfile
import textwrap
import time
import urllib.parse
from pathlib import Path

from gpustack.errors import LabError
from gpustack.lab import components
from gpustack.lab.control_plane import SERVICE_IP, ControlPlane
from gpustack.lab.podman import run

POD_CIDR = "10.244.{index}.0/24"
POD_NETWORK = "10.244.0.0/16"  # every node's POD_CIDR
KUBELET_DIR = "/var/lib/kubelet"
CNI_BIN_DIRS = ("/opt/cni/bin", "/usr/lib/cni")  # containerd's default, Debian's package


def _exec(container: str, script: str, timeout: float = 600, check: bool = True):
    proc = run(
        ["podman", "exec", container, "bash", "-euo", "pipefail", "-c", script],
        check=False,
        timeout=timeout,
    )
    if check and proc.returncode != 0:
        out = (proc.stderr or proc.stdout).decode(errors="replace").strip().splitlines()
        raise LabError(
            f"on {container}: `{script.strip().splitlines()[0][:80]}` failed: "
            f"{out[-1] if out else proc.returncode}",
            f"inspect the node: podman exec -it {container} bash",
        )
    return proc


def _copy(container: str, source: Path, dest: str) -> None:
    run(["podman", "cp", str(source), f"{container}:{dest}"])


def kubelet_config(pod_cidr: str) -> dict:
    """The KubeletConfiguration (kubelet.config.k8s.io/v1beta1) of a lab node."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": "/etc/kubernetes/pki/ca.crt"},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
        # Debian's containerd runs runc with cgroupfs (SystemdCgroup unset); the kubelet must
        # use the same driver.
        "cgroupDriver": "cgroupfs",
        # Lab machines may boot cgroup v1 hierarchies; Kubernetes >= 1.35 refuses them unless
        # told otherwise (KEP-5573).
        "failCgroupV1": False,
        "failSwapOn": False,
        "podCIDR": pod_cidr,
        # static pods from where kubeadm's nodes keep them (`kubectl drain` skips their mirror pods)
        "staticPodPath": "/etc/kubernetes/manifests",
        "resolvConf": "/etc/resolv.conf",
        # The nodes share the build machine's disk and memory: no eviction by pressure or
        # image garbage collection in a throwaway lab.
        "evictionHard": {
            "memory.available": "0%",
            "nodefs.available": "0%",
            "nodefs.inodesFree": "0%",
            "imagefs.available": "0%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "4s",
        "syncFrequency": "10s",
        "shutdownGracePeriod": "0s",
    }


SERVICE_ROUTE = "/etc/kubernetes/gpustack-lab-service-route.sh"


def service_route(server: str) -> str:
    """A shell script that lets pods reach the API server through the `kubernetes` Service, as
    in-cluster clients do (KUBERNETES_SERVICE_HOST, SERVICE_IP:443): the lab runs no kube-proxy,
    so the node's netfilter does for that one Service what kube-proxy's iptables rules would
    (DNAT to the API server, for pods and the node itself, and masquerading of pod traffic to
    it, whose replies would otherwise not find the pod network). Idempotent (-C before -A); run
    before every kubelet start."""
    address = urllib.parse.urlsplit(server)
    api = f"{address.hostname}:{address.port or 443}"
    rules = [
        ("PREROUTING", f"-d {SERVICE_IP}/32 -p tcp --dport 443 -j DNAT --to-destination {api}"),
        ("OUTPUT", f"-d {SERVICE_IP}/32 -p tcp --dport 443 -j DNAT --to-destination {api}"),
        ("POSTROUTING", f"-s {POD_NETWORK} -d {address.hostname}/32 -p tcp "
                        f"--dport {address.port or 443} -j MASQUERADE"),
    ]  # fmt: skip
    return "set -e\n" + "".join(
        f"iptables -t nat -C {chain} {rule} 2>/dev/null || iptables -t nat -A {chain} {rule}\n"
        for chain, rule in rules
    )


def cni_config(pod_cidr: str) -> dict:
    return {
        "cniVersion": "1.0.0",
        "name": "gpustack-lab",
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": True,
                "ipMasq": False,  # pods reach their node, and the API server (service_route)
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": pod_cidr}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                },
            },
            {"type": "loopback"},
        ],
    }


UNIT = textwrap.dedent(
    """\
    [Unit]
    Description=kubelet (gpustack lab, Kubernetes {version})
    After=containerd.service
    Wants=containerd.service

    [Service]
    ExecStartPre=/bin/sh {route}
    ExecStart=/usr/local/bin/kubelet \\
      --config=/var/lib/kubelet/config.yaml \\
      --kubeconfig=/etc/kubernetes/kubelet.conf \\
      --hostname-override={node} \\
      --node-labels=gpustack.io/lab={lab} \\
      --v=1
    Restart=always
    RestartSec=2

    [Install]
    WantedBy=multi-user.target
    """
)


# podman's systemd mode on a cgroup v1 "hybrid" host stacks two name=systemd mounts on the
# node's /sys/fs/cgroup/systemd: the node's own cgroup (mount root /libpod_parent/libpod-ID)
# and, over it, the whole hierarchy (root /), which the node's systemd uses. runc (libcontainer/
# rootfs_linux.go getCgroupMounts, Debian's 1.1.5 and 1.1.15) binds a container's cgroup dirs
# from the FIRST mount of each hierarchy in mountinfo, so for name=systemd it computes a path
# outside every mount ("stat /sys/fs/kubepods/...: no such file or directory") and every pod
# container, which gets /sys/fs/cgroup mounted, fails to start. This unit leaves one mount there,
# the one systemd sees (root /): a lab-node repair, before containerd starts, a no-op elsewhere.
CGROUP_SCRIPT = textwrap.dedent(
    """\
    #!/bin/sh
    # gpustack lab: one name=systemd cgroup mount for runc (see gpustack/lab/kubelets.py)
    set -eu
    at=/sys/fs/cgroup/systemd
    mounts() { awk -v at="$at" '$5 == at' /proc/self/mountinfo | wc -l; }
    [ "$(mounts)" -gt 1 ] || exit 0
    keep=/run/gpustack-lab-cgroup
    mkdir -p "$keep"
    mount --bind "$at" "$keep"
    while [ "$(mounts)" -gt 0 ]; do umount -l "$at"; done
    mount --bind "$keep" "$at"
    umount -l "$keep"
    """
)
CGROUP_UNIT = textwrap.dedent(
    """\
    [Unit]
    Description=One name=systemd cgroup mount for runc (gpustack lab, cgroup v1 hosts)
    DefaultDependencies=no
    After=local-fs.target
    Before=containerd.service kubelet.service

    [Service]
    Type=oneshot
    RemainAfterExit=yes
    ExecStart=/usr/local/sbin/gpustack-lab-cgroup

    [Install]
    WantedBy=multi-user.target
    """
)


def single_systemd_cgroup_mount(container: str) -> None:
    """CGROUP_SCRIPT as a oneshot unit (CGROUP_UNIT), installed, enabled and run on the node."""
    with tempfile.TemporaryDirectory(prefix="gpustack-kubelet-") as tmp:
        script, unit = Path(tmp) / "gpustack-lab-cgroup", Path(tmp) / "gpustack-lab-cgroup.service"
        script.write_text(CGROUP_SCRIPT)
        unit.write_text(CGROUP_UNIT)
        _copy(container, script, "/usr/local/sbin/gpustack-lab-cgroup")
        _copy(container, unit, "/etc/systemd/system/gpustack-lab-cgroup.service")
    _exec(
        container,
        "chmod 755 /usr/local/sbin/gpustack-lab-cgroup && systemctl daemon-reload && "
        "systemctl enable --now -q gpustack-lab-cgroup",
    )


def ensure_packages(container: str) -> None:
    """containerd, runc and the CNI plugins from Debian's archive (the node's user runtime)."""
    _exec(
        container,
        "dpkg-query -W containerd runc containernetworking-plugins iptables >/dev/null 2>&1 || "
        "{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
        "--no-install-recommends containerd runc containernetworking-plugins iptables "
        ">/dev/null; }\n"
        # containerd's CRI looks for plugins in /opt/cni/bin; Debian installs /usr/lib/cni.
        "[ -e /opt/cni/bin/bridge ] || "
        "{ mkdir -p /opt/cni && ln -sfn /usr/lib/cni /opt/cni/bin; }\n"
        "systemctl enable --now containerd >/dev/null 2>&1\n"
        # The kubelet's volumes need mount propagation inside the node (kind does the same).
        "mount --make-rshared /",
    )


def _cri_table(major: int) -> tuple[str, ...]:
    """Where the CRI's runtime settings live in the node's containerd configuration."""
    if major >= 2:
        return ("plugins", "io.containerd.cri.v1.runtime")
    return ("plugins", "io.containerd.grpc.v1.cri")


def restrict_oom_score_adj(container: str) -> bool:
    """Set the CRI's `restrict_oom_score_adj` in the node's config.toml (merged with tomlkit,
    the rest kept); returns whether it changed.

    A pod sandbox asks for oom_score_adj -998 and runc writes it before the pause process
    starts; lowering it needs CAP_SYS_RESOURCE, which containers on this kind of build machine
    lack (podman's --ulimit workaround in nodes.py has the same cause). runc then fails with
    "can't get final child's PID from pipe: EOF". containerd's own switch for such hosts (made
    for rootless and user-namespaced nodes) keeps the score no lower than containerd's.
    """
    import tomlkit

    major = _containerd_major(container)
    path = "/etc/containerd/config.toml"
    current = _exec(container, f"cat {path} 2>/dev/null || true").stdout.decode()
    doc = tomlkit.parse(current) if current.strip() else tomlkit.document()
    if "version" not in doc:
        doc["version"] = 3 if major >= 2 else 2
    table = doc
    for key in _cri_table(major):
        if key not in table:
            table[key] = tomlkit.table(is_super_table=True)
        table = table[key]
    if table.get("restrict_oom_score_adj") is True:
        return False
    table["restrict_oom_score_adj"] = True
    _exec(
        container,
        f"mkdir -p /etc/containerd && cat > {path} <<'EOF'\n{tomlkit.dumps(doc)}EOF\n"
        "systemctl restart containerd",
    )
    return True


def sandbox_image(container: str) -> str:
    """The pause image the node's containerd starts pods with (its CRI configuration)."""
    proc = _exec(
        container,
        "f=/etc/containerd/config.toml; [ -e $f ] || f=/dev/null; "
        "containerd --config $f config dump",
    )
    text = proc.stdout.decode()
    for line in text.splitlines():
        key, _, value = line.strip().partition("=")
        if key.strip() == "sandbox_image" or key.strip() == "sandbox":
            return value.strip().strip("'\"")
    raise LabError(
        f"{container}: containerd's configuration names no sandbox image",
        "check `containerd config dump` on the node",
    )


def import_image(container: str, archive: Path, name: str | None = None) -> None:
    """Import an image archive into the node's containerd (namespace k8s.io, the CRI's)."""
    _copy(container, archive, f"/tmp/{archive.name}")
    local = "--local" if _containerd_major(container) >= 2 else ""
    _exec(
        container,
        f"ctr -n k8s.io images import {local} --all-platforms /tmp/{archive.name} >/dev/null\n"
        f"rm -f /tmp/{archive.name}",
    )
    if name:
        _exec(container, f"ctr -n k8s.io images ls -q | grep -xF {shlex.quote(name)} >/dev/null")


def _containerd_major(container: str) -> int:
    proc = _exec(container, "containerd --version")
    version = proc.stdout.decode().split()
    for word in version:
        if word[:1].lstrip("v").isdigit() and "." in word:
            return int(word.lstrip("v").split(".")[0])
    return 1


def join(
    cp: ControlPlane,
    container: str,
    node: str,
    index: int,
    lab: str,
    server: str,
    pause_archive: Path,
    pause_ref: str,
) -> None:
    """Make the lab node `container` a Kubernetes node named `node`."""
    bins = components.ensure(("kubernetes",))["kubernetes"]
    ensure_packages(container)
    single_systemd_cgroup_mount(container)
    restrict_oom_score_adj(container)
    pause = sandbox_image(container)
    _import_pause(container, pause_archive, pause_ref, pause)
    pod_cidr = POD_CIDR.format(index=index)
    with tempfile.TemporaryDirectory(prefix="gpustack-kubelet-") as tmp:
        work = Path(tmp)
        cp.node_kubeconfig(work / "kubelet.conf", node, server)
        (work / "config.yaml").write_text(json.dumps(kubelet_config(pod_cidr), indent=2))
        (work / "10-gpustack-lab.conflist").write_text(json.dumps(cni_config(pod_cidr), indent=2))
        (work / "kubelet.service").write_text(
            UNIT.format(
                version=components.KUBERNETES_VERSION, node=node, lab=lab, route=SERVICE_ROUTE
            )
        )
        (work / "service-route.sh").write_text(service_route(server))
        _exec(
            container,
            f"mkdir -p /etc/kubernetes/pki /etc/kubernetes/manifests {KUBELET_DIR} /etc/cni/net.d",
        )
        _copy(container, cp.pki.ca_cert, "/etc/kubernetes/pki/ca.crt")
        _copy(container, work / "kubelet.conf", "/etc/kubernetes/kubelet.conf")
        _copy(container, work / "config.yaml", f"{KUBELET_DIR}/config.yaml")
        _copy(container, work / "10-gpustack-lab.conflist", "/etc/cni/net.d/")
        _copy(container, work / "kubelet.service", "/etc/systemd/system/kubelet.service")
        _copy(container, work / "service-route.sh", SERVICE_ROUTE)
    installed = (
        _exec(
            container, "sha256sum /usr/local/bin/kubelet 2>/dev/null | cut -d' ' -f1", check=False
        )
        .stdout.decode()
        .strip()
    )
    wanted = subprocess.run(
        ["sha256sum", str(bins / "kubelet")], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    if installed != wanted:
        _copy(container, bins / "kubelet", "/usr/local/bin/kubelet")
    _exec(
        container,
        "chmod 600 /etc/kubernetes/kubelet.conf && systemctl daemon-reload && "
        "systemctl enable kubelet >/dev/null 2>&1 && systemctl restart kubelet",
    )


def _import_pause(container: str, archive: Path, source_ref: str, name: str) -> None:
    listed = _exec(container, "ctr -n k8s.io images ls -q", check=False).stdout.decode().split()
    if name in listed:
        return
    import_image(container, archive)
    if name != source_ref:
        # The node's containerd asks for another pause tag than the pinned release's: give the
        # image that name too, without touching containerd's configuration.
        _exec(
            container,
            f"ctr -n k8s.io images tag --force {shlex.quote(source_ref)} {shlex.quote(name)}"
            " >/dev/null",
        )


def wait_ready(cp: ControlPlane, nodes: list[str], timeout: float = 180) -> None:
    """Wait until every node is registered and Ready (the kubelet, CNI and containerd up)."""
    deadline = time.monotonic() + timeout
    pending = set(nodes)
    last: dict[str, str] = {}
    while time.monotonic() < deadline and pending:
        for item in cp.get("/api/v1/nodes").get("items", []):
            name = item["metadata"]["name"]
            conditions = (item.get("status") or {}).get("conditions") or []
            ready = [c for c in conditions if c.get("type") == "Ready"]
            if ready and ready[0].get("status") == "True":
                pending.discard(name)
            elif ready:
                last[name] = f"{ready[0].get('reason')}: {ready[0].get('message')}"
        if pending:
            time.sleep(1)
    if pending:
        why = "; ".join(f"{n}: {last.get(n, 'not registered')}" for n in sorted(pending))
        raise LabError(
            f"nodes not Ready within {timeout:.0f} s: {why}",
            "podman exec NODE journalctl -u kubelet shows the kubelet's log",
        )
