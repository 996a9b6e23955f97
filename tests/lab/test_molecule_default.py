"""`molecule test -s default` on lab nodes, inside the lab suite (tests/lab/molecule_scenario.py)."""

import pytest

from tests.lab.molecule_scenario import molecule_test

pytestmark = pytest.mark.lab


def test_molecule_default_scenario_passes():
    molecule_test("default")
