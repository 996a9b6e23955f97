#!/usr/bin/env bash
# Build gpustack's release artifacts, reproducibly, into one directory:
#   gpu_node_stack-VERSION-py3-none-any.whl       the CLI with its roles, playbooks and docs
#   gpu_node_stack-VERSION.tar.gz                 the source distribution
#   gpustack-gpustack-VERSION.tar.gz              the Ansible collection gpustack.gpustack
#   gpu-node-stack-VERSION-wheelhouse-cpXY-ARCH.tar.gz   per supported Python: every wheel an
#                                                 offline host needs (scripts/wheelhouse.sh)
#   SHA256SUMS
# Timestamps come from SOURCE_DATE_EPOCH (default: the last commit's time), archives are packed
# in name order with fixed owners, modes and gzip headers: the same commit and the same
# dependency versions give the same bytes. Dependency versions are pip's choice unless pinned:
# PIP_CONSTRAINT=FILE (pip's own variable) pins the wheelhouses. Needs PyPI (the build backend
# and the wheelhouses' wheels). docs/release.md.
set -euo pipefail

usage() {
    cat <<'USAGE'
Usage: scripts/release.sh [options]
  --dest DIR              where to write the artifacts (default: dist/VERSION; must be new or empty)
  --python-versions LIST  wheelhouses for these CPython versions (default: "3.11 3.12 3.13")
  --arch ARCH             wheelhouse machine: x86_64 or aarch64 (default: this machine's)
  --no-wheelhouse         wheel, sdist and collection only
Environment: SOURCE_DATE_EPOCH (default: the last commit's time), PIP_CONSTRAINT, PYTHON (python3).
USAGE
}

fail() { echo "Error: $1" >&2; echo "Hint: $2" >&2; exit "${3:-2}"; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
DEST=""
PYVERS="3.11 3.12 3.13"
ARCH=$(uname -m)
WHEELHOUSE=1
while [ $# -gt 0 ]; do
    case "$1" in
        --dest) DEST=${2:?}; shift 2 ;;
        --python-versions) PYVERS=${2:?}; shift 2 ;;
        --arch) ARCH=${2:?}; shift 2 ;;
        --no-wheelhouse) WHEELHOUSE=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) fail "unknown option $1" "see scripts/release.sh --help" ;;
    esac
done

