#!/usr/bin/env bash
# gpustack's whole install, and Molecule's gpu scenario, on a GPU host that systemd did not boot:
# in a Debian 12 chroot node with systemd as PID 1 (`gpustack lab up --boot chroot`;
# docs/gpu-hosts.md, "A GPU host without systemd"). As root, from a checkout:
#
#   scripts/gpu-host-systemd-node.sh prepare [DIR]      # a connected machine, after ./scripts/setup.sh
#   scripts/gpu-host-systemd-node.sh run [DIR] [OUT]    # the GPU host (no network needed)
#
# prepare writes two files into DIR (default .artifacts):
#   gpu-node-rootfs.tar.xz   the node (`gpustack lab rootfs`: Debian 12, systemd, containerd,
#                            runc, openssh-server, python3) with the labelled TEST FIXTURE
#                            toolkit repository under /srv;
#   gpu-node-harness.tar.xz  what the tests add to it: a virtual environment for the node's
#                            Python with gpustack's dependencies, Molecule and testinfra (the
#                            controller runs in the node and reaches it by SSH on its loopback
#                            port), and two TEST FIXTURE images (busybox; busybox with glibc).
#   GPUSTACK_TOOLKIT_REPO=DIR takes another signed flat repository in NVIDIA's layout
#   (DIR/stable/deb/amd64, DIR/gpgkey, DIR/fixture.json with "fingerprint") instead.
# run boots the node with the host's NVIDIA devices and /usr/local/nvidia (read-only) bound in and
#   this checkout at /opt/gpustack-src, then runs in it: doctor, install (the host's driver kept),
#   install again (changed=0), status (no drift), smoke (every check), uninstall (what was there
#   comes back), molecule test -s gpu, uninstall again. Outputs go to OUT (default
#   .artifacts/real-gpu-<date>), to copy under tests/fixtures/real-gpu/; exit-codes.txt sums up.
#   The GPU's driver, MIG mode and settings are read before and after, never set.
#   GPUSTACK_NODE_OFFLINE=1 runs it without network; GPUSTACK_NODE_ARGS adds arguments to the
#   two installs. A rehearsal on a machine without GPU:
#   GPUSTACK_NODE_OFFLINE=1 GPUSTACK_NODE_ARGS='--skip-tags nvidia_driver' ... run
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
LAB=${GPUSTACK_NODE_LAB:-gpunode}
CONTROLLER=/opt/gpustack-controller
SRC=/opt/gpustack-src
NODE_OUT=/opt/gpustack-out
GLIBC_IMAGE=localhost/gpustack-fixture-glibc-shell:1
BUSYBOX_IMAGE=localhost/gpustack-fixture-busybox:1

die() { echo "Error: $1" >&2; echo "Hint: $2" >&2; exit 2; }
[ "$(id -u)" -eq 0 ] || die "this script needs root (namespaces, mounts, chroot)" "run it with sudo"

prepare() {
    local dir=${1:-.artifacts} work=.artifacts/gpu-node-rootfs harness=.artifacts/gpu-node-harness
    [ -x .venv/bin/gpustack ] || die "no .venv here" "run ./scripts/setup.sh first"
    mkdir -p "$dir"
    rm -rf --one-file-system "$work" "$harness"
    mkdir -p "$harness/srv" "$harness$(dirname "$CONTROLLER")"
    .venv/bin/gpustack lab rootfs "$work" || exit 1
    echo "== the toolkit repository (TEST FIXTURE) into the node; test images into the harness"
    .venv/bin/python - "$work" "$harness" <<'PY' || exit 1
import json, os, shutil, sys
from pathlib import Path
from tests.fixtures import lab_fixtures as f
root, harness = Path(sys.argv[1]), Path(sys.argv[2])
given = os.environ.get("GPUSTACK_TOOLKIT_REPO")
if given:
    repo = json.loads((Path(given) / "fixture.json").read_text())
    shutil.copytree(given, root / f.REPO_IN_NODE.lstrip("/"))
else:
    repo = f.publish_to_root(root)
    (root / f.IMAGE_IN_NODE.lstrip("/")).unlink()
shutil.copy2(f.build_busybox_image(), harness / f.IMAGE_IN_NODE.lstrip("/"))
shutil.copy2(f.build_glibc_shell_image(), harness / "srv/gpustack-fixture-glibc-shell.tar")
(root / "srv/gpustack-node-vars.json").write_text(json.dumps(f.extra_vars(repo), indent=2))
PY
    echo "== pack the node"
    .venv/bin/gpustack lab rootfs "$work" --pack "$dir/gpu-node-rootfs.tar.xz" || exit 1
    echo "== the controller for the node's Python (gpustack's dependencies, Molecule, testinfra)"
    local reqs
    reqs=$(.venv/bin/python - <<'PY'
import shlex, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))["project"]
wanted = ("molecule", "pytest-testinfra", "pytest>")
tests = [r.split("#")[0].strip() for r in project["optional-dependencies"]["test"]]
print(shlex.join(project["dependencies"] + [r for r in tests if r.startswith(wanted)]))
PY
) || exit 1
    build_controller "$work" "$reqs" || exit 1
    mv "$work$CONTROLLER" "$harness$CONTROLLER"
    tar -C "$harness" --numeric-owner -c . | xz -6 -T0 > "$dir/gpu-node-harness.tar.xz" || exit 1
    rm -rf --one-file-system "$work" "$harness"
    ls -l "$dir/gpu-node-rootfs.tar.xz" "$dir/gpu-node-harness.tar.xz"
}

