import pytest

from gpustack.ansible.extravars import parse_extra_vars
from gpustack.errors import BadInput, ExitCode


def test_key_value_pairs_are_strings_and_later_wins():
    assert parse_extra_vars(["a=1", "b=x=y", "a=2"]) == {"a": "2", "b": "x=y"}


def test_file_and_mapping(tmp_path):
    f = tmp_path / "vars.yml"
    f.write_text("nvidia_driver_version: 535.261.03-1\nflag: true\n")
    assert parse_extra_vars([f"@{f}", '{"x": [1, 2]}']) == {
        "nvidia_driver_version": "535.261.03-1",
        "flag": True,
        "x": [1, 2],
    }


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("novalue", "is not KEY=VALUE"),
        ("1abc=2", "is not a valid variable name"),
        ("@/nonexistent/vars.yml", "file not found"),
        ("{a: [1,", "YAML parsing failed"),
        ('{"a": 1', "-e"),
    ],
)
def test_bad_items(item, message):
    with pytest.raises(BadInput) as err:
        parse_extra_vars([item])
    assert message in err.value.message
    assert err.value.hint
    assert err.value.exit_code == ExitCode.BAD_INPUT


def test_file_must_hold_a_mapping(tmp_path):
    f = tmp_path / "list.yml"
    f.write_text("- a\n- b\n")
    with pytest.raises(BadInput, match="not a mapping"):
        parse_extra_vars([f"@{f}"])
