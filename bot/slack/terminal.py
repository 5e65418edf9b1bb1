"""A ChatPort that prints to the terminal: what `vllm-oncall demo` shows a newcomer.

It renders the very Block Kit the Slack side would post, so the demo is the real message."""

from __future__ import annotations

import itertools
import sys
from datetime import datetime
from typing import TextIO

from bot.app.records import Incident, MessageRef, Note
from bot.diagnosis.redact import DEFAULT, Redactor
from bot.slack.blocks import blocks_to_text, group_message, incident_message, incident_thread, note_message
from bot.slack.chat import audit_actor
from bot.slack.escape import unescape
from bot.slack.notes import note_text


class TerminalChat:
    def __init__(self, out: TextIO | None = None, channel: str = "#vllm-oncall", redactor: Redactor = DEFAULT):
        self.out = out or sys.stdout
        self.redactor = redactor  # the terminal shows what Slack would: redacted too
        self.channel = channel
        self._ids = itertools.count(1)
        self.posted: list[tuple[str, str]] = []  # (what, text), for tests and the demo summary
        self._keys: dict[tuple[str, str], MessageRef] = {}  # (channel, post_key) -> the message printed
        self._replied: set[tuple[str, str, str]] = set()  # (channel, thread id, key) of keyed replies printed
        self._details: set[tuple[str, str, str]] = set()  # (channel, message id, incident) of details printed

    def _print(self, banner: str, text: str) -> None:
        self.posted.append((banner, text))
        rule = "─" * 78
        self.out.write(f"\n{rule}\n{banner}\n{rule}\n{text}")
        self.out.flush()

    def post_incident(self, incident: Incident, channel: str | None = None,
                      thread: MessageRef | None = None) -> MessageRef:
        ref = MessageRef(channel=channel or self.channel, message_id=f"{next(self._ids)}.000000")
        _, blocks = incident_message(incident, self.redactor)
        where = f"the thread of {thread.message_id} in {ref.channel}" if thread is not None else ref.channel
        self._print(f"Message posted to {where}", blocks_to_text(blocks))
        self.post_details(incident, thread or ref)  # a thread has one level: beside it in its group's thread
        if incident.post_key:
            self._keys[(ref.channel, incident.post_key)] = ref
        return ref

    def post_group(self, incidents: list[Incident], channel: str | None = None) -> MessageRef:
        ref = MessageRef(channel=channel or self.channel, message_id=f"{next(self._ids)}.000000")
        _, blocks = group_message(incidents, self.redactor)
        self._print(f"Grouped message posted to {ref.channel}", blocks_to_text(blocks))
        return ref

    def post_details(self, incident: Incident, message: MessageRef) -> None:
        self._print(f"Details in the message's thread ({message.channel})",
                    blocks_to_text(incident_thread(incident, self.redactor)[1]))
        self._details.add((message.channel, message.message_id, incident.name))

    def find_details(self, message: MessageRef, incident_name: str) -> bool:
        """Only details this process printed (as find_posted)."""
        return (message.channel, message.message_id, incident_name) in self._details

    def find_posted(self, channel: str | None, post_key: str, since: datetime,
                    thread: MessageRef | None = None) -> MessageRef | None:
        """What this process printed with `post_key` (the terminal never loses an answer, so only a
        post this process made can be found; after a restart nothing is, and it prints again)."""
        return self._keys.get((channel or self.channel, post_key))

    def update_incident(self, incident: Incident, message: MessageRef) -> None:
        _, blocks = incident_message(incident, self.redactor)
        # The body (diagnosis, evidence, change) is as posted; show what an update changes.
        changed = [b for b in blocks if b["type"] in ("header", "actions") or b.get("block_id") in ("status", "context")]
        self._print(f"Message in {message.channel} updated in place (state: {incident.state}); "
                    "the diagnosis above is unchanged", blocks_to_text(changed))

    def reply(self, thread: MessageRef, note: Note) -> None:
        _, blocks = note_message(note, self.redactor)
        self._print(f"Reply in the message's thread ({thread.channel})", blocks_to_text(blocks))
        if note.key:
            self._replied.add((thread.channel, thread.message_id, note.key))

    def find_reply(self, thread: MessageRef, key: str) -> bool:
        """Only a reply this process printed (as find_posted)."""
        return (thread.channel, thread.message_id, key) in self._replied

    def tell_user(self, channel: str, user: str, note: Note) -> None:
        self._print(f"Only {user} sees (in {channel})", unescape(note_text(note, self.redactor)) + "\n")

    def permalink(self, message: MessageRef) -> str | None:
        return None  # a terminal has no links: the message is above

    def group_members(self, group_id: str) -> set[str]:
        return set()

    def user_name(self, user_id: str) -> str | None:
        return "demo-approver" if user_id.startswith("U0DEMO") else None

    def actor(self, user_id: str) -> str:
        return audit_actor(user_id, self.user_name)
