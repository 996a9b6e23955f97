"""Toolkit and merge-safe containerd wiring on real containerd 1.6 (Debian 12), 1.7 (Debian 13)
and 2.1 (forky), with the toolkit packages of tests/fixtures/lab_fixtures.py: NVIDIA's
nvidia-container-runtime, nvidia-ctk and hooks built from their Go module (version
1.20.2-1~gpustackbuilt, the newest there), and the stand-in versions for the pin and upgrade path.

For every starting configuration of the corpus: every key/value of `containerd config dump`
before the install is unchanged after it (only `imports` and the nvidia runtime are added),
the nvidia runtime carries runc's options, containerd runs, a container starts through
NVIDIA's real /usr/bin/nvidia-container-runtime (which, asked for no GPU, passes the container
to runc unchanged), a second run changes nothing, and uninstall returns the dump and the file to
what they were.
"""

from __future__ import annotations

import json
import os
import tomllib

import pytest

from tests.conftest import ROOT, lab_nodes, run_cli
from tests.fixtures import k3s_templates, lab_fixtures
from tests.lab.test_lab import ssh
from tests.unit.test_driver_filters import load

pytestmark = pytest.mark.lab

LAB = f"rt{os.getpid()}"
NODES = {f"{LAB}-node1": "1.6", f"{LAB}-node2": "1.7", f"{LAB}-node3": "2.1"}
BIN = "/usr/bin/nvidia-container-runtime"
cr = load("plugins/filter/container_runtime.py", "cr_lab")

DISTRO = """version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "/etc/cni/net.d"
  [plugins."io.containerd.internal.v1.opt"]
    path = "/var/lib/containerd/opt"
"""
KUBEADM = """version = 2
# kubeadm-style
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:3.9"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = true
"""
REGISTRY = """version = 2
[plugins."io.containerd.grpc.v1.cri".registry.mirrors."docker.io"]
  endpoint = ["https://mirror.example.com", "https://registry-1.docker.io"]
[plugins."io.containerd.grpc.v1.cri".registry.configs."registry.example.com".auth]
  username = "robot"
  password = "s3cret"
"""
IMPORTS = """version = 2
imports = ["/etc/containerd/extra.toml"]
[plugins."io.containerd.grpc.v1.cri"]
  max_concurrent_downloads = 7
"""
EXTRA = """version = 2
[plugins."io.containerd.gc.v1.scheduler"]
  pause_threshold = 0.05
"""
GPU_OPERATOR = """version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "nvidia"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
    runtime_type = "io.containerd.runc.v2"
    privileged_without_host_devices = false
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
      BinaryName = "/usr/local/nvidia/toolkit/nvidia-container-runtime"
"""
V1 = """[plugins.cri]
  sandbox_image = "registry.k8s.io/pause:3.8"
  [plugins.cri.containerd.runtimes.runc.options]
    SystemdCgroup = true
"""
V3 = """version = 3
[plugins.'io.containerd.cri.v1.images'.pinned_images]
  sandbox = "registry.k8s.io/pause:3.10"
[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
  SystemdCgroup = true
"""
CORPUS = {
    "distro-default": DISTRO,
    "kubeadm": KUBEADM,
    "registry-mirrors-auth": REGISTRY,
    "existing-imports": IMPORTS,
    "gpu-operator-leftover": GPU_OPERATOR,
    "no-config-file": None,
    "version-specific": "per-node",  # v1 on containerd 1.x, v3 on 2.1
}
ONLY_RUNTIME = ("--skip-tags", "nvidia_driver")
# The corpus is about containerd's configuration: the toolkit, installed once by the fixture
# (and proven by the toolkit tests below), is left out of its runs.
WIRING_ONLY = ("--skip-tags", "nvidia_driver,nvidia_container_toolkit")


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    inventory = tmp_path_factory.mktemp("rt") / "rt.ini"
    with lab_nodes(LAB, 3, inventory, "debian12,debian13,forky"):
        containers = [f"gpustack-{node}" for node in NODES]
        varsfile = lab_fixtures.prepare(containers, inventory.with_suffix(".vars.json"))
        proc = run_cli("install", str(inventory), "--tags", "nvidia_container_toolkit",
                           "-e", f"@{varsfile}")  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        for node in NODES:  # the newest in the lab's repository: NVIDIA's runtime built here
            version = ssh(inventory, node, "dpkg-query -W -f '${Version}' nvidia-container-toolkit")
            assert version.stdout == lab_fixtures.BUILT_VERSION, version.stdout
            runtime = ssh(inventory, node, f"{BIN} --version").stdout
            assert runtime.startswith("NVIDIA Container Runtime version 1.20.2"), runtime
        yield inventory, varsfile


