#!/usr/bin/env bash
# Set up a fresh Debian/Ubuntu machine for gpustack: system packages (apt), .venv, gpustack.
# Idempotent; needs root for apt (it re-runs itself with sudo when it can).
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(podman runc debootstrap openssh-client uidmap ca-certificates git apt-utils gnupg dpkg-dev
          gcc libc6-dev)  # gcc, libc6-dev: the lab compiles Kubernetes' pause.c (static)
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null; then exec sudo -E "$0" "$@"; fi
    echo "Error: setup needs root (apt, podman --privileged, debootstrap)" >&2
    echo "Hint: run it as root or install sudo" >&2
    exit 2
fi
missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$pkg")
done
PYTHON=${PYTHON:-python3}
if ! "$PYTHON" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    missing+=(python3 python3-venv)
fi
if [ ${#missing[@]} -gt 0 ]; then
    echo "Installing system packages: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Reproducible: the versions CI tested for this Python (constraints/pyX.Y.txt, a `pip freeze` of a
# clean venv); a Python without such a file gets the newest versions pyproject.toml allows.
PYVER=$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
CONSTRAINTS=constraints/py$PYVER.txt
PIN=()
if [ -f "$CONSTRAINTS" ]; then
    PIN=(-c "$CONSTRAINTS")
else
    echo "Note: no $CONSTRAINTS; installing the newest versions pyproject.toml allows" >&2
    CONSTRAINTS=pyproject.toml
fi
if [ ! -x .venv/bin/gpustack ] || [ pyproject.toml -nt .venv/.installed ] \
        || [ "$CONSTRAINTS" -nt .venv/.installed ]; then
    "$PYTHON" -m venv .venv
    .venv/bin/pip install -q --disable-pip-version-check "${PIN[@]}" -e '.[test]'
    touch .venv/.installed
fi
# The checkout is the collection gpustack.gpustack; ansible.cfg finds it through this link
# (ansible-lint, ansible-playbook and ansible-doc run from the checkout; docs/collection.md).
mkdir -p .collections/ansible_collections/gpustack
ln -sfn ../../.. .collections/ansible_collections/gpustack/gpustack
echo "Set-up done: $(.venv/bin/gpustack --version)"
