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
echo "== unit tests ($(python -c 'import sys, ansible.release as r; print("Python %d.%d, ansible-core %s" % (*sys.version_info[:2], r.__version__))'))"
pytest -q -n auto tests
echo "== real Kubernetes components (pinned in gpustack/lab/components.py; built once, then cached)"
gpustack lab components --build
echo "== Kubernetes flows against a real kube-apiserver (tests/kube; kwok's stand-in nodes)"
pytest -q -m kube -n 2 tests/kube
# The newest end of the declared ansible-core range (pyproject.toml): Python 3.13 and
# constraints/py3.13.txt in a Debian 13 chroot cached under /var/cache/gpustack (built once).
echo "== unit tests on the newest end of the ansible-core range"
./scripts/controller-trixie.sh setup
./scripts/controller-trixie.sh run python -m pytest -q -n auto -p no:cacheprovider tests/unit
echo "== release artifacts (docs/release.md): built, installed offline, reproducible"
./scripts/release_check.sh
echo "== upgrade makespan benchmark (simulated fleets of 200 and 1,000 nodes; exits non-zero if its targets are missed)"
python benchmarks/upgrade_makespan.py
echo "== lab tests (podman systemd nodes)"
python -c 'from gpustack.lab import podman as p; print("cgroup layout:", p.cgroup_layout(), "| lab OCI runtime:", p.oci_runtime() or "podman default")'
echo "(the Molecule scenarios default and upgrade run in it: tests/lab/test_molecule_*.py)"
pytest -q -m lab -n "${GPUSTACK_LAB_WORKERS:-2}" --dist loadfile --no-loadscope-reorder \
    --durations 25 tests/lab
echo "== lab subset with the newest end's controller (lab nodes from this machine, the CLI in the chroot)"
GPUSTACK_TEST_CONTROLLER="scripts/controller-trixie.sh run python" pytest -q -m lab \
    tests/lab/test_lab.py -k "reachable_nodes or doctor or install_completes or check_mode or unreachable_host"
