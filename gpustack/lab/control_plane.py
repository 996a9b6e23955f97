"""A real Kubernetes control plane as processes on this machine: etcd, kube-apiserver,
kube-controller-manager and kube-scheduler, built by components.py.

The API server runs with client-certificate authentication, `--authorization-mode=Node,RBAC`,
its default admission plugins (PodSecurity, Priority, ResourceQuota, ServiceAccount, RuntimeClass
and the rest of the default set) plus NodeRestriction. Every component gets its own certificate
(pki.py), so RBAC applies to each as in a kubeadm cluster.

Two users: the test suites start one per run (`ControlPlane(...).start()`, stopped at the end,
like controller-runtime's envtest), and `gpustack lab up --kubernetes` starts one that outlives
the command (`detach=True`: own session, pid file, logs in the lab's directory) and serves the
lab's kubelets.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpustack.errors import LabError
from gpustack.lab import components
from gpustack.lab.pki import Pki, kubeconfig

SERVICE_CIDR = "10.96.0.0/16"
SERVICE_IP = "10.96.0.1"  # the `kubernetes` Service's ClusterIP, in the serving certificate
# The admin's requests (tests and tools use the admin kubeconfig), at Metadata level: who,
# which verb, which URI, which user agent; the components' own requests are not logged. The
# admin's patches of Node objects are logged with their body (`requestObject`): tests read
# which labels a patch set.
AUDIT_POLICY = """\
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Request
  users: [kubernetes-admin]
  verbs: [patch]
  resources: [{group: "", resources: [nodes]}]
- level: Metadata
  users: [kubernetes-admin]
