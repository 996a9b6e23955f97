import pytest

from gpustack.ansible.inventory import load_inventory
from gpustack.errors import BadInput


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_ini_targets_gpu_nodes_group(tmp_path):
    inv = write(tmp_path, "inv.ini", "[gpu_nodes]\ng1 ansible_host=10.0.0.1\ng2\n[cpu]\nc1\n")
    result = load_inventory(inv)
    assert result.target_group == "gpu_nodes"
    assert result.hosts == ["g1", "g2"]
    assert result.hostvars["g1"]["ansible_host"] == "10.0.0.1"


def test_yaml_without_gpu_nodes_targets_all_hosts(tmp_path):
    inv = write(
        tmp_path,
        "inv.yml",
        "all:\n  hosts:\n    a: {}\n  children:\n    workers:\n      hosts:\n        b: {}\n",
    )
    result = load_inventory(inv)
    assert result.target_group == "all"
    assert sorted(result.hosts) == ["a", "b"]


def test_limit_narrows_and_must_match(tmp_path):
    inv = write(tmp_path, "inv.ini", "[gpu_nodes]\ng1\ng2\ng3\n")
    assert load_inventory(inv, "g2:g3").hosts == ["g2", "g3"]
    with pytest.raises(BadInput, match="matches no host") as err:
        load_inventory(inv, "nosuch")
    assert "g1, g2, g3" in err.value.hint


def test_limit_outside_target_group_matches_nothing(tmp_path):
    inv = write(tmp_path, "inv.ini", "[gpu_nodes]\ng1\n[cpu]\nc1\n")
    with pytest.raises(BadInput, match="matches no host in gpu_nodes"):
        load_inventory(inv, "c1")


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("broken.ini", "[gpu_nodes\nnode1\n", "cannot parse inventory"),
        ("broken.yml", "all:\n  hosts: [a\n", "YAML parsing failed"),
        ("empty.ini", "[gpu_nodes]\n[cpu]\nc1\n", "no hosts in group gpu_nodes"),
        ("nohosts.ini", "# nothing here\n", "has no hosts"),
    ],
)
def test_bad_inventories(tmp_path, name, text, message):
    with pytest.raises(BadInput, match=message) as err:
        load_inventory(write(tmp_path, name, text))
    assert err.value.hint


def test_missing_inventory(tmp_path):
    with pytest.raises(BadInput, match="does not exist"):
        load_inventory(tmp_path / "nope.ini")


def test_unreadable_inventory():
    # /proc/self/mem exists but reading it at offset 0 fails (EIO), even as root.
    with pytest.raises(BadInput, match="is not readable"):
        load_inventory("/proc/self/mem")
