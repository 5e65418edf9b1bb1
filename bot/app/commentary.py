"""The optional commentary (an LLM's, through bot.llm) posted in an incident's thread.

The diagnosis is posted first and never waits: the commentary runs on an executor of its own
(not the rollout's, not the webhook's), after the post, once per new incident (a repeat alert
never asks again). The commentator is a port-shaped callable, so the application imports no
client: `comment(incident_key, diagnosis, evidence)` returns the labelled text to post, or None
(nothing to say, dropped, timed out, over budget); counting its outcomes is its own business.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from bot.app.messages import Messages
from bot.app.records import Incident, Note, NoteKind
from bot.diagnosis.models import DiagnosisResult, Evidence

log = logging.getLogger(__name__)

Comment = Callable[[str, DiagnosisResult, Evidence | None], str | None]


class Commentary:
    """After a new incident is posted: ask `comment` on a small executor, reply in the thread."""

    def __init__(self, comment: Comment, messages: Messages, workers: int = 2):
        self.comment, self.messages = comment, messages
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="commentary")

    def __call__(self, incident: Incident | None, evidence: Evidence | None) -> Future[None] | None:
        """Schedule the commentary on a just-posted incident; returns at once."""
        if incident is None or incident.diagnosis is None or incident.diagnosis.cause is None \
                or not incident.message_id:
            return None
        return self._pool.submit(self._run, incident, evidence)

    def _run(self, incident: Incident, evidence: Evidence | None) -> None:
        assert incident.diagnosis is not None
        try:
            text = self.comment(incident.name, incident.diagnosis, evidence)
        except Exception:  # the commentary is optional: never let it break anything
            log.exception("commentary on %s failed", incident.name)
            return
        if text:
            self.messages.reply(incident, None, Note(kind=NoteKind.COMMENTARY, message=text))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
