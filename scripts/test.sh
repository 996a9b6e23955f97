#!/usr/bin/env bash
# Every check CI runs: lint, unit tests, then the lab suite on real podman nodes (once).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"

echo "== ruff"
ruff check .
ruff format --check .
echo "== ansible-lint (production profile)"
ansible-lint --offline roles/ playbooks/ molecule/
echo "== only gpustack/ansible/runner.py imports ansible_runner"
offenders=$(grep -rlE '^\s*(import|from) ansible_runner' gpustack | grep -v '^gpustack/ansible/runner.py$' || true)
[ -z "$offenders" ] || { echo "ansible_runner imported outside runner.py: $offenders"; exit 1; }
echo "== only gpustack/k8s/cluster/ imports the kubernetes client"
offenders=$(grep -rlE '^\s*(import|from) kubernetes(\s|\.|$)' gpustack | grep -v '^gpustack/k8s/cluster/' || true)
[ -z "$offenders" ] || { echo "kubernetes imported outside gpustack/k8s/cluster/: $offenders"; exit 1; }
# pytest-xdist: the unit tests on every core; lab files on GPUSTACK_LAB_WORKERS workers (default 2),
# each file on one worker with its own nodes, longest first (tests/lab/conftest.py).
echo "== unit tests"
pytest -q -n auto tests
echo "== real Kubernetes components (pinned in gpustack/lab/components.py; built once, then cached)"
gpustack lab components --build
echo "== Kubernetes flows against a real kube-apiserver (tests/kube; kwok's stand-in nodes)"
pytest -q -m kube -n 2 tests/kube
echo "== upgrade makespan benchmark (simulated fleets of 200 and 1,000 nodes; exits non-zero if its targets are missed)"
python benchmarks/upgrade_makespan.py
echo "== lab tests (podman systemd nodes)"
python -c 'from gpustack.lab import podman as p; print("cgroup layout:", p.cgroup_layout(), "| lab OCI runtime:", p.oci_runtime() or "podman default")'
echo "(the Molecule scenarios default and upgrade run in it: tests/lab/test_molecule_*.py)"
pytest -q -m lab -n "${GPUSTACK_LAB_WORKERS:-2}" --dist loadfile --no-loadscope-reorder \
    --durations 25 tests/lab
