"""What the application says in chat: re-render an incident's message, reply in its thread,
tell one user why a click did nothing. A chat that is down is logged, never raised: the
incident in the store is the truth, the message only shows it."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from bot.app.metrics import Metrics
from bot.app.ports import ChatPort, ChatUnavailable
from bot.app.records import Incident, MessageRef, Note, NoteKind
from bot.app.state import Outcome, VerificationStep

log = logging.getLogger(__name__)


def applied_note(user: str, message: str, digest: str) -> Note:
    """The "Applied" report; keyed by the proposal, so a resumed report is not sent twice."""
    return Note(kind=NoteKind.APPLIED, actor=user, message=message, key=f"applied/{digest}")


def reported(incident: Incident) -> Incident | None:
    """The incident with its Applied reply marked sent (verification next), None if it was already.
    (An incident moved to `applied` is at step REPORT until then: a bot killed before the reply
    leaves a trace a restart resumes from.)"""
    if incident.verification_step != VerificationStep.REPORT:
        return None
    return incident.at_step(VerificationStep.READY, incident.verify_lease)


class Messages:
    def __init__(self, chat: ChatPort, metrics: Metrics, intact: Callable[[Incident], bool] | None = None):
        self.chat, self.metrics = chat, metrics
        # Whether an incident's text is the bot's own (bot.app.seal); an edited copy is not shown.
        self.intact = intact or (lambda incident: True)
        # Repeats fold into one pending update per incident (refresh_folded).
        self._fold = threading.Lock()
        self._pending: dict[str, tuple[Callable[[], Incident | None], Incident]] = {}
        self._flushing = False

    def refresh_folded(self, name: str, load: Callable[[], Incident | None], known: Incident) -> None:
        """Show a repeat's counters: at most one pending update per incident, rendered from the
        incident as it is when its turn comes. The first caller sends the pending updates until
        none are left; a repeat arriving meanwhile only joins the pending set (or is already in
        it) and returns, so a storm of repeats costs one chat.update per incident per turn, not
        one per alert (Slack allows about 50 updates a minute, bot.app.pacing). `known`: the
        incident as the caller just wrote it, shown as is when no other repeat folded into it
        (no extra read, as before folding)."""
        mine = (load, known)
        with self._fold:
            self._pending[name] = mine
            if self._flushing:
                return
            self._flushing = True
        while True:
            with self._fold:
                if not self._pending:
                    self._flushing = False
                    return
                name = next(iter(self._pending))
                entry = self._pending.pop(name)
            try:
                incident = entry[1] if entry is mine else self._current(*entry)
                if incident is not None and incident.message_id:
                    self.refresh(incident)
            except Exception:  # one incident's failure must not leave the others pending for ever
                log.exception("updating the message of %s failed", name)

    @staticmethod
    def _current(load: Callable[[], Incident | None], known: Incident) -> Incident | None:
        """The incident as stored now; `known` itself when nobody wrote since (the same version:
        the same object in the store), whose seal the sealer already knows to hold."""
        current = load()
        return known if current is not None and known.version is not None and current.version == known.version \
            else current

    def refresh(self, incident: Incident, clicked: MessageRef | None = None) -> None:
        """Re-render the incident's message, and the clicked copy if it is a different one."""
        if not self.shown_as_sealed(incident):
            return
        own = incident.message_ref()
        targets = [own] if own is not None else []
        # Every copy shows the current record, so no visible button carries a replaced digest (a
        # copy that could not be updated keeps its old digest, and its clicks are refused).
        targets += [copy for copy in incident.copies if copy not in targets]
        if clicked and clicked not in targets and incident.shown_on(clicked):
            targets.append(clicked)
        for message in targets:
            try:
                self.chat.update_incident(incident, message)
            except ChatUnavailable as exc:
                log.warning("could not update the message of %s: %s", incident.name, exc)

    def shown_as_sealed(self, incident: Incident) -> bool:
        """False (logged, counted) when the incident's text is not what the bot wrote: someone
        edited the incident object. Its messages then keep what they showed."""
        if self.intact(incident):
            return True
        log.error("incident %s: its text is not what the bot wrote (the incident object was edited); "
                  "not rendering it", incident.name)
        self.metrics.refused_renders.inc()
        return False

    def reply(self, incident: Incident, clicked: MessageRef | None, note: Note) -> None:
        """Reply in the thread of the clicked message, else of the incident's message (for one
        posted in its group's thread: that thread)."""
        thread = incident.thread_of(clicked or incident.message_ref())
        if thread is None:
            log.info("incident %s has no message yet; not replying: %s", incident.name, note.summary)
            return
        try:
            self.chat.reply(thread, note)
        except ChatUnavailable as exc:
            log.warning("could not reply in the thread of %s: %s", incident.name, exc)

    def reply_once(self, incident: Incident, note: Note) -> None:
        """A keyed reply that an earlier run may have sent already (it was killed before it could
        record so): looked for in the threads of the incident's messages first. A thread that
        cannot be read does not stop the reply: a report said twice beats one never said."""
        assert note.key is not None
        threads = [m for m in [incident.thread_of(incident.message_ref()), *incident.copies] if m is not None]
        for thread in threads:
            try:
                if self.chat.find_reply(thread, note.key):
                    log.info("incident %s: its %s reply was already sent", incident.name, note.key)
                    return
            except ChatUnavailable as exc:
                log.warning("could not read the thread of %s (%s); replying anyway", incident.name, exc)
                break
        self.reply(incident, None, note)

    def refuse(self, reason: Outcome, channel: str | None, user: str, why: str | Note) -> Outcome:
        """Count a refused click and tell the user (only them) why; returns `reason`."""
        self.metrics.refused_clicks.labels(reason.value).inc()
        note = why if isinstance(why, Note) else Note(kind=NoteKind.REFUSAL, message=why)
        if channel:
            try:
                self.chat.tell_user(channel, user, note)
            except ChatUnavailable:
                log.warning("could not tell %s: %s", user, note.summary)
        return reason

    def someone_else_first(self, current: Incident | None, clicked: MessageRef | None, user: str) -> Outcome:
        """The refusal for a click that lost the race to another decision."""
        return self.refuse(Outcome.ALREADY_DECIDED, clicked.channel if clicked else None, user,
                           Note(kind=NoteKind.SOMEONE_ELSE_FIRST, state=current.state if current else None,
                                actor=current.approver if current else None))

    def actor(self, user: str) -> str:
        """Who, for the audit annotation and Event on the workload: a name and the chat id."""
        return self.chat.actor(user)