def start_from(inventory, node, text):
    """Put a starting configuration in place and restart containerd on it."""
    if text == "per-node":
        text = V3 if NODES[node] == "2.1" else V1
    write = ("rm -f /etc/containerd/config.toml" if text is None
             else f"cat > /etc/containerd/config.toml <<'EOF'\n{text}EOF\n")  # fmt: skip
    proc = ssh(inventory, node, "rm -rf /etc/containerd/conf.d /var/lib/gpustack/container_runtime.json "
                                "/var/lib/gpustack/containerd-config.toml.orig; "
                                f"cat > /etc/containerd/extra.toml <<'EOF'\n{EXTRA}EOF\n{write}")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (
        ssh(inventory, node, "systemctl restart containerd && ctr version >/dev/null").returncode
        == 0
    )
    return text


def dump(inventory, node):
    proc = ssh(inventory, node, "f=/etc/containerd/config.toml; [ -e $f ] || f=/dev/null; "
                                "containerd --config $f config dump")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = tomllib.loads(proc.stdout)
    data["imports"] = sorted(data.get("imports", []))  # containerd prints them in map order
    return data


def config_text(inventory, node):
    proc = ssh(inventory, node, "cat /etc/containerd/config.toml")
    return proc.stdout if proc.returncode == 0 else None


def install(inventory, varsfile, *args, only=ONLY_RUNTIME):
    proc = run_cli(
        "install", str(inventory), *only, "-e", f"@{varsfile}", *args, "--output", "json"
    )
    return proc.returncode, json.loads(proc.stdout)


def runtimes_of(flat_dump):
    key = next(k for k in flat_dump if ".containerd.runtimes." in k)
    return key.split(".containerd.runtimes.")[0] + ".containerd.runtimes."


