#!/usr/bin/env bash
# The main job on a local lab: set up, start 2 podman nodes, `gpustack install`, `gpustack status`.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
INVENTORY=${INVENTORY:-$PWD/lab/demo.ini}
gpustack lab up --name demo --nodes 2 --os debian12 --inventory "$INVENTORY"
gpustack install "$INVENTORY"
gpustack status "$INVENTORY"
echo "Lab inventory: $INVENTORY (remove the lab with: gpustack lab down --name demo)"
