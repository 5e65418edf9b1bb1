"""The chat's pace (bot.app.pacing): Slack's rate by default, an interval of 0 takes no turn."""

from __future__ import annotations

from bot.app.pacing import ChatWrite, Pacer, PaceRules


class VirtualClock:
    """Time moves only when the pacer sleeps; every wait is recorded."""

    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def posts(pacer: Pacer, count: int) -> None:
    for _ in range(count):
        with pacer.turn(ChatWrite.POST, "C0ALERTS"):
            pass


def test_by_default_posts_in_one_channel_are_a_second_apart():
    clock = VirtualClock()
    pacer = Pacer(clock=clock, sleep=clock.sleep)
    posts(pacer, 3)
    assert clock.waits == [1.0, 1.0]
    assert pacer.expected_wait(ChatWrite.POST, "C0ALERTS") == 1.0


def test_an_interval_of_zero_takes_no_turn_for_that_kind_only():
    clock = VirtualClock()
    pacer = Pacer(PaceRules(post_interval=0, update_interval=1.2), clock=clock, sleep=clock.sleep)
    posts(pacer, 3)
    assert clock.waits == [] and pacer.expected_wait(ChatWrite.POST, "C0ALERTS") == 0
    with pacer.turn(ChatWrite.POST, "C0ALERTS"):  # no turn held: a second writer is not kept waiting
        with pacer.turn(ChatWrite.POST, "C0ALERTS", max_wait=0):
            pass
    for _ in range(2):
        with pacer.turn(ChatWrite.UPDATE, "C0ALERTS"):
            pass
    assert clock.waits == [1.2], "updates keep their pace"
