#!/usr/bin/env bash
# Build the execution environment of execution-environment.yml (docs/collection.md):
#   scripts/ee-build.sh                 # collection tarball + build context in ee/context (no engine needed)
#   scripts/ee-build.sh --build ARGS    # also `ansible-builder build ARGS` (needs podman/docker and
#                                       # the base image's registry, e.g. -t REGISTRY/gpustack-ee:TAG
#                                       # --build-arg EE_BASE_IMAGE=REGISTRY/base:TAG)
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
