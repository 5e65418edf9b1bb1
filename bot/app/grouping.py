"""Storms: many incidents waiting for one channel's posting turn go out as one grouped message.

Slack allows about one post per second per channel (bot/app/pacing.py), and each incident is a
message plus its details reply: 250 workloads crashing at once would take minutes to name. So
the incidents whose top-level post waits for a channel's turn gather here. One poster at a time
per channel (the first to arrive, the leader) posts for all of them, turn by turn. At each turn,
when more than GROUP_AFTER are waiting (or a group went out in the channel within STORM_WINDOW:
the storm is still on), up to GROUP_LINES of them are posted as ONE grouped message with a line
per workload; otherwise the oldest alone, as its usual message. A grouped line is that incident's
top-level post (recorded on it, Incident.group); its own message, with Approve / Reject and its
details, follows in the group's thread when the channel has turns to spare (bot/app/posting.py).

In memory, per replica: another replica gathers its own incidents (its own post leases).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from bot.app.records import Incident

# A backlog of more than this many incidents in one channel is posted as a grouped message; up to
# this many still go out one by one (a storm of 2-3 crashes keeps its usual messages).
GROUP_AFTER = 3
# Lines per grouped message: Slack takes at most 50 blocks per message, and the header, the counts
# by namespace and the thread hint take three; more waiting incidents make more grouped messages.
GROUP_LINES = 45
# After a grouped message, the channel is in a storm this long: whatever is waiting at the next turn,
# even one incident, joins a new group, so the storm reads as groups, not a mix.
STORM_WINDOW = timedelta(minutes=2)


@dataclass(frozen=True)
class Batch:
    """What the leader posts at one turn: one incident's own message, or a grouped message."""

    incidents: list[Incident]
    grouped: bool


@dataclass
class _Channel:
    waiting: dict[str, Incident] = field(default_factory=dict)  # by name, oldest first
    leading: bool = False  # a poster is posting this channel's backlog
    last_group: datetime | None = None


class Gathering:
    """The incidents waiting for each channel's turn, thread-safe."""

    def __init__(self, clock: Callable[[], datetime], group_after: int = GROUP_AFTER,
                 group_lines: int = GROUP_LINES, storm_window: timedelta = STORM_WINDOW):
        self.clock, self.group_after, self.group_lines, self.storm_window = clock, group_after, group_lines, storm_window
        self._lock = threading.Lock()
        self._channels: dict[str, _Channel] = {}

    def join(self, channel: str, incident: Incident) -> bool:
        """Wait for `channel`'s turn. True: the caller leads (posts `next_batch` until it returns
        None); False: a leader is posting the channel's backlog and will post this one too."""
        with self._lock:
            state = self._channels.setdefault(channel, _Channel())
            state.waiting[incident.name] = incident
            if state.leading:
                return False
            state.leading = True
            return True

    def next_batch(self, channel: str) -> Batch | None:
        """The leader's next post; None: nothing waits any more, and the caller leads no longer."""
        with self._lock:
            state = self._channels[channel]
            if not state.waiting:
                state.leading = False
                return None
            now = self.clock()
            storm = state.last_group is not None and now - state.last_group < self.storm_window
            if storm or len(state.waiting) > self.group_after:
                names = list(state.waiting)[:self.group_lines]
                state.last_group = now
                return Batch([state.waiting.pop(name) for name in names], grouped=True)
            name = next(iter(state.waiting))
            return Batch([state.waiting.pop(name)], grouped=False)

    def abandon(self, channel: str) -> None:
        """The leader failed: the next incident to wait leads (the ones left wait for it, or the sweep)."""
        with self._lock:
            self._channels[channel].leading = False

    def busy(self, channel: str) -> bool:
        """A leader is posting the channel's backlog: its turns go to the top-level posts first."""
        with self._lock:
            state = self._channels.get(channel)
            return state is not None and state.leading
