#!/usr/bin/env bash
# The main job on a local lab: set up, start 2 podman nodes, `gpustack install`, `gpustack status`.
#
# This machine reaches Debian's archive but not NVIDIA's repositories, so the toolkit comes from
# the labelled local repository built by tests/fixtures/lab_fixtures.py (NVIDIA's runtime, CLI
# and hooks built from their Go module when Go is installed; libnvidia-container a TEST FIXTURE
# stand-in), and the nodes get Debian's containerd first (the runtime gpustack then wires). The
# driver is Debian's.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
INVENTORY=${INVENTORY:-$PWD/lab/demo.ini}
gpustack lab up --name demo --nodes 2 --os debian12 --inventory "$INVENTORY"
VARS=$(python -m tests.fixtures.lab_fixtures --lab demo --with-containerd)
gpustack install "$INVENTORY" -e "@$VARS"
gpustack status "$INVENTORY"
echo "Lab inventory: $INVENTORY (remove the lab with: gpustack lab down --name demo)"
