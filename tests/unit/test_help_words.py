"""Every command's --help names values in words (FILE, N, SECONDS), never Python types."""

import re

import pytest
from typer.testing import CliRunner

from gpustack.cli import app

COMMANDS = [
    ["doctor"], ["install"], ["plan"], ["status"], ["verify"], ["smoke"], ["uninstall"],
    ["upgrade"], ["mig"], ["manifests"], ["lab", "up"], ["lab", "down"], ["lab", "list"], [],
]  # fmt: skip
PYTHON_TYPES = re.compile(r"<(str|int|float|bool|list\[.*?\]|\w+ range)>|\bx[<>]=|<=x\b")


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "gpustack")
def test_help_shows_no_python_types(command):
    result = CliRunner().invoke(app, [*command, "--help"])
    assert result.exit_code == 0, result.output
    assert not PYTHON_TYPES.search(result.output), result.output


def test_ranges_and_values_read_as_words():
    upgrade = CliRunner().invoke(app, ["upgrade", "--help"]).output
    assert "--max-parallel N" in upgrade and "1 to 100000" in upgrade
    assert "--validation-timeout SECONDS" in upgrade and "--kubeconfig FILE" in upgrade
    lab = CliRunner().invoke(app, ["lab", "up", "--help"]).output
    assert "1 to 16" in lab
    install = CliRunner().invoke(app, ["install", "--help"]).output
    assert "-e, --extra-vars VARS" in install and "-f, --forks N" in install
    assert "INVENTORY  Ansible inventory" in install