build_controller() {  # build_controller ROOT REQUIREMENTS: a venv for ROOT's Python at $CONTROLLER
    local work=$1 reqs=$2
    mkdir -p "$work/tmp/pip" && .venv/bin/pip download -q --no-deps -d "$work/tmp/pip" pip || return 1
    cp /etc/resolv.conf "$work/etc/resolv.conf"
    # This machine's certificate authorities (a proxy's, where there is one) for pip in the chroot.
    cp "${PIP_CERT:-${REQUESTS_CA_BUNDLE:-/etc/ssl/certs/ca-certificates.crt}}" "$work/tmp/pip/ca.crt"
    cat > "$work/tmp/controller.sh" <<SH || return 1
set -eu
export PIP_CERT=/tmp/pip/ca.crt SSL_CERT_FILE=/tmp/pip/ca.crt REQUESTS_CA_BUNDLE=/tmp/pip/ca.crt
unset PIP_FIND_LINKS
python3 -m venv --without-pip $CONTROLLER
$CONTROLLER/bin/python "\$(ls /tmp/pip/pip-*.whl)/pip" install -q --no-compile --disable-pip-version-check $reqs
# gpustack itself is the checkout bound at $SRC when the node runs.
echo $SRC > "\$($CONTROLLER/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/gpustack-src.pth"
printf '#!/bin/sh\nexec $CONTROLLER/bin/python -m gpustack "\$@"\n' > $CONTROLLER/bin/gpustack
chmod 755 $CONTROLLER/bin/gpustack
find $CONTROLLER -name __pycache__ -prune -exec rm -rf {} +
SH
    unshare --mount --fork sh -euc 'mount --make-rprivate /
        mount -t proc proc "$1/proc"; mount --rbind /dev "$1/dev"
        chroot "$1" sh /tmp/controller.sh' sh "$work"
}

in_node() {  # a command in the node: its namespaces, its root, a login-like environment
    nsenter -t "$INIT" -m -u -i -p -C -r -w env -i HOME=/root LANG=C.UTF-8 \
        PATH="$CONTROLLER/bin:/usr/sbin:/usr/bin:/sbin:/bin" sh -c "$1"
}

step() {  # step NAME COMMAND: in the node, output to OUT/NAME.txt, exit code to exit-codes.txt
    local name=$1 rc
    echo "== $name"
    in_node "cd $SRC && $2" > "$OUT/$name.txt" 2>&1
    rc=$?
    echo "$name $rc" >> "$OUT/exit-codes.txt"
    tail -5 "$OUT/$name.txt"
    echo "   exit $rc"
}

gpu_state() {  # the host's GPUs and their settings, read only
    local smi=nvidia-smi
    [ -x /usr/local/nvidia/bin/nvidia-smi ] && smi=/usr/local/nvidia/bin/nvidia-smi
    export LD_LIBRARY_PATH=/usr/local/nvidia/lib64
    if ! "$smi" -L 2>&1; then echo "no NVIDIA device on this host"; return 0; fi
    "$smi" --format=csv --query-gpu=index,uuid,name,driver_version,mig.mode.current,mig.mode.pending,persistence_mode,ecc.mode.current,ecc.mode.pending,compute_mode,power.limit,clocks.applications.graphics,clocks.applications.memory
}