@pytest.mark.parametrize("case", list(CORPUS))
def test_corpus_keeps_every_setting_and_adds_nvidia(lab, case):
    inventory, varsfile = lab
    before, texts = {}, {}
    for node in NODES:
        texts[node] = start_from(inventory, node, CORPUS[case])
        before[node] = dump(inventory, node)

    rc, doc = install(inventory, varsfile, only=WIRING_ONLY)
    assert rc == 0, json.dumps({h: v["failures"] for h, v in doc["hosts"].items()})
    for node in NODES:
        b, a = cr.flatten(before[node]), cr.flatten(dump(inventory, node))
        prefix = runtimes_of(a)
        changed = {k: (v, a.get(k, "<missing>")) for k, v in b.items()
                   if a.get(k, "<missing>") != v and k != "imports"
                   and not k.startswith(prefix + "nvidia.")}  # fmt: skip
        assert changed == {}, f"{case} on containerd {NODES[node]} lost settings: {changed}"
        assert a[prefix + "nvidia.options.BinaryName"] == BIN
        assert a[prefix + "nvidia.runtime_type"] == "io.containerd.runc.v2"
        runc_cgroup = b.get(prefix + "runc.options.SystemdCgroup")
        if runc_cgroup is not None:
            assert a[prefix + "nvidia.options.SystemdCgroup"] == runc_cgroup
        facts = doc["hosts"][node]["facts"]["gpustack_runtime"]
        assert facts["wired"] is True and facts["container_check"] == "passed", facts
        assert ssh(inventory, node, "systemctl is-active containerd").stdout.strip() == "active"
        log = ssh(inventory, node, f"cat {lab_fixtures.RUNTIME_LOG}").stdout
        assert "gpustack-verify" in log
        # NVIDIA's runtime (internal/modifier/cdi.go): no GPU asked for, the spec goes to runc as is
        assert "No devices requested; no modification required." in log

    rc, again = install(inventory, varsfile, only=WIRING_ONLY)
    assert rc == 0
    assert {h: v["changed"] for h, v in again["hosts"].items()} == dict.fromkeys(NODES, 0)

    proc = run_cli("uninstall", str(inventory), "--components", "runtime", "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for node in NODES:
        assert dump(inventory, node) == before[node], f"{case}: uninstall did not restore {node}"
        assert config_text(inventory, node) == texts[node]


def test_plan_of_the_runtime_role_lists_its_files_and_restart_and_changes_nothing(lab):
    """`plan --tags container_runtime` on real containerd 1.6, 1.7 and 2.1 under systemd: the
    drop-in, the main file and the announced restart are listed per node, and nothing on the
    nodes changes (until 2026-11-29 a unit test ran this on the build machine over a local
    connection; it was skipped there for lack of containerd, and could not have passed since
    the role refuses hosts without systemd)."""
    inventory, varsfile = lab
    snapshot = ("find /etc/containerd /var/lib/gpustack -type f 2>/dev/null | sort | xargs -r md5sum; "
                "systemctl show -p ActiveEnterTimestampMonotonic containerd")  # fmt: skip
    before = {}
    for node in NODES:
        start_from(inventory, node, "per-node")
        before[node] = ssh(inventory, node, snapshot).stdout
    proc = run_cli("plan", str(inventory), "--tags", "container_runtime", "-e", f"@{varsfile}",
                   "--output", "json")  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    plan = json.loads(proc.stdout)["plan"]
    for node in NODES:
        assert plan[node]["services"] == ["containerd: would restart"], plan[node]
        paths = [f["path"] for f in plan[node]["files"]]
        assert "/etc/containerd/conf.d/99-nvidia.toml" in paths, paths
        assert "/etc/containerd/config.toml" in paths, paths
        assert plan[node]["install"] == plan[node]["upgrade"] == plan[node]["remove"] == []
        assert ssh(inventory, node, snapshot).stdout == before[node]


def test_rejected_config_is_rolled_back_and_containerd_keeps_running(lab):
    inventory, varsfile = lab
    node = f"{LAB}-node1"
    start_from(inventory, node, KUBEADM)
    before, text = dump(inventory, node), config_text(inventory, node)
    bad = json.dumps({"container_runtime_nvidia_runtime_extra": {"runtime_type": 123}})
    rc, doc = install(inventory, varsfile, "--limit", node, "-e", bad)
    assert rc == 1
    assert "did not accept the new configuration" in doc["hosts"][node]["failures"][-1]["message"]
    assert config_text(inventory, node) == text
    assert ssh(inventory, node, "test -e /etc/containerd/conf.d/99-nvidia.toml").returncode == 1
    assert ssh(inventory, node, "systemctl is-active containerd").stdout.strip() == "active"
    assert dump(inventory, node) == before


def test_a_failed_write_puts_back_what_it_wrote_and_says_so(lab):
    """containerd's main configuration is a mount point (bind-mounted onto itself), so its atomic
    replacement fails with EBUSY after the drop-in was written in the same call. Before the fix,
    ansible's atomic_move raised and the module ended without the list of what was written: the
    rescue restored nothing, left the drop-in, and its message said it had put it back."""
    inventory, varsfile = lab
    node = f"{LAB}-node1"
    start_from(inventory, node, KUBEADM)
    before, text = dump(inventory, node), config_text(inventory, node)
    config = "/etc/containerd/config.toml"
    assert ssh(inventory, node, f"mount --bind {config} {config}").returncode == 0
    try:
        rc, doc = install(inventory, varsfile, "--limit", node, only=WIRING_ONLY)
    finally:
        ssh(inventory, node, f"umount {config}")
    assert rc == 1
    message = doc["hosts"][node]["failures"][-1]["message"]
    assert "could not write containerd's files" in message, message
    assert "busy" in message.lower(), message
    assert config_text(inventory, node) == text
    assert ssh(inventory, node, "test -e /etc/containerd/conf.d/99-nvidia.toml").returncode == 1
    marker = "/var/lib/gpustack/containerd.restart-pending"
    assert ssh(inventory, node, f"test -e {marker}").returncode == 1
    assert ssh(inventory, node, "systemctl is-active containerd").stdout.strip() == "active"
    assert dump(inventory, node) == before
    # and the next run, with the file writable again, wires the node
    rc, doc = install(inventory, varsfile, "--limit", node, only=WIRING_ONLY)
    assert rc == 0, doc["hosts"][node]["failures"]
    assert doc["hosts"][node]["facts"]["gpustack_runtime"]["wired"] is True


def test_uninstall_keeps_what_the_user_added_to_a_file_gpustack_created(lab):
    """No main configuration before install: gpustack wrote one (`version` and its import). The
    user then added a setting to it; uninstall takes only the import out and keeps the file (it
    removed the file, the user's setting with it, before); a file that is no longer TOML is refused
    with a hint, nothing changed. And after a run that failed before it wrote that file, uninstall
    finds nothing to take out (it failed reading the absent file before)."""
    inventory, varsfile = lab
    node = f"{LAB}-node3"
    config = "/etc/containerd/config.toml"
    start_from(inventory, node, None)
    rc, doc = install(inventory, varsfile, "--limit", node, only=WIRING_ONLY)
    assert rc == 0, doc["hosts"][node]["failures"]
    uninstall = ("uninstall", str(inventory), "--components", "runtime", "--limit", node, "--yes")
    # a config.toml that is no longer TOML: refused with a hint, nothing changed
    wired = config_text(inventory, node)
    assert ssh(inventory, node, f"printf 'version = \\n' >> {config}").returncode == 0
    proc = run_cli(*uninstall, "--output", "json")
    assert proc.returncode != 0
    host = json.loads(proc.stdout)["hosts"][node]
    message = " ".join(f["message"] for f in host["failures"])
    assert f"{config} is not valid TOML" in message and "Hint: fix" in message, message
    assert host["changed"] == 0, host
    assert config_text(inventory, node) == wired + "version = \n"
    assert ssh(inventory, node, "test -e /etc/containerd/conf.d/99-nvidia.toml").returncode == 0
    assert ssh(inventory, node, f"cat > {config} <<'EOF'\n{wired}EOF\n").returncode == 0
    added = '[plugins."io.containerd.cri.v1.images".registry]\n  config_path = "/etc/containerd/certs.d"\n'
    assert ssh(inventory, node, f"printf '\\n{added}' >> {config}").returncode == 0
    proc = run_cli(*uninstall)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    kept = tomllib.loads(config_text(inventory, node))
    assert "imports" not in kept, kept
    registry = kept["plugins"]["io.containerd.cri.v1.images"]["registry"]
    assert registry["config_path"] == "/etc/containerd/certs.d", kept
    assert ssh(inventory, node, "test -e /etc/containerd/conf.d/99-nvidia.toml").returncode == 1
    assert ssh(inventory, node, "systemctl is-active containerd").stdout.strip() == "active"
    assert "certs.d" in json.dumps(dump(inventory, node))
    # a second uninstall finds nothing left to take out
    kept_text = config_text(inventory, node)
    proc = run_cli(*uninstall, "--output", "json")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads(proc.stdout)["hosts"][node]["changed"] == 0
    assert config_text(inventory, node) == kept_text

    # a first run that failed before it wrote anything of containerd's: /etc/containerd read-only
    start_from(inventory, node, None)
    etc = "/etc/containerd"
    read_only = f"mount --bind {etc} {etc} && mount -o remount,ro,bind {etc}"
    assert ssh(inventory, node, read_only).returncode == 0
    try:
        rc, doc = install(inventory, varsfile, "--limit", node, only=WIRING_ONLY)
    finally:
        ssh(inventory, node, f"umount {etc}")
    assert rc == 1
    assert ssh(inventory, node, "test -e /var/lib/gpustack/container_runtime.json").returncode == 0
    proc = run_cli(*uninstall)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert config_text(inventory, node) is None
    assert ssh(inventory, node, "test -e /var/lib/gpustack/container_runtime.json").returncode == 1
    assert ssh(inventory, node, "systemctl is-active containerd").stdout.strip() == "active"


def test_a_host_without_systemd_is_refused_before_any_change(lab):
    """The lent H100 VM's init is not systemd (2026-11-27): with containerd started by hand,
    install wrote the files, failed at the restart and left its marker and backups. Here the
    node's sd_booted(3) marker is moved away, so systemctl refuses as it does on such a host."""
    inventory, varsfile = lab
    node = f"{LAB}-node1"
    start_from(inventory, node, KUBEADM)
    snapshot = ("find /etc/containerd /var/lib/gpustack -type f 2>/dev/null | sort | xargs -r md5sum; "
                "ls /etc/containerd")  # fmt: skip
    before = ssh(inventory, node, snapshot).stdout
    hide = "mv /run/systemd/system /run/systemd/system.gpustack-test"
    assert ssh(inventory, node, hide).returncode == 0
    try:
        rc, doc = install(inventory, varsfile, "--limit", node)
        assert rc == 1
        message = doc["hosts"][node]["failures"][-1]["message"]
        assert "does not run systemd" in message and "Nothing was changed" in message, message
        assert "Hint: run install on a host that systemd booted" in message
        assert doc["hosts"][node]["changed"] == 0
        # --tags that leave the runtime out leave the refusal out
        rc, doc = install(inventory, varsfile, "--limit", node, "--tags", "gpu_preflight")
        assert rc == 0, doc["hosts"][node]["failures"]
    finally:
        ssh(inventory, node, "mv /run/systemd/system.gpustack-test /run/systemd/system")
    assert ssh(inventory, node, snapshot).stdout == before
    assert ssh(inventory, node, "systemctl is-active containerd").stdout.strip() == "active"


def test_toolkit_pinned_held_upgraded_and_unknown_version_refused(lab):
    inventory, varsfile = lab
    old, new = lab_fixtures.VERSIONS
    for version in (old, new):
        rc, doc = install(inventory, varsfile, "-e", f"nvidia_container_toolkit_version={version}")
        assert rc == 0
        for node in NODES:
            toolkit = doc["hosts"][node]["facts"]["gpustack_toolkit"]
            assert toolkit["installed_version"] == version and toolkit["held"] is True
            holds = ssh(inventory, node, "apt-mark showhold").stdout.split()
            assert {"nvidia-container-toolkit", "libnvidia-container1"} <= set(holds)
    rc, doc = install(inventory, varsfile, "-e", "nvidia_container_toolkit_version=9.9.9-1")
    assert rc == 1
    message = doc["hosts"][f"{LAB}-node1"]["failures"][-1]["message"]
    assert "9.9.9-1 is not available" in message and old in message


def test_toolkit_without_the_driver_refreshes_old_lists_before_its_transaction(lab):
    """The driver skipped by tags and a new toolkit source: site.yml's resolve step refreshes that
    source's lists alone (which leaves the lists' age as it was), and the driver role refreshes
    nothing, so the toolkit role refreshes lists older than an hour before its own transaction."""
    inventory, varsfile = lab
    node = f"{LAB}-node1"
    proc = run_cli("uninstall", str(inventory), "--limit", node, "--components", "toolkit", "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Lists older than an hour, one of them gone: only a refresh of every source brings it back
    # (apt-get update with nothing new to fetch would leave the directory's mtime as it was).
    updates = "/var/lib/apt/lists/*-updates_main_binary-*_Packages*"
    aged = ssh(inventory, node, f"rm -f {updates} && touch -d '3 hours ago' /var/lib/apt/lists")
    assert aged.returncode == 0, aged.stderr
    rc, doc = install(inventory, varsfile, "--limit", node)
    assert rc == 0, json.dumps(doc["hosts"][node]["failures"])
    tasks = [change["task"] for change in doc["hosts"][node]["changes"]]
    assert "Write the repository source" in tasks  # the source was new: proved on its own
    assert (
        "Refresh the package lists before the toolkit's own transaction (at most hourly)" in tasks
    )
    assert ssh(inventory, node, f"ls {updates}").returncode == 0, "every source was refreshed"
    assert doc["hosts"][node]["facts"]["gpustack_toolkit"]["held"] is True


# k3s and RKE2 (roles/container_runtime/tasks/k3s.yml) against the k3s stand-in of
# tests/fixtures/k3s (TEST FIXTURE): k3s's template rendering and runtime detection, with the
# node's real containerd (1.6, 1.7, 2.1) parsing what it renders. Not k3s: no kubelet or server.
K3S = ROOT / "tests/fixtures/k3s"
K3S_ETC = "/var/lib/rancher/k3s/agent/etc/containerd"
K3S_DROPIN = "/etc/rancher/k3s/config.yaml.d/90-gpustack-nvidia.yaml"


def k3s_template_name(node):
    return "config-v3.toml.tmpl" if NODES[node] == "2.1" else "config.toml.tmpl"


def k3s_generated(inventory, node):
    proc = ssh(inventory, node, f"cat {K3S_ETC}/config.toml")
    assert proc.returncode == 0, proc.stderr
    return cr.k3s_generated(proc.stdout, "nvidia", BIN)


def k3s_started(inventory, node, unit="k3s"):
    command = f"systemctl show -P ActiveEnterTimestampMonotonic {unit}"
    return ssh(inventory, node, command).stdout.strip()


def changed(doc):
    return {host: result["changed"] for host, result in doc["hosts"].items()}


def stand_in(inventory, product):
    """The k3s stand-in installed and started on every node as k3s.service, or as RKE2's
    rke2-server.service (with RKE2's ctr at /var/lib/rancher/rke2/bin/ctr)."""
    unit = "k3s" if product == "k3s" else "rke2-server"
    for node in NODES:
        for name, dest in ((K3S / "k3s", f"/usr/local/bin/{product}"),
                           (K3S / f"{unit}.service", "/etc/systemd/system/")):  # fmt: skip
            lab_fixtures._run("podman", "cp", str(name), f"gpustack-{node}:{dest}")
        ctr = "ctr --address /run/k3s/containerd/containerd.sock"
        proc = ssh(inventory, node, "mkdir -p /var/lib/rancher/rke2/bin && "
                                    "ln -sf /usr/bin/ctr /var/lib/rancher/rke2/bin/ctr && "
                                    f"systemctl daemon-reload && systemctl start {unit} && "
                                    f"for i in $(seq 30); do {ctr} version >/dev/null 2>&1 && exit 0; "
                                    f"sleep 1; done; journalctl -u {unit} --no-pager | tail -5; exit 1")  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return unit


def stand_in_removed(inventory, product, unit):
    for node in NODES:
        ssh(inventory, node, f"systemctl stop {unit}; rm -rf /usr/local/bin/{product} "
                             f"/etc/systemd/system/{unit}.service /var/lib/rancher /etc/rancher "
                             "/run/k3s /var/lib/gpustack/container_runtime.json; "
                             "systemctl daemon-reload")  # fmt: skip


def refused_toolkit_uninstall(inventory):
    """`uninstall --components toolkit` refused on every node: each node's message."""
    proc = run_cli("uninstall", str(inventory), "--components", "toolkit", "--yes",
                   "--output", "json")  # fmt: skip
    assert proc.returncode == 1, proc.stdout + proc.stderr
    doc = json.loads(proc.stdout)
    return {node: doc["hosts"][node]["failures"][-1]["message"] for node in NODES}


def test_the_toolkit_alone_is_not_removed_while_nvidia_is_containerds_default(lab):
    """containerd would fail every container of its default runtime without the toolkit's binary:
    `uninstall --components toolkit` is refused before any change where gpustack made nvidia the
    default; with the runtime's wiring removed too, it goes."""
    inventory, varsfile = lab
    for node in NODES:
        start_from(inventory, node, DISTRO)
    rc, doc = install(inventory, varsfile, "-e", "container_runtime_nvidia_default=true")
    assert rc == 0, json.dumps({h: v["failures"] for h, v in doc["hosts"].items()})
    state = ("dpkg-query -W -f='${Version} ${db:Status-Abbrev}' nvidia-container-toolkit; "
             "sha256sum /etc/containerd/conf.d/*.toml /var/lib/gpustack/container_runtime.json")  # fmt: skip
    before = {node: ssh(inventory, node, state).stdout for node in NODES}
    for node, message in refused_toolkit_uninstall(inventory).items():
        assert f"nvidia is the default runtime of containerd on {node}" in message, message
        assert "Nothing was changed. Hint: remove the runtime's wiring with it" in message, message
    assert {node: ssh(inventory, node, state).stdout for node in NODES} == before
    rc, doc = install(inventory, varsfile)  # nvidia no longer the default: the toolkit may go
    assert rc == 0, json.dumps({h: v["failures"] for h, v in doc["hosts"].items()})
    proc = run_cli("uninstall", str(inventory), "--components", "toolkit", "--check")
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.fixture
def k3s(lab):
    """The stand-in as k3s.service on every node, started; removed afterwards."""
    inventory, varsfile = lab
    unit = stand_in(inventory, "k3s")
    yield inventory, varsfile
    stand_in_removed(inventory, "k3s", unit)


def test_k3s_stand_in_is_as_strict_as_containerd(k3s):
    """The stand-in refuses what k3s's containerd refuses: the users' template (the base, then the
    runtime again) once the toolkit is on PATH. gpustack refuses it before touching anything."""
    inventory, varsfile = k3s
    rc, doc = install(inventory, varsfile)  # the toolkit, so that k3s finds the runtime
    assert rc == 0, json.dumps({h: v["failures"] for h, v in doc["hosts"].items()})
    for node in NODES:
        name = k3s_template_name(node)
        text = k3s_templates.BASE_PLUS_RUNTIME
        if NODES[node] == "2.1":
            text = text.replace('"io.containerd.grpc.v1.cri"', "'io.containerd.cri.v1.runtime'")
        proc = ssh(inventory, node, f"cat > {K3S_ETC}/{name} <<'EOF'\n{text}EOF\n"
                                    "systemctl restart k3s; sleep 2; systemctl is-active k3s; "
                                    "journalctl -u k3s --no-pager | tail -3")  # fmt: skip
        assert proc.stdout.startswith(("failed", "inactive")), proc.stdout
        assert "defined twice" in proc.stdout or "already exists" in proc.stdout, proc.stdout
    # Refused by gpu_preflight, before the toolkit role: the toolkit asked for is not installed.
    installed = "dpkg-query -W -f='${Version}' nvidia-container-toolkit"
    before = {node: ssh(inventory, node, installed).stdout for node in NODES}
    other = next(v for v in lab_fixtures.VERSIONS if v != before[f"{LAB}-node1"])
    rc, doc = install(inventory, varsfile, "-e", f"nvidia_container_toolkit_version={other}")
    assert rc == 1
    for node in NODES:
        message = doc["hosts"][node]["failures"][-1]["message"]
        assert k3s_template_name(node) in message and "table twice" in message, message
        assert (
            "Nothing was changed" in message
            and "Hint: remove the nvidia runtime's tables" in message
        )
        assert ssh(inventory, node, f"test -e {K3S_DROPIN}").returncode == 1
        assert ssh(inventory, node, installed).stdout == before[node]


def test_k3s_wired_by_its_own_detection_default_runtime_and_uninstall(k3s):
    inventory, varsfile = k3s
    # A k3s that an earlier gpustack wired: its template (which k3s rejects now) is removed.
    for node in NODES:
        v3 = NODES[node] == "2.1"
        text = k3s_templates.legacy(
            "io.containerd.cri.v1.runtime" if v3 else "io.containerd.grpc.v1.cri"
        )
        proc = ssh(inventory, node, f"cat > {K3S_ETC}/config.toml.tmpl <<'EOF'\n{text}EOF")
        assert proc.returncode == 0
    rc, doc = install(inventory, varsfile)
    assert rc == 0, json.dumps({h: v["failures"] for h, v in doc["hosts"].items()})
    for node in NODES:
        assert ssh(inventory, node, f"test -e {K3S_ETC}/config.toml.tmpl").returncode == 1
        assert k3s_generated(inventory, node) == {"wired": True, "default": False}
        facts = doc["hosts"][node]["facts"]["gpustack_runtime"]
        assert facts["kind"] == "k3s" and facts["wired"] is True, facts
        assert ssh(inventory, node, "systemctl is-active k3s").stdout.strip() == "active"

    started = {node: k3s_started(inventory, node) for node in NODES}
    rc, again = install(inventory, varsfile)
    assert rc == 0 and changed(again) == dict.fromkeys(NODES, 0)
    assert {node: k3s_started(inventory, node) for node in NODES} == started  # no restart

    default = ("-e", "container_runtime_nvidia_default=true")
    rc, doc = install(inventory, varsfile, *default)
    assert rc == 0, json.dumps({h: v["failures"] for h, v in doc["hosts"].items()})
    for node in NODES:
        assert k3s_generated(inventory, node) == {"wired": True, "default": True}
        assert "default-runtime" in ssh(inventory, node, f"cat {K3S_DROPIN}").stdout
    rc, again = install(inventory, varsfile, *default)
    assert rc == 0 and changed(again) == dict.fromkeys(NODES, 0)
    # without the toolkit, k3s would not start again (default runtime not found): refused
    for message in refused_toolkit_uninstall(inventory).values():
        assert "default runtime of k3s" in message and "k3s/RKE2 would not start again" in message
    for node in NODES:
        assert ssh(inventory, node, f"test -e {K3S_DROPIN} && test -x {BIN}").returncode == 0

    proc = run_cli("uninstall", str(inventory), "--components", "runtime", "--yes")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for node in NODES:
        assert ssh(inventory, node, f"test -e {K3S_DROPIN}").returncode == 1
        assert k3s_generated(inventory, node) == {"wired": True, "default": False}  # k3s's own
        record = "/var/lib/gpustack/container_runtime.json"
        assert ssh(inventory, node, f"test -e {record}").returncode == 1


def test_a_k3s_started_before_the_toolkit_is_restarted_to_find_it(k3s):
    """The usual first install on a k3s node: k3s runs, the toolkit comes after, and k3s finds
    the runtime only at its next start."""
    inventory, varsfile = k3s
    hide = f"mv {BIN} /root/hidden-runtime && systemctl restart k3s && sleep 1 && k3s ctr version"
    for node in NODES:
        assert ssh(inventory, node, hide).returncode == 0
        assert ssh(inventory, node, f"mv /root/hidden-runtime {BIN}").returncode == 0
        assert k3s_generated(inventory, node) == {"wired": False, "default": False}
    started = {node: k3s_started(inventory, node) for node in NODES}

    rc, doc = install(inventory, varsfile)

    assert rc == 0, json.dumps({h: v["failures"] for h, v in doc["hosts"].items()})
    for node in NODES:
        assert k3s_started(inventory, node) != started[node]
        assert k3s_generated(inventory, node) == {"wired": True, "default": False}
        assert doc["hosts"][node]["facts"]["gpustack_runtime"]["wired"] is True


def test_rke2_server_wired_with_rke2_paths_and_unit(lab):
    """RKE2 runs k3s's agent code with its own paths and units: rke2-server restarts (not
    rke2-agent), its ctr answers, the drop-in goes to /etc/rancher/rke2/config.yaml.d."""
    inventory, varsfile = lab
    unit = stand_in(inventory, "rke2")
    try:
        rc, doc = install(inventory, varsfile, "-e", "container_runtime_nvidia_default=true")
        assert rc == 0, json.dumps({h: v["failures"] for h, v in doc["hosts"].items()})
        dropin = "/etc/rancher/rke2/config.yaml.d/90-gpustack-nvidia.yaml"
        for node in NODES:
            facts = doc["hosts"][node]["facts"]["gpustack_runtime"]
            assert facts["kind"] == "rke2" and facts["wired"] is True, facts
            generated = ssh(
                inventory, node, "cat /var/lib/rancher/rke2/agent/etc/containerd/config.toml"
            )
            assert cr.k3s_generated(generated.stdout, "nvidia", BIN) == {
                "wired": True,
                "default": True,
            }
            assert ssh(inventory, node, f"test -e {dropin}").returncode == 0
            assert ssh(inventory, node, f"systemctl is-active {unit}").stdout.strip() == "active"
        started = {node: k3s_started(inventory, node, unit) for node in NODES}
        rc, again = install(inventory, varsfile, "-e", "container_runtime_nvidia_default=true")
        assert rc == 0 and changed(again) == dict.fromkeys(NODES, 0)
        assert {node: k3s_started(inventory, node, unit) for node in NODES} == started
        proc = run_cli("uninstall", str(inventory), "--components", "runtime", "--yes")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        for node in NODES:
            assert ssh(inventory, node, f"test -e {dropin}").returncode == 1
            assert ssh(inventory, node, f"systemctl is-active {unit}").stdout.strip() == "active"
    finally:
        stand_in_removed(inventory, "rke2", unit)
