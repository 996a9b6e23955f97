#!/usr/bin/env bash
# Read-only smoke test of THIS machine's NVIDIA stack: `gpustack smoke --local` (docs/gpu-hosts.md).
# Finds gpustack (--venv, $GPUSTACK_VENV, `gpustack` on PATH, a checkout's .venv) or installs it
# from a wheelhouse (--wheelhouse DIR, or the directory this script sits in when it holds
# gpu_node_stack-*.whl) into a temporary venv, offline, removed afterwards. Every other argument goes to
# `gpustack smoke` (--capture DIR, --report FILE, --image REF, -o json, -e VAR=VALUE, -v).
#
# Changes nothing on the host: no package, no setting, no service. It writes only the temporary
# venv, Ansible's scratch directory (~/.ansible/tmp), gpustack's run directory
# (~/.local/state/gpustack, or $GPUSTACK_STATE_DIR) and the files you ask for. Exit codes are
# gpustack's: 0 every check that applies passed, 3 a check failed or no NVIDIA device, 2 bad input.
set -euo pipefail

fail() { echo "Error: $1" >&2; echo "Hint: $2" >&2; exit 2; }

HERE=$(cd "$(dirname "$0")" && pwd)
WHEELHOUSE=""
VENV=${GPUSTACK_VENV:-}
KEEP=0
ARGS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --wheelhouse) WHEELHOUSE=${2:?--wheelhouse needs a directory}; shift 2 ;;
        --venv) VENV=${2:?--venv needs a directory}; shift 2 ;;
        --keep-venv) KEEP=1; shift ;;
        -h|--help)
            sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
            echo "Usage: gpu-smoke.sh [--wheelhouse DIR | --venv DIR] [--keep-venv] [gpustack smoke options]"
            exit 0 ;;
        *) ARGS+=("$1"); shift ;;
    esac
done

GPUSTACK=""
if [ -n "$VENV" ] && [ -z "$WHEELHOUSE" ]; then
    [ -x "$VENV/bin/gpustack" ] || fail "no gpustack in $VENV" "pass the venv gpustack was installed into, or --wheelhouse DIR"
    GPUSTACK="$VENV/bin/gpustack"
elif [ -z "$WHEELHOUSE" ] && command -v gpustack >/dev/null 2>&1; then
    GPUSTACK=$(command -v gpustack)
elif [ -z "$WHEELHOUSE" ] && [ -x "$HERE/../.venv/bin/gpustack" ]; then
    GPUSTACK="$HERE/../.venv/bin/gpustack"
else
    if [ -z "$WHEELHOUSE" ] && ls "$HERE"/gpu_node_stack-*.whl >/dev/null 2>&1; then WHEELHOUSE=$HERE; fi
    [ -n "$WHEELHOUSE" ] || fail "gpustack is not installed here" \
        "build a wheelhouse on a connected machine (scripts/wheelhouse.sh), copy it here and run its gpu-smoke.sh"
    [ -d "$WHEELHOUSE" ] || fail "wheelhouse $WHEELHOUSE is not a directory" "pass the directory scripts/wheelhouse.sh wrote"
    PIPWHEEL=$(ls "$WHEELHOUSE"/pip-*.whl 2>/dev/null | head -n1 || true)
    ls "$WHEELHOUSE"/gpu_node_stack-*.whl >/dev/null 2>&1 && [ -n "$PIPWHEEL" ] \
        || fail "$WHEELHOUSE has no gpustack or pip wheel" "rebuild it with scripts/wheelhouse.sh"
    PY=${PYTHON:-python3}
    command -v "$PY" >/dev/null || fail "$PY not found" "gpustack needs Python >= 3.11 (set PYTHON)"
    "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
        || fail "$("$PY" -V 2>&1) is too old" "gpustack needs Python >= 3.11 (set PYTHON to one)"
    if [ -z "$VENV" ]; then
        VENV=$(mktemp -d "${TMPDIR:-/tmp}/gpustack-smoke-venv.XXXXXX")
        [ "$KEEP" -eq 1 ] || trap 'rm -rf "$VENV"' EXIT
    fi
    echo "Installing gpustack from $WHEELHOUSE into $VENV (offline)" >&2
    # --without-pip: no ensurepip needed (Debian/Ubuntu lack it without python3-venv); pip runs
    # from its wheel. No index and no pip configuration: only the wheelhouse is read.
    "$PY" -m venv --without-pip "$VENV" >/dev/null \
        || fail "cannot create a venv in $VENV" "install the python3 venv module, or pass --venv DIR"
    PIP_CONFIG_FILE=/dev/null "$VENV/bin/python" "$PIPWHEEL/pip" --isolated install --quiet \
        --disable-pip-version-check --no-index --find-links "$WHEELHOUSE" gpu-node-stack >&2 \
        || fail "installing from $WHEELHOUSE failed" "the wheelhouse must match this Python ($("$PY" -V 2>&1)) and architecture ($(uname -m))"
    GPUSTACK="$VENV/bin/gpustack"
fi
echo "Using $("$GPUSTACK" --version) ($GPUSTACK)" >&2
set +e
"$GPUSTACK" smoke --local "${ARGS[@]}"
code=$?
set -e
exit "$code"
