#!/usr/bin/env bash
# Molecule with the project's virtual environment on PATH: Molecule itself calls
# ansible-config, ansible-playbook and pytest by name. Usage: ./scripts/molecule.sh test -s default
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/molecule ] || ./scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
exec molecule "$@"
