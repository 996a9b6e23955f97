#!/usr/bin/env bash
# Build a wheelhouse: gpustack and every runtime dependency as wheels, for one Python version and
# platform, so a host without network installs gpustack with
#   python3 -m venv --without-pip /opt/gpustack
#   /opt/gpustack/bin/python WHEELHOUSE/pip-*.whl/pip install --no-index --find-links WHEELHOUSE gpu-node-stack
# (or ./gpu-smoke.sh inside the wheelhouse, which does that in a temporary venv). docs/gpu-hosts.md.
#
# Wheels only: `pip download --only-binary=:all: --python-version --platform`. pip cannot build an
# sdist for another interpreter or platform, so a dependency that publishes only an sdist makes
# this script stop and name it. Then run the script on a machine like the target (same Python
# version and architecture) with --build-sdists: it builds those sdists into wheels there
# (`pip wheel`); such wheels need a glibc at least as new as the machine that built them.
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: scripts/wheelhouse.sh [options]
  --dest DIR            where to write the wheelhouse (default: ./wheelhouse; must be empty or new)
  --python-version X.Y  target Python (default: this python3's, e.g. 3.11; gpustack needs >= 3.11)
  --arch ARCH           target machine: x86_64 or aarch64 (default: this machine's)
  --glibc 2.N           oldest glibc the wheels may need (default 2.28: EL8, Debian 10+, Ubuntu 20.04+)
  --platform TAG        exact pip platform tag, repeatable (overrides --arch/--glibc)
  --build-sdists        build dependencies that publish only an sdist (target must match this machine)
  --constraints FILE    pin versions (default: constraints/pyX.Y.txt of the checkout for the target
                        Python, when there is one: the versions CI tested)
  --no-constraints      the newest versions gpustack's requirements allow
  --no-check            skip the offline resolution check at the end
Environment: PYTHON (default python3) runs pip; the gpustack source is this checkout.
USAGE
}

fail() { echo "Error: $1" >&2; echo "Hint: $2" >&2; exit "${3:-2}"; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
DEST=./wheelhouse
PYVER=""
ARCH=""
GLIBC=2.28
PLATFORMS=()
BUILD_SDISTS=0
CHECK=1
CONSTRAINTS=""
PINNED=1
while [ $# -gt 0 ]; do
    case "$1" in
        --dest) DEST=${2:?}; shift 2 ;;
        --python-version) PYVER=${2:?}; shift 2 ;;
        --arch) ARCH=${2:?}; shift 2 ;;
        --glibc) GLIBC=${2:?}; shift 2 ;;
        --platform) PLATFORMS+=("${2:?}"); shift 2 ;;
        --build-sdists) BUILD_SDISTS=1; shift ;;
        --constraints) CONSTRAINTS=${2:?}; shift 2 ;;
        --no-constraints) PINNED=0; shift ;;
        --no-check) CHECK=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) fail "unknown option $1" "see scripts/wheelhouse.sh --help" ;;
    esac
done

command -v "$PY" >/dev/null || fail "$PY not found" "install Python >= 3.11 or set PYTHON"
"$PY" -m pip --version >/dev/null 2>&1 || fail "$PY has no pip" "install python3-pip, or set PYTHON to a venv's python"
HERE_VER=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
HERE_ARCH=$(uname -m)
PYVER=${PYVER:-$HERE_VER}
ARCH=${ARCH:-$HERE_ARCH}
[[ $PYVER =~ ^3\.([0-9]+)$ ]] || fail "--python-version $PYVER is not X.Y" "e.g. --python-version 3.12"
[ "${BASH_REMATCH[1]}" -ge 11 ] || fail "gpustack needs Python >= 3.11, not $PYVER" "install python3.11+ on the target (e.g. dnf install python3.11)"
case "$ARCH" in x86_64|aarch64) ;; *) fail "unsupported --arch $ARCH" "use x86_64 or aarch64" ;; esac
[[ $GLIBC =~ ^2\.([0-9]+)$ ]] && [ "${BASH_REMATCH[1]}" -ge 17 ] \
    || fail "--glibc $GLIBC is not 2.N with N >= 17" "e.g. --glibc 2.28"
