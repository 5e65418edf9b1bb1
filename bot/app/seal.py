"""The bot's own text wins over incident text: a seal on what the bot wrote.

The incident object (a VLLMIncident) can be edited by anyone with write access to it, and the
message and the Approve confirm dialog are rendered from it. So whenever the bot itself sets an
incident's diagnosis or proposal (creating it, re-diagnosing, verifying) it seals them: an
HMAC-SHA256, under a per-install key, over the fields a message shows (the target, the cause,
the diagnosis, the proposal), as the store keeps them (redacted). A write of the bot that does
not set them keeps the seal as it was, so an edit made in between stays detectable: the bot
never re-seals text it did not compute. Before a message or dialog is posted or updated the seal
is checked; an edited copy is not rendered (bot.app.messages, bot.app.posting).

The key: VLLM_ONCALL_SEAL_KEY, else derived from the Slack bot token (every replica has it; a
person who can edit incident objects but not read the bot's Secret cannot forge a seal).
"""

from __future__ import annotations

import hashlib
import hmac
import json
from typing import Any

from bot.app.records import Incident
from bot.app.redaction import mark_redacted, redacted_incident
from bot.diagnosis.redact import DEFAULT, Redactor

SEALED_FIELDS = ("cluster", "namespace", "workload", "cause", "diagnosis", "proposal")


def derived_key(secret: str) -> bytes:
    """A seal key from an install's secret (the bot token), never the secret itself."""
    return hmac.new(secret.encode(), b"vllm-oncall incident text seal v1", hashlib.sha256).digest()


class Sealer:
    def __init__(self, key: bytes, redactor: Redactor = DEFAULT):
        self.key, self.redactor = key, redactor

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
        return mark_redacted(shown.revised(text_seal=self._digest_of_shown(shown)), self.redactor)

    def intact(self, incident: Incident) -> bool:
        """Its text is the text the bot sealed (a missing seal is not intact)."""
        return bool(incident.text_seal) and hmac.compare_digest(incident.text_seal or "", self._digest(incident))

    def after_write(self, before: Incident | None, after: Incident) -> Incident:
        """`after` as the bot writes it over `before` (None: a new incident): re-sealed only if the
        bot changed the sealed text itself; otherwise with `before`'s seal, intact or not."""
        if before is not None and all(getattr(before, f) == getattr(after, f) for f in SEALED_FIELDS):
            return after if after.text_seal == before.text_seal else after.revised(text_seal=before.text_seal)
        return self.sealed(after)
