"""Every write to the IncidentStore: read-modify-write by compare-and-swap, and the one way an
incident changes state (`moved`, checked against bot.app.state's table).

Decisions that must happen once (approve, reject, roll back) are `claim`s: the CAS that moves
the incident out of the state the decision starts from. Whoever loses that race sees the new
state and does nothing, so a double click, two approvers or two replicas act exactly once.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from typing import Any, Protocol

from bot.app.ports import IncidentConflict, IncidentStore
from bot.app.records import Incident
from bot.app.state import IncidentState, check_move

HISTORY_LIMIT = 60  # entries kept on the incident object (bounded object size)
ATTEMPTS = 8  # lost races before giving up


def iso(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def noted(incident: Incident, now: datetime, *lines: str) -> list[str]:
    """The incident's history with `lines` added (time-stamped), bounded."""
    return (incident.history + [f"{iso(now)} {line}" for line in lines])[-HISTORY_LIMIT:]


def moved(incident: Incident, to: IncidentState, now: datetime, note: str, **fields: Any) -> Incident:
    """The incident in state `to` with `note` in its history and `fields` set. Raises
    IllegalTransition if the table does not allow the move."""
    state = check_move(incident.name, incident.state, to)
    return incident.revised(**fields, state=state, history=noted(incident, now, note))


class WriteHooks(Protocol):
    """What is done to every incident the bot writes (bot.app.seal: sealed, kept redacted)."""

    def after_write(self, before: Incident | None, after: Incident) -> Incident:
        """`after` as the bot writes it over `before` (None: a new incident)."""

    def stored(self, written: Incident, answer: Incident) -> Incident:
        """The store's answer to the write of `written`."""


class AsWritten:
    """No hooks: every incident is written and taken back as it is."""

    def after_write(self, before: Incident | None, after: Incident) -> Incident:
        return after

    def stored(self, written: Incident, answer: Incident) -> Incident:
        return answer


class IncidentCas:
    def __init__(self, store: IncidentStore, clock: Callable[[], datetime], hooks: WriteHooks | None = None):
        self.store, self.clock = store, clock
        self.hooks = hooks or AsWritten()  # seals the bot's own text (bot.app.seal.Sealer)

    def create(self, incident: Incident) -> Incident:
        """Store a new incident (its text, the bot's own, sealed). Raises IncidentExists."""
        written = self.hooks.after_write(None, incident)
        return self.hooks.stored(written, self.store.create(written))

    def update(self, before: Incident, after: Incident) -> Incident:
        """Write `after`, a revision of `before`, by compare-and-swap on its version. Raises
        IncidentConflict when someone wrote since `before` was read."""
        written = self.hooks.after_write(before, after)
        return self.hooks.stored(written, self.store.update(written))

    def mutate(self, name: str, change: Callable[[Incident], Incident | None],
               known: Incident | None = None) -> Incident | None:
        """Read-modify-write with compare-and-swap; `change` returning None means: leave it.
        Returns the incident as stored afterwards, None if it does not exist.

        `known`: the incident as the caller last read or wrote it; the first attempt starts from it
        instead of reading. Safe: the write is a CAS on its version, so a stale `known` only costs
        a conflict and a re-read."""
        for attempt in range(ATTEMPTS):
            from_known = attempt == 0 and known is not None
            incident = known if from_known else self.store.get(name)
            if incident is None:
                return None
            updated = change(incident)
            if updated is None:
                if from_known:
                    continue  # "leave it" is decided on the incident as stored, never on a copy
                return incident
            try:
                return self.update(incident, updated)
            except IncidentConflict:
                continue
        raise IncidentConflict(f"{name}: gave up after {ATTEMPTS} lost races")

    def move(self, name: str, to: IncidentState, note: str, **fields: Any) -> Incident:
        """Move an incident this call is responsible for (e.g. one it claimed) to `to`."""
        incident = self.mutate(name, lambda inc: moved(inc, to, self.clock(), note, **fields))
        assert incident is not None, f"incident {name} vanished"
        return incident

    def claim(self, name: str, from_states: Collection[IncidentState], to: IncidentState, note: str,
              approver: str | None = None, digest: str | None = None,
              decided_before: datetime | None = None) -> Incident | None:
        """Move the incident from one of `from_states` to `to` by CAS (recording `approver` and
        the decision time when given). Returns it if this call made the move, None if it was no
        longer in those states (or, with `digest`, its proposal is no longer that one; with
        `decided_before`, it was decided at or after that time, i.e. someone took it over since).

        A write that committed but answered an error (the API retried it into a 409, or it
        failed for good) is read back: if the stored incident is this call's write, it claimed. A lost race against an unrelated write (a repeat alert's
        counters) is retried; a lost race against another decision is not."""
        for _ in range(ATTEMPTS):
            incident = self.store.get(name)
            if incident is None or incident.state not in from_states:
                return None
            if digest is not None and (incident.proposal is None or incident.proposal.digest != digest):
                return None
            if decided_before is not None and (incident.decided_at is None or incident.decided_at >= decided_before):
                return None
            now = self.clock()
            decided = {"approver": approver, "decided_at": now} if approver is not None else {}
            # The claim's own token in its history line: a write read back is recognised as ours.
            token = f"[claim {uuid.uuid4().hex[:8]}]"
            mine = moved(incident, to, now, f"{note} {token}", **decided)
            try:
                return self.store.update(mine)
            except IncidentConflict:
                own = self._own_write(name, mine, token)
                if own is not None:
                    return own
                continue
            except Exception:
                own = self._own_write(name, mine, token)
                if own is not None:
                    return own
                raise
        return None

    def _own_write(self, name: str, mine: Incident, token: str) -> Incident | None:
        """The stored incident if it is `mine` (a write that committed although it answered an
        error): its last history line carries this claim's token (the store may mask other text)."""
        try:
            stored = self.store.get(name)
        except Exception:
            return None
        if stored is not None and stored.state == mine.state and stored.history[-1:] and \
                stored.history[-1].endswith(token):
            return stored
        return None
