"""Kubeconfig problems: Error + Hint, and nothing run on any host.

No cluster is involved: a kubeconfig that does not exist, does not parse or names no cluster,
and one whose server is an address where nothing listens (127.0.0.1:9).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gpustack.errors import BadInput
from gpustack.k8s.cluster import connect
from tests.builders import inventory
from tests.conftest import run_cli, runs_started

DEAD_SERVER = "http://127.0.0.1:9"


def dead_kubeconfig(path: Path) -> Path:
    """A kubeconfig (token auth, plain HTTP) whose server is an address where nothing listens."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "dead", "cluster": {"server": DEAD_SERVER}}],
        "users": [{"name": "tester", "user": {"token": "a-token"}}],
        "contexts": [{"name": "dead", "context": {"cluster": "dead", "user": "tester"}}],
        "current-context": "dead",
    }
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


def test_kubeconfig_missing_malformed_unreachable(tmp_path):
    with pytest.raises(BadInput, match="does not exist"):
        connect.connect(str(tmp_path / "nope"))
    bad = tmp_path / "bad"
    bad.write_text("clusters: [unclosed\n")
    with pytest.raises(BadInput, match="is not usable") as info:
        connect.connect(str(bad))
    assert "kubectl --kubeconfig" in info.value.hint
    empty = tmp_path / "empty"
    empty.write_text("apiVersion: v1\nkind: Config\n")
    with pytest.raises(BadInput, match="is not usable"):
        connect.connect(str(empty))
    dead = dead_kubeconfig(tmp_path / "dead")
    with pytest.raises(
        BadInput, match=r"cannot reach the Kubernetes API server at http://127\.0\.0\.1:9"
    ):
        connect.check_reachable(connect.connect(str(dead)))


def test_kubeconfig_needed_for_verify(monkeypatch):
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(BadInput, match="no kubeconfig"):
        connect.connect(None)
    assert connect.connect(None, required=False) is None


@pytest.mark.parametrize(
    ("command", "problem", "message"),
    [
        ("install", "missing", "Error: kubeconfig"),
        ("install", "malformed", "is not usable"),
        ("install", "unreachable", "cannot reach the Kubernetes API server"),
        ("verify", "unreachable", "cannot reach the Kubernetes API server"),
        ("uninstall", "malformed", "is not usable"),
    ],
)
def test_cli_kubeconfig_problems_run_nothing(tmp_path, state_dir, command, problem, message):
    inv = inventory(tmp_path, ["gpu1"])
    path = tmp_path / "kubeconfig"
    if problem == "malformed":
        path.write_text("this: [is not: a kubeconfig\n")
    elif problem == "unreachable":
        dead_kubeconfig(path)
    args = [command, str(inv.path), "--kubeconfig", str(path)]
    if command == "uninstall":
        args += ["--components", "k8s,driver", "--yes"]
    result = run_cli(*args, timeout=120)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Hint:" in result.stderr
    assert "Traceback" not in result.stderr
    assert runs_started(state_dir) == []  # nothing ran on any host
