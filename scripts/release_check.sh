#!/usr/bin/env bash
# CI's release check (scripts/test.sh; docs/release.md): build the release, install the wheel
# offline from the wheelhouse into a fresh venv and run it there, install the collection from its
# tarball offline, and build wheel, sdist and collection again to compare checksums.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
VERSION=$(python3 -c 'import tomllib; print(tomllib.load(open("pyproject.toml", "rb"))["project"]["version"])')
ARCH=$(uname -m)

./scripts/release.sh --dest "$OUT/rel" >"$OUT/release.log" 2>&1 || { cat "$OUT/release.log"; exit 1; }
( cd "$OUT/rel" && sha256sum -c --quiet SHA256SUMS )
echo "built: $(cd "$OUT/rel" && ls | tr '\n' ' ')"

interpreter() {  # a python3.X that runs: on PATH, else pyenv's (whose shims may not run it)
    local candidate
    for candidate in $(command -v "python$1" 2>/dev/null) \
            $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1"*/bin/"python$1" 2>/dev/null); do
        if "$candidate" -c 'import venv' >/dev/null 2>&1; then echo "$candidate"; return; fi
    done
}

for v in 3.11 3.12 3.13; do
    py=$(interpreter "$v")
    if [ -z "$py" ]; then echo "CPython $v: no interpreter here, wheelhouse built but not installed"; continue; fi
    name="gpu-node-stack-$VERSION-wheelhouse-cp${v/./}-$ARCH"
    tar xzf "$OUT/rel/$name.tar.gz" -C "$OUT"
    "$py" -m venv "$OUT/venv$v"
    # No index, no pip configuration: only the wheelhouse is read.
    PIP_CONFIG_FILE=/dev/null "$OUT/venv$v/bin/pip" --isolated install --quiet --no-index \
        --disable-pip-version-check --find-links "$OUT/$name" gpu-node-stack
    gs="$OUT/venv$v/bin/gpustack"
    "$gs" --help >/dev/null
    [ "$("$gs" --version)" = "gpustack $VERSION" ]
    if [ "$v" = 3.11 ]; then
        # doctor on this machine, from the installed package: its state under $OUT
        GPUSTACK_STATE_DIR="$OUT/state" "$gs" doctor --local >"$OUT/doctor.log" 2>&1 \
            || { cat "$OUT/doctor.log"; exit 1; }
        # every doc the code names is in the installed package, and hints print its path
        # -I, from $OUT: the installed package, not this checkout's gpustack/
        (cd "$OUT" && "$OUT/venv$v/bin/python" -I - "$ROOT") <<'PYTHON'
import re, sys
from pathlib import Path
from gpustack import paths
root = Path(sys.argv[1])
assert "site-packages" in str(paths.content_root()), paths.content_root()
named = set()
for path in [*(root / "gpustack").rglob("*.py"), *(root / "roles").rglob("*.yml")]:
    named |= set(re.findall(r"docs/([\w.-]+\.md)", path.read_text()))
missing = sorted(n for n in named if not (paths.docs_dir() / n).is_file())
assert not missing, f"not in the installed package: {missing}"
hint = paths.resolve_doc_references("see docs/variables.md")
assert Path(hint.removeprefix("see ")).is_file(), hint
assert (paths.content_root() / "LICENSE").is_file()
print(f"installed docs: {len(named)} named, all in {paths.docs_dir()}")
PYTHON
    fi
    echo "CPython $v ($py): installed offline from the wheelhouse; --help, --version ok"
done
echo "doctor --local from the installed wheel: ok"

# The collection from its tarball, offline, and ansible-doc on an installed module.
# From $OUT, away from the checkout's ansible.cfg (whose collections path holds the checkout
# itself, which ansible-galaxy would take for the collection already installed).
(cd "$OUT" && "$ROOT/.venv/bin/ansible-galaxy" collection install --offline --force \
    -p "$OUT/collections" "$OUT/rel/gpustack-gpustack-$VERSION.tar.gz" >/dev/null 2>&1)
test -f "$OUT/collections/ansible_collections/gpustack/gpustack/LICENSE"
(cd "$OUT" && ANSIBLE_COLLECTIONS_PATH="$OUT/collections" \
    "$ROOT/.venv/bin/ansible-doc" gpustack.gpustack.gpustack_host_probe >/dev/null)
echo "collection: installed offline from its tarball"

# Reproducible: wheel, sdist and collection built again from the same tree, same bytes.
./scripts/release.sh --no-wheelhouse --dest "$OUT/again" >"$OUT/again.log" 2>&1 || { cat "$OUT/again.log"; exit 1; }
for f in "gpu_node_stack-$VERSION-py3-none-any.whl" "gpu_node_stack-$VERSION.tar.gz" "gpustack-gpustack-$VERSION.tar.gz"; do
    cmp "$OUT/rel/$f" "$OUT/again/$f" || { echo "not reproducible: $f"; exit 1; }
done
echo "reproducible: wheel, sdist and collection identical when built twice"
