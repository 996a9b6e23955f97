"""After the upgrade side effect: bookworm-updates' driver, pinned and held."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from driver_checks import assert_driver_at


def test_driver_at_new_version(host):
    hostvars = host.ansible.get_variables()
    assert_driver_at(host, hostvars["upgrade_new_version"], hostvars["upgrade_old_version"])
