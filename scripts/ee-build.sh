#!/usr/bin/env bash
# Build the execution environment of execution-environment.yml (docs/collection.md):
#   scripts/ee-build.sh                 # collection tarball + build context in ee/context (no engine needed)
#   scripts/ee-build.sh --build ARGS    # also `ansible-builder build ARGS` (needs podman or docker
#                                       # and the base image, e.g. -t localhost/gpustack-ee:TAG; the
#                                       # default base is made by `python -m gpustack.lab.ee base`)
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-.venv/bin}
rm -rf ee/collection ee/context
mkdir -p ee/collection
"$BIN/ansible-galaxy" collection build --force --output-path ee/collection . >/dev/null
mv ee/collection/gpustack-gpustack-*.tar.gz ee/collection/gpustack-gpustack.tar.gz
if [ "${1:-}" = "--build" ]; then
    shift
    "$BIN/ansible-builder" build -f execution-environment.yml -c ee/context "$@"
else
    "$BIN/ansible-builder" create -f execution-environment.yml -c ee/context
fi