SNAPSHOT="dpkg-query -W -f='\${Package} \${Version} \${db:Status-Abbrev}\n' | sort; find /etc/containerd /etc/apt /etc/nvidia-container-runtime /etc/cdi /etc/systemd/system -type f 2>/dev/null | sort | xargs -r md5sum"

restored() {  # every package and file of BEFORE as it was; new files only gpustack's backups
    python3 - "$1" "$2" <<'PY'
import re, sys
before, after = (set(open(p).read().splitlines()) for p in sys.argv[1:3])
missing = sorted(before - after)
backup = re.compile(r"\.\d+\.\d{4}-\d\d-\d\d@\d\d:\d\d:\d\d~$")
extra = sorted(line for line in after - before if not backup.search(line))
for line in missing:
    print("changed or gone:", line)
for line in extra:
    print("new:", line)
print("backups kept:", sum(1 for line in after - before if backup.search(line)))
sys.exit(1 if missing or extra else 0)
PY
}

run() {
    local dir=${1:-.artifacts}
    local tarball=$dir/gpu-node-rootfs.tar.xz harness=$dir/gpu-node-harness.tar.xz f rc
    OUT=${2:-.artifacts/real-gpu-$(date +%F)}
    for f in "$tarball" "$harness"; do
        # Carried in pieces (`split -b 30M FILE FILE.part-`, where one transfer is limited)?
        if [ ! -f "$f" ] && ls "$f".part-* > /dev/null 2>&1; then cat "$f".part-* > "$f"; fi
        [ -f "$f" ] || die "no $f" "run \`$0 prepare\` on a connected machine and bring its two files here"
    done
    mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) && : > "$OUT/exit-codes.txt"
    exec > >(tee "$OUT/run-log.txt") 2>&1
    echo "== host $(date -u +%FT%TZ)"
    uname -r; head -2 /etc/os-release; echo "PID 1: $(cat /proc/1/comm)"; ls -d /dev/nvidia* /usr/local/nvidia 2>&1
    gpu_state > "$OUT/gpu-before.txt"; cat "$OUT/gpu-before.txt"
    export GPUSTACK_LAB_HOME=$REPO/.artifacts/gpu-node-lab
    local home=$GPUSTACK_LAB_HOME/$LAB
    mkdir -p .collections/ansible_collections/gpustack
    ln -sfn ../../.. .collections/ansible_collections/gpustack/gpustack
    PYTHONPATH=$REPO python3 -m gpustack.lab down --name "$LAB" > /dev/null 2>&1
    echo "== boot the node"
    PYTHONPATH=$REPO python3 -m gpustack.lab up --name "$LAB" --rootfs "$tarball" \
        --bind "$REPO:$SRC" --bind "$OUT:$NODE_OUT" --inventory "$OUT/inventory.ini" || exit 1
    INIT=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["chroot"]["init_pid"])' "$home/state.json")
    python3 - "$harness" "$home/rootfs" <<'PY' || exit 1
import sys, tarfile
with tarfile.open(sys.argv[1]) as archive:  # ours: the venv's links point at the node's python3
    try:
        archive.extractall(sys.argv[2], numeric_owner=True, filter="fully_trusted")
    except TypeError:  # Python before 3.11.4
        archive.extractall(sys.argv[2], numeric_owner=True)
PY
    # The controller runs in the node and reaches the node by SSH on its loopback port.
    install -m 600 "$home/id_ed25519" "$home/rootfs/root/.ssh/gpustack-lab-key"
    sed -e "s#ansible_ssh_private_key_file=.*#ansible_ssh_private_key_file=/root/.ssh/gpustack-lab-key#" \
        "$OUT/inventory.ini" > "$home/rootfs/root/node.ini"
    python3 - "$home/rootfs" "$BUSYBOX_IMAGE" <<'PY' || exit 1
import json, sys
root, image = sys.argv[1:3]
variables = json.load(open(root + "/srv/gpustack-node-vars.json"))
variables.update(container_runtime_verify_image=image, nvidia_driver_preinstalled="keep",
                 gpustack_gpu_reboot_policy="never")
with open(root + "/root/node.ini", "a") as fh:
    fh.write("# gpu-host-systemd-node.sh: the host's driver kept; the toolkit from /srv (TEST FIXTURE)\n")
    for key, value in variables.items():
        fh.write(f"{key}={value if isinstance(value, str) else json.dumps(value)}\n")
