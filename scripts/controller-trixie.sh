#!/usr/bin/env bash
# The newest end of gpustack's declared ansible-core range, on a Debian 13 (trixie) controller:
# Python 3.13 with the ansible-core constraints/py3.13.txt pins, in a debootstrapped chroot
# cached outside the clone. It shares this machine's network (lab nodes over loopback SSH, as
# from .venv) and sees the checkout, /tmp and $HOME at their own paths, bind-mounted in a
# private mount namespace (nothing stays mounted once a command ends).
#
#   scripts/controller-trixie.sh setup             # build or update the chroot and its venv
#   scripts/controller-trixie.sh run CMD [ARGS]    # CMD inside it, cwd kept, venv's bin first
#   scripts/controller-trixie.sh freeze            # a clean venv's `pip freeze` (new pins)
#
# The checkout's gpustack runs from the checkout (PYTHONPATH), so the venv (keyed by the
# constraints file's hash) holds only the pinned dependencies. GPUSTACK_CONTROLLER_CACHE moves
# the cache (default /var/cache/gpustack/controller-trixie). Needs root (debootstrap, unshare).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CACHE=${GPUSTACK_CONTROLLER_CACHE:-/var/cache/gpustack/controller-trixie}
RFS=$CACHE/rootfs
MIRROR=${GPUSTACK_LAB_MIRROR:-http://deb.debian.org/debian}
CONSTRAINTS=$ROOT/constraints/py3.13.txt
# Python, and what the unit suite calls besides it (as scripts/setup.sh installs on the machine)
PACKAGES=python3,python3-venv,openssh-client,ca-certificates,git,gnupg,apt-utils,dpkg-dev,runc

fail() { echo "Error: $1" >&2; echo "Hint: $2" >&2; exit "${3:-2}"; }

[ "$(id -u)" -eq 0 ] || fail "the trixie controller needs root (debootstrap, unshare -m, chroot)" \
    "run it as root, as scripts/test.sh does"

venv_dir() { echo "/opt/venv-$(sha256sum "$CONSTRAINTS" | cut -c1-16)"; }

# CMD inside the chroot with the checkout, /tmp and $HOME (and GPUSTACK_LAB_HOME,
# GPUSTACK_STATE_DIR when elsewhere) at their own paths.
inside() {
    local binds=("$ROOT" /tmp "$HOME")
    for extra in "${GPUSTACK_LAB_HOME:-}" "${GPUSTACK_STATE_DIR:-}"; do
        [ -n "$extra" ] && mkdir -p "$extra" && binds+=("$extra")
    done
    # shellcheck disable=SC2016  # expanded by the inner shell
    unshare --mount --propagation private -- /bin/sh -c '
        set -e
        rfs=$1; wd=$2; shift 2
        mount -t proc proc "$rfs/proc"
        mount --rbind /dev "$rfs/dev"
        mount --rbind /sys "$rfs/sys"
        while [ "$1" != "--" ]; do
            mkdir -p "$rfs$1"; mount --rbind "$1" "$rfs$1"; shift
        done
        shift
        cp /etc/hosts "$rfs/etc/hosts"
        # the CAs this machine trusts (a proxy of its own may sign the certificate of PyPI)
        ca=/etc/ssl/certs/ca-certificates.crt
        [ ! -f "$ca" ] || [ ! -f "$rfs$ca" ] || mount --bind "$ca" "$rfs$ca"
        exec chroot "$rfs" /bin/sh -c "cd \"\$0\" && exec \"\$@\"" "$wd" "$@"
    ' sh "$RFS" "$PWD" "${binds[@]}" -- "$@"
}

rootfs() {
    if [ -e "$RFS/.gpustack-rootfs" ]; then
        [ "$(cat "$RFS/.gpustack-rootfs")" = "$PACKAGES" ] && return
        echo "Installing into the trixie controller: $PACKAGES"
        inside /bin/sh -c "apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq --no-install-recommends $(echo "$PACKAGES" | tr , ' ') >/dev/null"
        echo "$PACKAGES" > "$RFS/.gpustack-rootfs"
        return
    fi
    command -v debootstrap >/dev/null || fail "debootstrap is missing" "run ./scripts/setup.sh"
    echo "Building the trixie controller in $RFS with debootstrap (a few minutes)…"
    rm -rf "$RFS.part"
    mkdir -p "$CACHE"
    debootstrap --variant=minbase --include="$PACKAGES" trixie "$RFS.part" "$MIRROR" >/dev/null
    rm -rf "$RFS.part/var/cache/apt/archives/"*.deb
    echo "$PACKAGES" > "$RFS.part/.gpustack-rootfs"
    mv "$RFS.part" "$RFS"
}

venv() {
    local dir
    dir=$(venv_dir)
    [ -x "$RFS$dir/bin/python" ] && [ -e "$RFS$dir/.installed" ] && return
    [ -f "$CONSTRAINTS" ] || fail "$CONSTRAINTS is missing" "run scripts/controller-trixie.sh freeze"
    echo "Installing the pinned dependencies into $dir (in the chroot)…"
    rm -rf "${RFS:?}$dir"
    inside /usr/bin/python3 -m venv "$dir"
    # Every pinned distribution (the constraints are a full `pip freeze`); gpustack itself runs
    # from the checkout.
    inside "$dir/bin/pip" install -q --disable-pip-version-check -r "$CONSTRAINTS"
    touch "$RFS$dir/.installed"
    for old in "$RFS"/opt/venv-*; do  # earlier pins
        [ "$old" = "$RFS$dir" ] || rm -rf "$old"
    done
}

cmd=${1:-}
[ $# -gt 0 ] && shift
(
    flock 9
    case "$cmd" in
        setup|run) rootfs; venv ;;
        freeze) rootfs ;;
        *) fail "usage: scripts/controller-trixie.sh setup | run CMD [ARGS] | freeze" \
                "see the comment at the top of the script" ;;
    esac
) 9>"$CACHE.lock"

case "$cmd" in
    setup)
        inside "$(venv_dir)/bin/python" -c \
            'import sys, ansible.release as r; print("trixie controller: Python %d.%d.%d, ansible-core %s" % (*sys.version_info[:3], r.__version__))'
        ;;
    run)
        [ $# -gt 0 ] || fail "run needs a command" "e.g. scripts/controller-trixie.sh run python -m gpustack --version"
        dir=$(venv_dir)
        PATH="$dir/bin:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin" \
            PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" VIRTUAL_ENV="$dir" inside "$@"
        ;;
    freeze)
        # A clean venv with gpustack's and its test extra's newest allowed versions, frozen.
        scratch=/opt/freeze-$$
        inside /usr/bin/python3 -m venv "$scratch" >/dev/null
        inside "$scratch/bin/pip" install -q --disable-pip-version-check "$ROOT[test]" >&2
        inside "$scratch/bin/pip" freeze --exclude gpustack --disable-pip-version-check
        rm -rf "${RFS:?}$scratch"
        ;;
esac
