"""benchmarks/first_install_vs_apt.py: which rounds count towards the medians it prints."""

from __future__ import annotations

from benchmarks import first_install_vs_apt


def _rounds(results):
    calls = iter(results)
    return lambda: next(calls)


def test_a_round_that_fetched_packages_is_not_counted_and_runs_again(capsys):
    cold, warm, next_round = (40.0, 20.0, 15.0, 59), (38.0, 20.0, 14.0, 0), (37.0, 21.0, 13.0, 0)
    measured = first_install_vs_apt.counted_rounds(2, _rounds([cold, warm, next_round]))
    assert measured == [warm, next_round]
    out = capsys.readouterr().out
    assert "not counted: gpustack's run fetched 59 packages" in out
    assert out.count("round 1/2") == 2 and out.count("round 2/2") == 1


def test_only_one_round_is_run_again(capsys):
    """A cache that keeps losing packages must not loop: the repeat counts whatever it fetched."""
    first, second = (40.0, 20.0, 15.0, 59), (39.0, 20.0, 15.0, 3)
    assert first_install_vs_apt.counted_rounds(1, _rounds([first, second])) == [second]
    assert capsys.readouterr().out.count("not counted") == 1


def test_rounds_without_downloads_all_count():
    rounds = [(38.0, 20.0, 14.0, 0), (37.0, 20.5, 13.5, 0), (39.0, 19.5, 14.5, 0)]
    assert first_install_vs_apt.counted_rounds(3, _rounds(rounds)) == rounds
