"""How fast the bot may write to the chat: Slack allows about one message per second per channel
and about 50 message updates a minute (chat.update, Tier 3). Past that it answers 429 with a
Retry-After, and a storm of crashes meets a wall of them.

So the bot takes turns: every post in a channel waits for that channel's turn, every message
update for the updates' turn, one at a time, spaced by the interval. A 429 all the same (another
replica or app shares the limit): the call that met it waits its Retry-After and is retried
while it still holds the turn (bot.support.retrying honours it), so no other call of the bot
runs into the same wall and no 429 is answered twice. A top-level incident post may not wait longer than its post budget (the post
lease must still hold when it is sent): past that it is not sent now (`TurnTooFar`) and stays
pending; the sweep posts it when the channel has a turn (bot/app/posting.py).

An interval of 0 means unpaced: that kind of write takes no turn at all (no wait, no lock), for a
Slack-compatible endpoint with other limits (VLLM_ONCALL_SLACK_POST_INTERVAL / _UPDATE_INTERVAL).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum


class ChatWrite(StrEnum):
    POST = "post"  # chat.postMessage: a message or a thread reply, per channel
    UPDATE = "update"  # chat.update: per workspace


@dataclass(frozen=True)
class PaceRules:
    post_interval: float = 1.0  # seconds between two posts in one channel (0: unpaced)
    update_interval: float = 1.2  # seconds between two updates: 50 a minute (0: unpaced)


class TurnTooFar(Exception):
    """The next turn is further away than the caller may wait."""

    def __init__(self, wait: float):
        super().__init__(f"the channel's next posting turn is {wait:.0f}s away: posted later")
        self.wait = wait


class Pacer:
    """Turns per (kind, channel), thread-safe, on an injectable clock. `sleep` must wait on the
    same clock (tests pass a virtual one shared with the Slack stand-in)."""

    def __init__(self, rules: PaceRules = PaceRules(), clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep):
        self.rules, self.clock, self.sleep = rules, clock, sleep
        self._guard = threading.Lock()
        self._locks: dict[tuple[ChatWrite, str], threading.Lock] = {}
        self._next: dict[tuple[ChatWrite, str], float] = {}
        self._queued: dict[tuple[ChatWrite, str], int] = {}

    def _key(self, kind: ChatWrite, channel: str) -> tuple[ChatWrite, str]:
        return (kind, channel if kind is ChatWrite.POST else "*")

    def _interval(self, kind: ChatWrite) -> float:
        return self.rules.post_interval if kind is ChatWrite.POST else self.rules.update_interval

    def expected_wait(self, kind: ChatWrite, channel: str) -> float:
        """Seconds until a turn asked for now would come: the next turn plus everyone queued."""
        if self._interval(kind) <= 0:
            return 0.0
        key = self._key(kind, channel)
        with self._guard:
            ahead = self._queued.get(key, 0) * self._interval(kind)
            return max(0.0, self._next.get(key, float("-inf")) - self.clock()) + ahead

    @contextmanager
    def turn(self, kind: ChatWrite, channel: str, max_wait: float | None = None) -> Iterator[None]:
        """Wait for the turn, hold it while the caller writes (and retries), then space the next."""
        if self._interval(kind) <= 0:  # unpaced: concurrent writes, no turns
            yield
            return
        key = self._key(kind, channel)
        if max_wait is not None:
            wait = self.expected_wait(kind, channel)
            if wait > max_wait:
                raise TurnTooFar(wait)
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
            self._queued[key] = self._queued.get(key, 0) + 1
        with lock:
            with self._guard:
                self._queued[key] -= 1
                wait = self._next.get(key, float("-inf")) - self.clock()
            if wait > 0:
                self.sleep(wait)
            try:
                yield
            finally:
                with self._guard:
                    self._next[key] = max(self._next.get(key, float("-inf")), self.clock() + self._interval(kind))