cd "$ROOT"
# One version everywhere: the distribution, the package, the collection, the changelogs.
VERSION=$("$PY" -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
[[ $VERSION =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "version $VERSION in pyproject.toml is not X.Y.Z" "use a semantic version"
PKG=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' gpustack/__init__.py)
GALAXY=$(sed -n 's/^version: //p' galaxy.yml)
[ "$PKG" = "$VERSION" ] && [ "$GALAXY" = "$VERSION" ] \
    || fail "versions disagree: pyproject.toml $VERSION, gpustack/__init__.py $PKG, galaxy.yml $GALAXY" "set the same X.Y.Z in all three"
grep -q "^## \[$VERSION\]" CHANGELOG.md \
    || fail "CHANGELOG.md has no section for $VERSION" "add '## [$VERSION] - YYYY-MM-DD' (Keep a Changelog)"
if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
    echo "Note: the working tree has uncommitted changes; the artifacts are not those of a commit" >&2
fi

export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct 2>/dev/null || echo 315532800)}
DEST=${DEST:-dist/$VERSION}
if [ -e "$DEST" ] && [ -n "$(ls -A "$DEST" 2>/dev/null)" ]; then
    fail "--dest $DEST is not empty" "pass a new or empty directory"
fi
mkdir -p "$DEST"
DEST=$(cd "$DEST" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# Python's build front end in a throwaway venv (the backend, hatchling, comes from PyPI in its
# isolated build environment, as pip does it).
"$PY" -m venv "$WORK/tools"
"$WORK/tools/bin/pip" install --quiet --disable-pip-version-check build
echo "Building wheel and sdist of gpu-node-stack $VERSION (SOURCE_DATE_EPOCH=$SOURCE_DATE_EPOCH)"
"$WORK/tools/bin/python" -m build --sdist --wheel --outdir "$DEST" . >"$WORK/build.log" 2>&1 \
    || { cat "$WORK/build.log" >&2; fail "the Python build failed" "see the output above" 1; }

# ansible-galaxy stamps MANIFEST.json and FILES.json with the build time and keeps the files'
# own mtimes: repack (same members, same content) in a fixed form.
repack() {  # repack SRC.tar.gz DEST.tar.gz [DIR: pack this directory instead, under PREFIX]
    "$PY" - "$@" <<'PYTHON'
import gzip, io, os, sys, tarfile
epoch = int(os.environ["SOURCE_DATE_EPOCH"])
src, dest = sys.argv[1], sys.argv[2]
members = []  # (TarInfo, bytes or None)
if os.path.isdir(src):
    prefix = sys.argv[3]
    for top, dirs, files in os.walk(src):
        dirs.sort()
        rel = os.path.relpath(top, src)
        base = prefix if rel == "." else prefix + "/" + rel
        info = tarfile.TarInfo(base)
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        members.append((info, None))
        for name in sorted(files):
            path = os.path.join(top, name)
            data = open(path, "rb").read()
            info = tarfile.TarInfo(base + "/" + name)
            info.size, info.mode = len(data), 0o755 if os.access(path, os.X_OK) else 0o644
            members.append((info, data))
else:
    with tarfile.open(src) as tar:
        for info in tar.getmembers():
            data = tar.extractfile(info).read() if info.isfile() else None
            info.mode = 0o755 if info.isdir() or info.mode & 0o111 else 0o644
            members.append((info, data))
    first = {"MANIFEST.json": 0, "FILES.json": 1}  # where ansible-galaxy puts them
    members.sort(key=lambda m: (first.get(m[0].name, 2), m[0].name))
raw = io.BytesIO()
with tarfile.open(fileobj=raw, mode="w", format=tarfile.GNU_FORMAT) as tar:
    for info, data in members:
        info.mtime, info.uid, info.gid, info.uname, info.gname = epoch, 0, 0, "", ""
        tar.addfile(info, io.BytesIO(data) if data is not None else None)
with open(dest, "wb") as out, gzip.GzipFile(fileobj=out, mode="wb", mtime=0, filename="") as gz:
    gz.write(raw.getvalue())
PYTHON
}

echo "Building the collection gpustack.gpustack $VERSION"
BIN=${BIN:-$ROOT/.venv/bin}
[ -x "$BIN/ansible-galaxy" ] || fail "no ansible-galaxy in $BIN" "run ./scripts/setup.sh first (or set BIN)"
# From the tracked files only: nothing local (lab state, caches, builds) can slip in.
mkdir -p "$WORK/src"
git ls-files -z | tar --null -T - -cf - | tar -xf - -C "$WORK/src"
"$BIN/ansible-galaxy" collection build --output-path "$WORK/collection" "$WORK/src" >/dev/null
repack "$WORK/collection/gpustack-gpustack-$VERSION.tar.gz" "$DEST/gpustack-gpustack-$VERSION.tar.gz"

if [ "$WHEELHOUSE" -eq 1 ]; then
    for v in $PYVERS; do
        tag="cp${v/./}"
        echo "Building the wheelhouse for CPython $v ($ARCH)"
        PYTHON="$WORK/tools/bin/python" "$ROOT/scripts/wheelhouse.sh" --dest "$WORK/wh-$tag" \
            --python-version "$v" --arch "$ARCH" >"$WORK/wh-$tag.log" 2>&1 \
            || { cat "$WORK/wh-$tag.log" >&2; fail "the CPython $v wheelhouse failed" "see the output above" 1; }
        name="gpu-node-stack-$VERSION-wheelhouse-$tag-$ARCH"
        repack "$WORK/wh-$tag" "$DEST/$name.tar.gz" "$name"
    done
fi

# Every archive must carry the licence.
"$PY" - "$DEST" "$VERSION" <<'PYTHON'
import sys, tarfile, zipfile
dest, version = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(f"{dest}/gpu_node_stack-{version}-py3-none-any.whl").namelist()
sdist = tarfile.open(f"{dest}/gpu_node_stack-{version}.tar.gz").getnames()
collection = tarfile.open(f"{dest}/gpustack-gpustack-{version}.tar.gz").getnames()
missing = [name for name, ok in (
    ("wheel", f"gpu_node_stack-{version}.dist-info/licenses/LICENSE" in wheel),
    ("sdist", f"gpu_node_stack-{version}/LICENSE" in sdist),
    ("collection", "LICENSE" in collection),
) if not ok]
if missing:
    sys.exit("Error: no LICENSE in the " + ", ".join(missing))
PYTHON

( cd "$DEST" && sha256sum -- *.whl *.tar.gz > SHA256SUMS )
echo "Release $VERSION in $DEST:"
( cd "$DEST" && cat SHA256SUMS )