if [ ${#PLATFORMS[@]} -eq 0 ]; then
    # pip matches platform tags exactly: list every manylinux level the target's glibc accepts.
    minor=${GLIBC#2.}
    for ((m = minor; m >= 17; m--)); do PLATFORMS+=("manylinux_2_${m}_${ARCH}"); done
    PLATFORMS+=("manylinux2014_${ARCH}")  # pip expands it to manylinux2010/manylinux1 too
fi
if [ -e "$DEST" ] && [ -n "$(ls -A "$DEST" 2>/dev/null)" ]; then
    fail "--dest $DEST is not empty" "pass a new or empty directory (a wheelhouse is built once per target)"
fi
PIN=()
if [ "$PINNED" -eq 1 ]; then
    [ -n "$CONSTRAINTS" ] || [ ! -f "$ROOT/constraints/py$PYVER.txt" ] || CONSTRAINTS=$ROOT/constraints/py$PYVER.txt
    if [ -n "$CONSTRAINTS" ]; then
        [ -f "$CONSTRAINTS" ] || fail "--constraints $CONSTRAINTS does not exist" "pass a pip constraints file, e.g. constraints/py3.11.txt"
        PIN=(--constraint "$(cd "$(dirname "$CONSTRAINTS")" && pwd)/$(basename "$CONSTRAINTS")")
    else
        echo "Note: no constraints/py$PYVER.txt: the newest versions gpustack's requirements allow (--constraints FILE pins them)" >&2
    fi
fi
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
ABI="cp${PYVER/./}"
TARGET=(--python-version "$PYVER" --implementation cp --abi "$ABI" --abi abi3 --abi none)
for p in "${PLATFORMS[@]}"; do TARGET+=(--platform "$p"); done

echo "Building the gpustack wheel from $ROOT"
"$PY" -m pip wheel --quiet --no-deps --wheel-dir "$DEST" "$ROOT"
WHEEL=$(ls "$DEST"/gpu_node_stack-*.whl)

echo "Downloading wheels for CPython $PYVER on ${PLATFORMS[0]} … ${PLATFORMS[-1]}"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! "$PY" -m pip download --quiet --dest "$DEST" --only-binary=:all: "${TARGET[@]}" "${PIN[@]}" \
        "$WHEEL" pip >"$log" 2>&1; then
    missing=$(grep -oE 'No matching distribution found for [^ ]+' "$log" | awk '{print $NF}' | sort -u | tr '\n' ' ')
    if [ "$BUILD_SDISTS" -eq 0 ]; then
        cat "$log" >&2
        fail "no wheel of ${missing:-some dependency} for CPython $PYVER on $ARCH (pip cannot build an sdist for another platform)" \
             "run this script with --build-sdists on a machine with Python $PYVER on $ARCH, or put the missing wheels into $DEST and re-run pip download" 1
    fi
    [ "$PYVER" = "$HERE_VER" ] && [ "$ARCH" = "$HERE_ARCH" ] \
        || fail "--build-sdists builds for this machine (Python $HERE_VER, $HERE_ARCH), not for $PYVER/$ARCH" \
                "run the script on a machine matching the target"
    echo "No wheel for: ${missing:-?}; building sdists into wheels here (pip wheel)"
    before=$(ls "$DEST")
    "$PY" -m pip wheel --quiet --prefer-binary --wheel-dir "$DEST" "${PIN[@]}" "$WHEEL" pip
    echo "Built or added here: $(comm -13 <(echo "$before") <(ls "$DEST") | tr '\n' ' ')"
fi

( cd "$DEST" && ls ./*.whl | sed 's|^\./||' | sed -E 's/^([^-]+)-([^-]+)-.*/\1==\2/' | sort > requirements.txt )
cp "$ROOT/scripts/gpu-smoke.sh" "$DEST/gpu-smoke.sh"
cat > "$DEST/README.txt" <<TXT
gpustack wheelhouse: CPython $PYVER, platforms ${PLATFORMS[*]}, ${PIN[1]:+pinned by $(basename "${PIN[1]}")}${PIN[1]:-newest allowed versions}
Built $(date -u -d "@${SOURCE_DATE_EPOCH:-$(date +%s)}" +%Y-%m-%dT%H:%M:%SZ) from $(cd "$ROOT" && git describe --always --dirty 2>/dev/null || echo "a source tree").

Smoke-test this machine (read-only, no network; a temporary venv, removed afterwards):
  ./gpu-smoke.sh                       # add --capture DIR, --report FILE, --image REF, -o json
Install gpustack for good (no network):
  python3 -m venv --without-pip /opt/gpustack
  /opt/gpustack/bin/python $(ls "$DEST" | grep '^pip-.*\.whl$')/pip install --no-index --find-links . gpu-node-stack
  /opt/gpustack/bin/gpustack doctor --local
TXT
( cd "$DEST" && sha256sum ./*.whl gpu-smoke.sh requirements.txt | sed 's| \./| |' > SHA256SUMS )

if [ "$CHECK" -eq 1 ]; then
    # Resolve gpustack for the target from the wheelhouse alone, as the offline host will: no
    # index, no pip configuration (PIP_CONFIG_FILE=/dev/null; --isolated ignores PIP_* variables).
    # `pip download` checks Requires-Python against --python-version (`install --dry-run` did not).
    scratch=$(mktemp -d)
    trap 'rm -f "$log"; rm -rf "$scratch"' EXIT
    if ! PIP_CONFIG_FILE=/dev/null "$PY" -m pip --isolated download --quiet --dest "$scratch" \
            --no-index --find-links "$DEST" --only-binary=:all: "${TARGET[@]}" \
            gpu-node-stack >"$log" 2>&1; then
        cat "$log" >&2
        fail "the wheelhouse does not resolve gpustack offline" "see pip's message above" 1
    fi
fi
count=$(ls "$DEST"/*.whl | wc -l)
echo "Wheelhouse $DEST: $count wheels, $(du -sh "$DEST" | cut -f1), CPython $PYVER $ARCH (glibc >= ${GLIBC} unless --platform)"
