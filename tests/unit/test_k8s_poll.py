"""The one polling loop of the cluster checks (connect.poll): the DRA `devices` check, the device
plugin's `capacity` check and the `gfd` check wait through it."""

from gpustack.k8s.cluster import connect, dra, gfd, verify


class Clock:
    def __init__(self):
        self.t = 0.0
        self.sleeps = []

    def now(self):
        return self.t

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.t += seconds


def test_done_at_once_neither_sleeps_nor_observes_again():
    clock, calls = Clock(), []

    def observe():
        calls.append(clock.t)
        return "seen", True

    assert connect.poll(observe, 30, 1.0, clock) == ("seen", 0.0)
    assert calls == [0.0] and clock.sleeps == []


def test_observes_until_done():
    clock = Clock()
    answers = iter([("a", False), ("b", False), ("c", True), ("d", True)])
    assert connect.poll(lambda: next(answers), 30, 2.0, clock) == ("c", 4.0)
    assert clock.sleeps == [2.0, 2.0]


def test_gives_up_after_the_timeout_with_the_last_observation():
    clock, calls = Clock(), []

    def observe():
        calls.append(clock.t)
        return len(calls), False

    assert connect.poll(observe, 3, 1.0, clock) == (4, 3.0)
    assert calls == [0.0, 1.0, 2.0, 3.0]  # one last look when the time is up


def test_the_checks_wait_through_it_and_keep_no_loop_of_their_own():
    import inspect

    for module in (dra, verify, gfd):
        source = inspect.getsource(module)
        assert "poll(observe" in source, module.__name__
        assert "while True" not in source, module.__name__
