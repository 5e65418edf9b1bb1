"""The bot's own text wins over incident text: a seal on what the bot wrote.

The incident object (a VLLMIncident) can be edited by anyone with write access to it, and the
message and the Approve confirm dialog are rendered from it. So whenever the bot itself sets an
incident's diagnosis or proposal (creating it, re-diagnosing, verifying) it seals them: an
HMAC-SHA256, under a per-install key, over the fields a message shows (the target, the cause,
the diagnosis, the proposal), as the store keeps them (redacted). A write of the bot that does
not set them keeps the seal as it was, so an edit made in between stays detectable: the bot
never re-seals text it did not compute. Before a message or dialog is posted or updated the seal
is checked; an edited copy is not rendered (bot.app.messages, bot.app.posting). A check costs a
hash of the text, except where the sealer already knows the answer for that very object: what it
sealed or checked itself, and what the store answered to a write of such an incident.

The key: VLLM_ONCALL_SEAL_KEY, else derived from the Slack bot token (every replica has it; a
person who can edit incident objects but not read the bot's Secret cannot forge a seal).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from bot.app.records import Incident
from bot.app.redaction import carried_over, mark_redacted, redacted_incident
from bot.diagnosis.redact import DEFAULT, Redactor
from bot.support.marks import ObjectMarks

SEALED_FIELDS = ("cluster", "namespace", "workload", "cause", "diagnosis", "proposal")
SEALED_OBJECTS = ("diagnosis", "proposal")  # the records among them (the others are plain strings)


def derived_key(secret: str) -> bytes:
    """A seal key from an install's secret (the bot token), never the secret itself."""
    return hmac.new(secret.encode(), b"vllm-oncall incident text seal v1", hashlib.sha256).digest()


class KeptRedacted:
    """The writes of an install without a seal key: a revision that kept every redacted part of
    the incident it revises (a repeat's count) is taken as redacted (bot.app.redaction.carried_over),
    so the store does not redact it again."""

    def __init__(self, redactor: Redactor = DEFAULT):
        self.redactor = redactor

    def after_write(self, before: Incident | None, after: Incident) -> Incident:
        return after if before is None else carried_over(before, after, self.redactor)

    def stored(self, written: Incident, answer: Incident) -> Incident:
        return answer


class Sealer(KeptRedacted):
    """Seals the bot's text and checks seals. It also remembers, per object (by identity, dropped
    with the object, as bot.app.redaction marks what is redacted), which incidents it knows to be
    intact without hashing them again: one it sealed itself, one it checked, a write of one of
    those that kept its text (a repeat's count), and the store's answer to such a write (the answer
    to a compare-and-swap is the object as this write left it). A copy read from the store any
    other way is checked in full, so an edited incident is refused exactly as before."""

    def __init__(self, key: bytes, redactor: Redactor = DEFAULT):
        super().__init__(redactor)
        self.key = key
        self._held: ObjectMarks[str] = ObjectMarks()  # incident -> the seal known to hold for its text

    def _hold(self, incident: Incident) -> Incident:
        self._held.put(incident, incident.text_seal or "")
        return incident

    def _holds(self, incident: Incident) -> bool:
        return bool(incident.text_seal) and self._held.get(incident) == incident.text_seal

    def _digest(self, incident: Incident) -> str:
        return self._digest_of_shown(redacted_incident(incident, self.redactor))  # as the store keeps it: idempotent

    def _digest_of_shown(self, shown: Incident) -> str:
        """The seal over an incident as the store keeps it (redacted)."""
        fields: dict[str, Any] = shown.model_dump(mode="json", include=set(SEALED_FIELDS))
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
        return hmac.new(self.key, canonical.encode(), hashlib.sha256).hexdigest()

    def sealed(self, incident: Incident) -> Incident:
        """The incident as the store keeps it (redacted) with a seal over its text: only for text
        the bot has just computed. Redacted here, once: the seal is over the redacted text, and the
        store takes the copy as it is (the seal is no text redaction touches, so it stays marked)."""
        shown = redacted_incident(incident, self.redactor)
        return self._hold(mark_redacted(shown.revised(text_seal=self._digest_of_shown(shown)), self.redactor))

    def intact(self, incident: Incident) -> bool:
        """Its text is the text the bot sealed (a missing seal is not intact)."""
        if self._holds(incident):
            return True
        if not (incident.text_seal and hmac.compare_digest(incident.text_seal, self._digest(incident))):
            return False
        self._hold(incident)
        return True

    def after_write(self, before: Incident | None, after: Incident) -> Incident:
        """`after` as the bot writes it over `before` (None: a new incident): re-sealed only if the
        bot changed the sealed text itself; otherwise with `before`'s seal, intact or not."""
        after = super().after_write(before, after)
        if before is not None and all(getattr(before, f) == getattr(after, f) for f in SEALED_FIELDS):
            kept = after if after.text_seal == before.text_seal else after.revised(text_seal=before.text_seal)
            # the very same text under the same seal: known to hold if it held for `before`
            if self._holds(before) and all(getattr(before, f) is getattr(after, f) for f in SEALED_OBJECTS):
                self._hold(kept)
            return kept
        return self.sealed(after)

    def stored(self, written: Incident, answer: Incident) -> Incident:
        """The store's answer to the write of `written` (a create, or a compare-and-swap on its
        version): it holds the text `written` held, if it carries that text (compared, not hashed:
        nothing between the write and its answer may have changed it)."""
        if self._holds(written) and answer.text_seal == written.text_seal and \
                all(getattr(written, f) == getattr(answer, f) for f in SEALED_FIELDS):
            self._hold(answer)
        return answer