PY
    cp "$home/rootfs/root/node.ini" "$OUT/node.ini"
    step 00-node "systemctl is-system-running; cat /proc/1/comm; findmnt -n -o FSTYPE /sys/fs/cgroup; \
        for i in gpustack-fixture-busybox.tar gpustack-fixture-glibc-shell.tar; do ctr -n gpustack images import --snapshotter native /srv/\$i; done; \
        PATH=\$PATH:/usr/local/nvidia/bin nvidia-smi -L; gpustack --version; molecule --version"
    if ! python3 -c 'import socket; socket.getaddrinfo("deb.debian.org", 80)' 2> /dev/null; then
        # No network (as on the GPU hosts lent so far): the node's Debian archive is out of reach,
        # and apt-get update fails on it; the toolkit's repository in /srv is its only source.
        mv "$home/rootfs/etc/apt/sources.list.d/debian.sources" "$home/rootfs/root/debian.sources.unreachable"
        echo "== no network: the node's Debian sources set aside (/root/debian.sources.unreachable)"
    fi
    local E="-e nvidia_driver_preinstalled=keep" O=$NODE_OUT I="${GPUSTACK_NODE_ARGS:-}"
    step 01-snapshot-before "$SNAPSHOT"
    step 02-doctor "gpustack doctor /root/node.ini -o json --report $O/02-doctor.json"
    step 03-install "gpustack install /root/node.ini $E $I -o json --report $O/03-install.json --junit $O/03-install.xml"
    step 04-install-again "gpustack install /root/node.ini $E $I -o json --report $O/04-install-again.json"
    step 05-status "gpustack status /root/node.ini $E -o wide; gpustack status /root/node.ini $E -o json > $O/05-status.json"
    step 06-smoke "gpustack smoke /root/node.ini -e gpu_smoke_snapshotter=native --image $GLIBC_IMAGE -o json --report $O/06-smoke.json --capture $O/smoke-capture"
    step 07-uninstall "gpustack uninstall /root/node.ini --components toolkit,runtime --yes"
    step 08-snapshot-after-uninstall "$SNAPSHOT"
    restored "$OUT/01-snapshot-before.txt" "$OUT/08-snapshot-after-uninstall.txt" > "$OUT/08-restored.txt"
    rc=$?; echo "08-restored $rc" >> "$OUT/exit-codes.txt"; echo "== restored: exit $rc"; cat "$OUT/08-restored.txt"
    step 09-molecule-gpu "GPUSTACK_GPU_INVENTORY=/root/node.ini GPUSTACK_GPU_TEST_IMAGE=$GLIBC_IMAGE molecule test -s gpu"
    step 10-uninstall-after-molecule "gpustack uninstall /root/node.ini --components toolkit,runtime --yes"
    step 11-journal "systemctl --failed --no-legend; journalctl -b --no-pager -u containerd | tail -100"
    gpu_state > "$OUT/gpu-after.txt"
    cmp -s "$OUT/gpu-before.txt" "$OUT/gpu-after.txt"; rc=$?
    echo "12-gpu-settings-unchanged $rc" >> "$OUT/exit-codes.txt"
    [ $rc -eq 0 ] && echo "== the GPUs' settings read the same after" || diff "$OUT/gpu-before.txt" "$OUT/gpu-after.txt"
    echo "== tear down"
    PYTHONPATH=$REPO python3 -m gpustack.lab down --name "$LAB"
    echo "== exit codes"; cat "$OUT/exit-codes.txt"
    echo "Outputs: $OUT"
}

offline() {  # run again in a network namespace with loopback only, as on a GPU host without network
    exec unshare --net sh -c 'python3 -c "
import fcntl, socket, struct
fcntl.ioctl(socket.socket(), 0x8914, struct.pack(\"16sH22x\", b\"lo\", 0x1 | 0x40))
" && GPUSTACK_NODE_OFFLINE=done exec "$0" "$@"' "$0" "$@"
}

case "${1:-}" in
    prepare) shift; prepare "$@" ;;
    run)
        [ "${GPUSTACK_NODE_OFFLINE:-}" = 1 ] && offline "$@"
        shift; run "$@"
        ;;
    *) die "usage: $0 prepare [DIR] | run [DIR] [OUT]" "see the comment at the top of $0" ;;
esac
