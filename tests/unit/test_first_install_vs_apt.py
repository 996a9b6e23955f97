"""benchmarks/first_install_vs_apt.py: which rounds count towards the medians it prints."""

from __future__ import annotations

from benchmarks import first_install_vs_apt, run_profile


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


def test_the_floor_steps_and_each_nodes_own_turn_on_the_apt_lock(capsys):
    """Node 4's install waited for node 3's turn on the lab's apt lock: its own turn starts at
    node 3's end."""
    out = {"n3": "noise\nfloor-steps 100.0 100.1 101.6 111.0\n",
           "n4": "floor-steps 100.05 100.15 101.7 121.0\n"}  # fmt: skip
    steps = first_install_vs_apt.floor_steps(out)
    assert [round(v, 2) for v in steps["n4"]] == [0.1, 1.55, 19.3, 21.0]
    first_install_vs_apt.print_floor_steps(out)
    first, second = capsys.readouterr().out.splitlines()
    assert (
        "n3: sources 0.1 s, apt-get update 1.5 s, apt-get install 9.4 s (its own turn 9.4" in first
    )
    assert "apt-get install 19.3 s (its own turn 10.0 s), done at 21.0 s" in second


def test_turns_on_a_shared_lock():
    spans = {"a": (7.85, 19.48), "b": (7.86, 30.30), "c": (40.0, 45.0)}
    own = run_profile.turns(spans)
    assert {h: round(s, 2) for h, s in own.items()} == {"a": 11.63, "b": 10.82, "c": 5.0}


def test_seeding_the_benchmark_cache_tolerates_another_process_seeding_it(tmp_path, monkeypatch):
    """Two pytest-xdist workers import benchmarks.labbench at once: both find a package missing in
    the benchmark's cache, one links it first, the other's link finds it there (a clean-clone CI
    run failed on the copy that followed: "are the same file")."""
    import os

    from benchmarks import labbench

    (tmp_path / "gpustack/apt-archives").mkdir(parents=True)
    (tmp_path / "gpustack/apt-archives/pkg_1_amd64.deb").write_text("deb")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("GPUSTACK_LAB_CACHE", raising=False)
    monkeypatch.delenv("GPUSTACK_BENCH_CACHE_NAME", raising=False)
    link = os.link

    def raced(source, target):  # the other worker links first
        link(source, target)
        raise FileExistsError(17, "File exists")

    monkeypatch.setattr(labbench.os, "link", raced)
    labbench._private_cache()
    seeded = tmp_path / "gpustack-bench/apt-archives/pkg_1_amd64.deb"
    assert seeded.read_text() == "deb" and seeded.stat().st_nlink == 2
    assert os.environ["GPUSTACK_LAB_CACHE"] == str(tmp_path / "gpustack-bench")


def test_each_round_names_the_controllers_ansible_core_and_python():
    """The figures are for one ansible-core and Python: the round says which."""
    import platform

    from ansible.release import __version__

    assert first_install_vs_apt.controller() == (
        f"ansible-core {__version__}, Python {platform.python_version()}"
    )
