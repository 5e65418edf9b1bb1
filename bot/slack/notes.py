"""How each note the application says (bot.app.records.Note) reads in Slack: the words, the
emoji, the mentions and the escaping. The application says only what happened and its facts.

Every fact a note carries may quote the cluster (pod names, a patch's message, an error), so each
is redacted and escaped here; only the mentions and the emoji are written as Slack markup.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from bot.app.records import Note, NoteKind
from bot.diagnosis.redact import DEFAULT, Redactor
from bot.slack.escape import escape

K = NoteKind
# A Slack user id, as the click payloads carry it: only such an id becomes a mention.
_USER_ID = re.compile(r"[UW][A-Z0-9]{2,20}")
_LINK = re.compile(r"https?://[^\s<>|&]+")  # a link the chat gave, safe inside <url|text>


def mention(user: str | None, nobody: str = "someone") -> str:
    """`<@U123>` for a Slack user id (Slack shows the user's name); anything else escaped as is."""
    if not user:
        return nobody
    return f"<@{user}>" if _USER_ID.fullmatch(user) else escape(user)


class _Facts:
    """A note's facts, redacted and escaped, as the templates below use them."""

    def __init__(self, note: Note, redactor: Redactor):
        self.note, self.redactor = note, redactor

    def __call__(self, value: object) -> str:
        return escape(self.redactor.text(str(value if value is not None else "")))

    @property
    def pod(self) -> str:
        return self(self.note.pod)

    @property
    def message(self) -> str:
        return self(self.note.message)

    @property
    def by(self) -> str:
        """" by <@U123>", or nothing without an actor."""
        return f" by {mention(self.note.actor)}" if self.note.actor else ""

    def edited(self) -> str:
        n = self.note
        changed = ", ".join(self(field) for field in n.changed) or "its spec"
        return f":warning: Not applied: {self(n.workload)} was edited since the proposal ({changed}). {self.message}"


def _fix_applied(f: _Facts) -> str:
    n = f.note
    when = f" at {n.at:%Y-%m-%d %H:%M} UTC" if n.at else ""
    changes = ", ".join(f"`{f(line)}`" for line in n.lines) or "its change"
    thread = f"<{n.detail}|the incident's thread>" if n.detail and _LINK.fullmatch(n.detail) else "the incident's thread"
    return (f":information_source: This fix was already applied: {changes}, by {mention(n.actor)}{when}. "
            f"Verification: {f(n.state)} ({f(n.outcome)}): {f.message}\nThe whole story is in {thread}.")


def _pod_ready(f: _Facts) -> str:
    lines = [f":white_check_mark: 1/4 New pod {f.pod} is Ready. {f.message}".rstrip()]
    return "\n".join(lines + [f"2/4 vLLM: {f(line)}" for line in f.note.lines])


_WORDS: dict[NoteKind, Callable[[_Facts], str]] = {
    K.APPLIED: lambda f: f":white_check_mark: Applied by {mention(f.note.actor)}. {f.message}\nFollowing the rollout…",
    K.TOO_LATE: lambda f: (":hourglass: The cluster answered too slowly to patch safely now; nothing was changed "
                           "yet. The bot will try again shortly and report."),
    K.PATCH_FAILED: lambda f: f":x: The patch failed, nothing was changed: {f.message}",
    K.ANSWER_LOST: lambda f: (f":hourglass: The cluster's answer was lost ({f.message}). The bot will check whether "
                              "the change landed and report."),
    K.NOT_APPLIED: lambda f: (f":no_entry: Not applied, nothing was changed: {f.message}. "
                              f"Run `/vllm why {f(f.note.workload)}` for a fresh proposal."),
    K.EDITED_NOT_REDIAGNOSED: lambda f: f"{f.edited()}\nCould not re-diagnose: {f(f.note.detail)}",
    K.EDITED_NEW_CAUSE: lambda f: (f"{f.edited()}\nRe-diagnosed: the cause is now {f(f.note.detail)}; posted as a "
                                   "new incident."),
    K.EDITED_REPROPOSED: lambda f: (f"{f.edited()}\nRe-diagnosed against the current spec: the message above now "
                                    "shows the new proposal."),
    K.ROLLED_BACK: lambda f: f":leftwards_arrow_with_hook: Rolled back by {mention(f.note.actor)}: {f.message}",
    K.ROLLBACK_FAILED: lambda f: f":x: Rollback failed: {f.message}",
    K.NOT_FOLLOWED: lambda f: f"Could not follow the rollout: {f.message}",
    K.CRASHED_AGAIN: lambda f: f":x: The new pod {f.pod} crashed again: {f.message}",
    K.NOT_CONFIRMED: lambda f: f":hourglass: Rollout not confirmed ({f(f.note.outcome)}): {f.message}",
    K.NO_KV_FIGURES: lambda f: (f":warning: Ready, no KV figures: the new pod {f.pod} is Ready, but vLLM printed no "
                                f"KV-cache line, so the fix is not confirmed (the incident stays {f(f.note.state)})."),
    K.POD_READY: _pod_ready,
    K.REQUEST_OK: lambda f: f":speech_balloon: 3/4 {f.message}",
    K.REQUEST_FAILED: lambda f: f":x: 3/4 The new pod {f.pod} is Ready but does not serve: {f.message}",
    K.SOAK_STARTED: lambda f: f":hourglass_flowing_sand: 4/4 Soak: watching {f.pod} for {f.note.seconds or 0:g} s.",
    K.SOAK_OK: lambda f: f":white_check_mark: 4/4 {f.message}",
    K.SOAK_FAILED: lambda f: f":x: 4/4 {f.message}",
    K.GPU_MEMORY: lambda f: f":bar_chart: {f.message}",
    K.FIX_APPLIED: _fix_applied,
    K.MEMORY_CLIMBING: lambda f: f":warning: Running, memory climbing (not verified): {f.message}",
    K.RESUMED: lambda f: (f":arrows_counterclockwise: The bot restarted during verification (step: {f(f.note.step)}), "
                          "or the replica following it stopped; resuming it."),
    K.CRASHING_AGAIN: lambda f: f"Crash-looping again (pod {f.pod}) after being resolved.",
    K.EVIDENCE_KEPT: lambda f: (
        "The previous container's log is gone (the container restarted since), so this diagnosis is from the "
        f"evidence collected at {f.note.at:%Y-%m-%d %H:%M:%S} UTC ({f(f.note.detail)}), kept with the incident."
        if f.note.at else "The previous container's log is gone; this diagnosis is from the evidence kept with "
        "the incident."),
    K.COMMENTARY: lambda f: f.message,
    K.LOG_CUT: lambda f: (":scissors: The crashed container's log was longer than the bot reads: this diagnosis "
                          "is from its beginning and its end; the middle was not read."),
    K.REFUSAL: lambda f: f.message,
    K.SOMEONE_ELSE_FIRST: lambda f: (f"Someone else acted on this first (it is now {f(f.note.state or 'gone')}{f.by}). "
                                     "Nothing was changed."),
    K.ALREADY_DECIDED: lambda f: f"This proposal is already {f(f.note.state)}{f.by}. Nothing was changed.",
}


def note_text(note: Note, redactor: Redactor = DEFAULT) -> str:
    """The note in Slack mrkdwn: its facts redacted (with `redactor`) and escaped."""
    return _WORDS[note.kind](_Facts(note, redactor))