- level: None
"""
ORDER = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def with_flags(command: list[str], flags: tuple[str, ...]) -> list[str]:
    """`command` with `flags` (`--name=value`): a flag of a name `command` has replaces it there,
    the others are appended in their order."""
    command = list(command)
    for flag in flags:
        name = flag.split("=", 1)[0] + "="
        at = next((i for i, arg in enumerate(command) if arg.startswith(name)), None)
        if at is None:
            command.append(flag)
        else:
            command[at] = flag
    return command


@dataclass
class ControlPlane:
    root: Path  # pki/, etcd/, logs/, *.kubeconfig, state.json
    address: str = "127.0.0.1"  # where the API server listens and what kubeconfigs name
    extra_ips: tuple[str, ...] = ()  # more IPs for the serving certificate
    detach: bool = False  # processes outlive this Python process
    with_controllers: bool = True  # kube-controller-manager and kube-scheduler too
    audit: bool = False  # the API server writes an audit log of the admin's requests
    # More flags (`--name=value`) for kube-apiserver and kube-scheduler: one naming a flag the
    # command line already has replaces it, the others are appended
    # (`--runtime-config=GROUP/VERSION=false` serves a cluster without that API version).
    apiserver_args: tuple[str, ...] = ()
    scheduler_args: tuple[str, ...] = ()
    _procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    # ---- layout -------------------------------------------------------------------------
    @property
    def state_file(self) -> Path:
        return self.root / "state.json"

    def _state(self) -> dict:
        try:
            return json.loads(self.state_file.read_text())
        except (OSError, ValueError):
            return {}

    def _save_state(self, state: dict) -> None:
        self.state_file.write_text(json.dumps(state, indent=2) + "\n")

    @property
    def admin_kubeconfig(self) -> Path:
        return self.root / "admin.kubeconfig"

    @property
    def server(self) -> str:
        return f"https://{self.address}:{self._state()['ports']['apiserver']}"

    @property
    def audit_log(self) -> Path:
        """One JSON event per line, for each request the admin made (`audit=True`)."""
        return self.root / "logs" / "audit.log"

    @property
    def pki(self) -> Pki:
        return Pki(self.root / "pki")

    # ---- set-up ---------------------------------------------------------------------------
    def _prepare(self) -> dict:
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        state = self._state()
        if not state.get("ports"):
            state["ports"] = {
                "apiserver": free_port(),
                "etcd": free_port(),
                "etcd_peer": free_port(),
            }
            self._save_state(state)
        pki = self.pki
        ips = tuple(dict.fromkeys(("127.0.0.1", SERVICE_IP, self.address, *self.extra_ips)))
        pki.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            client=False,
            dns=(
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ),
            ips=ips,
        )
        pki.issue("apiserver-kubelet-client", "kube-apiserver-kubelet-client", ("system:masters",))
        pki.service_account_keys()
        server = f"https://{self.address}:{state['ports']['apiserver']}"
        for name, cn, orgs in (
            ("admin", "kubernetes-admin", ("system:masters",)),
            ("controller-manager", "system:kube-controller-manager", ()),
            ("scheduler", "system:kube-scheduler", ()),
        ):
            crt, key = pki.issue(name, cn, orgs)
            kubeconfig(self.root / f"{name}.kubeconfig", server, pki.ca_cert, crt, key, cn)
        return state

    def user_kubeconfig(self, path: Path, user: str, groups: tuple[str, ...] = ()) -> Path:
        """A kubeconfig for a user authenticated by a client certificate (CN=user, O=groups)."""
        crt, key = self.pki.issue(f"user-{user}", user, groups)
        return kubeconfig(path, self.server, self.pki.ca_cert, crt, key, user)

    def node_kubeconfig(self, path: Path, node: str, server: str | None = None) -> Path:
        """A kubelet's kubeconfig: CN=system:node:NODE, O=system:nodes (Node authorizer and
        NodeRestriction apply to it)."""
        crt, key = self.pki.issue(f"node-{node}", f"system:node:{node}", ("system:nodes",))
        return kubeconfig(
            path, server or self.server, self.pki.ca_cert, crt, key, f"system:node:{node}"
        )

    def _commands(self, state: dict, bins: dict[str, Path]) -> dict[str, list[str]]:
        p, r, k8s = state["ports"], self.root, bins["kubernetes"]
        pki = r / "pki"
        etcd_url = f"http://127.0.0.1:{p['etcd']}"
        peer_url = f"http://127.0.0.1:{p['etcd_peer']}"
        cmds = {
            "etcd": [
                str(bins["etcd"] / "etcd"),
                "--name=lab",
                f"--data-dir={r / 'etcd'}",
                f"--listen-client-urls={etcd_url}",
                f"--advertise-client-urls={etcd_url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=lab={peer_url}",
                "--unsafe-no-fsync",  # a throwaway cluster: speed over durability
                "--log-level=warn",
            ],
            "kube-apiserver": [
                str(k8s / "kube-apiserver"),
                f"--etcd-servers={etcd_url}",
                f"--bind-address={self.address}",
                f"--advertise-address={self.address}",
                f"--secure-port={p['apiserver']}",
                f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}",
                f"--client-ca-file={pki / 'ca.crt'}",
                "--authorization-mode=Node,RBAC",
                # The default admission plugins stay on (PodSecurity, Priority, ResourceQuota,
                # ServiceAccount, RuntimeClass, ...); NodeRestriction is added as kubeadm does.
                "--enable-admission-plugins=NodeRestriction",
                "--allow-privileged=true",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                # The lab has no Service network on the nodes (no kube-proxy): the
                # `kubernetes` Service's endpoints are not reconciled.
                "--endpoint-reconciler-type=none",
                "--profiling=false",
                "--v=1",
            ],
            "kube-controller-manager": [
                str(k8s / "kube-controller-manager"),
                f"--kubeconfig={r / 'controller-manager.kubeconfig'}",
                f"--authentication-kubeconfig={r / 'controller-manager.kubeconfig'}",
                f"--authorization-kubeconfig={r / 'controller-manager.kubeconfig'}",
                "--secure-port=0",
                "--leader-elect=false",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--root-ca-file={pki / 'ca.crt'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}",
                f"--cluster-signing-key-file={pki / 'ca.key'}",
                "--profiling=false",
                "--v=1",
            ],
            "kube-scheduler": [
                str(k8s / "kube-scheduler"),
                f"--kubeconfig={r / 'scheduler.kubeconfig'}",
                f"--authentication-kubeconfig={r / 'scheduler.kubeconfig'}",
                f"--authorization-kubeconfig={r / 'scheduler.kubeconfig'}",
                "--secure-port=0",
                "--leader-elect=false",
                "--profiling=false",
                "--v=1",
            ],
        }
        if self.audit:
            policy = r / "audit-policy.yaml"
            policy.write_text(AUDIT_POLICY)
            cmds["kube-apiserver"] += [
                f"--audit-policy-file={policy}",
                f"--audit-log-path={self.audit_log}",
                "--audit-log-mode=blocking",
            ]
        cmds["kube-apiserver"] = with_flags(cmds["kube-apiserver"], self.apiserver_args)
        cmds["kube-scheduler"] = with_flags(cmds["kube-scheduler"], self.scheduler_args)
        if not self.with_controllers:
            del cmds["kube-controller-manager"], cmds["kube-scheduler"]
        return cmds

    # ---- processes ------------------------------------------------------------------------
    def _alive(self, pid: int, binary: str) -> bool:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
        except OSError:
            return False
        return cmdline.decode(errors="replace").endswith("/" + binary)

    def running(self) -> dict[str, int]:
        """The components of this control plane that run now: name -> pid."""
        pids = self._state().get("pids", {})
        return {name: pid for name, pid in pids.items() if self._alive(pid, name)}

    def start(self, log: Callable[[str], None] = lambda _: None, timeout: float = 120) -> Path:
        """Start what is not running; wait for /readyz; return the admin kubeconfig."""
        bins = components.ensure(("kubernetes", "etcd"), log)
        state = self._prepare()
        running = self.running()
        pids = dict(running)
        for name, cmd in self._commands(state, bins).items():
            if name in running:
                continue
            logfile = open(self.root / "logs" / f"{name}.log", "ab")  # noqa: SIM115 (kept open by the child)
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=logfile,
                stderr=subprocess.STDOUT,
                start_new_session=self.detach,
            )
            logfile.close()
            self._procs[name] = proc
            pids[name] = proc.pid
            state["pids"] = pids  # recorded at once: stop() ends what a failed start left
            self._save_state(state)
            if name == "etcd":
                self._wait_port(state["ports"]["etcd"], "etcd", timeout)
            if name == "kube-apiserver":
                self._wait_ready(timeout)
        state["pids"] = pids
        self._save_state(state)
        self._wait_ready(timeout)
        return self.admin_kubeconfig

    def _fail(self, what: str) -> LabError:
        name = "kube-apiserver" if "API" in what else "etcd"
        logfile = self.root / "logs" / f"{name}.log"
        tail = ""
        with contextlib.suppress(OSError):
            tail = "\n".join(logfile.read_text(errors="replace").splitlines()[-10:])
        return LabError(f"{what}\n{tail}".rstrip(), f"see {logfile}")

    def _wait_port(self, port: int, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                return
            self._check_exited()
            time.sleep(0.1)
        raise self._fail(f"{what} did not listen on 127.0.0.1:{port} within {timeout:.0f} s")

    def _check_exited(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                raise self._fail_component(name, proc.returncode)

    def _fail_component(self, name: str, code: int) -> LabError:
        logfile = self.root / "logs" / f"{name}.log"
        tail = ""
        with contextlib.suppress(OSError):
            tail = "\n".join(logfile.read_text(errors="replace").splitlines()[-10:])
        return LabError(f"{name} exited with {code}:\n{tail}", f"see {logfile}")

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.root / "pki" / "ca.crt"))
        ctx.load_cert_chain(self.root / "pki" / "admin.crt", self.root / "pki" / "admin.key")
        return ctx

    def get(self, path: str) -> dict:
        """GET `path` from the API server as the admin (lab bring-up only; gpustack's own
        calls go through gpustack.k8s.cluster)."""
        with urllib.request.urlopen(
            f"{self.server}{path}", context=self._ssl_context(), timeout=10
        ) as response:
            return json.loads(response.read())

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        ctx = self._ssl_context()
        last = ""
        while time.monotonic() < deadline:
            try:
                with urllib.request.urlopen(f"{self.server}/readyz", context=ctx, timeout=2) as r:
                    if r.status == 200:
                        return
            except urllib.error.HTTPError as exc:
                last = f"/readyz answered {exc.code}"
            except OSError as exc:
                last = str(exc)
            self._check_exited()
            time.sleep(0.2)
        raise self._fail(f"the API server was not ready within {timeout:.0f} s ({last})")

    def stop(self, timeout: float = 15) -> None:
        """Stop every component (ours or a detached earlier run's), in reverse order."""
        running = self.running()
        for name in reversed(ORDER):
            pid = running.get(name)
            if pid is None:
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            while self._alive(pid, name) and time.monotonic() < deadline:
                proc = self._procs.get(name)
                if proc is not None and proc.poll() is not None:
                    break
                time.sleep(0.1)
            if self._alive(pid, name):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc = self._procs.pop(name, None)
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        state = self._state()
        if state:
            state["pids"] = {}
            self._save_state(state)
