"""Optional commentary through any OpenAI-compatible endpoint, beside the diagnosis, never in it.

The cause, the numbers and the change come from playbooks and formulas, never from the model.
The model's text is dropped when it names a number or a flag the diagnosis does not, runs long,
speaks of approval, agreement, authorisation, clicking or applying, or steers the reader; and
what passes is made inert (mentions, links and channel pings removed) and posted under a label
that says it is not a proposal. Nothing is sent unless VLLM_ONCALL_LLM_BASE_URL is set, and
what is sent has secrets redacted.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from bot.diagnosis.evidence import pod_view
from bot.diagnosis.logfacts import trusted_text
from bot.diagnosis.models import DiagnosisResult, Evidence
from bot.diagnosis.redact import Redactor
from bot.llm.settings import LLMSettings

log = logging.getLogger(__name__)
MAX_CHARS = 700
_NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def _numbers(text: str) -> set[str]:
    out = set()
    for n in _NUMBER.findall(text):
        n = n.replace(",", "")
        out.add(n.rstrip("0").rstrip(".") if "." in n else n)
    return out


# ---- the commentator: the model's words beside the diagnosis, never in it -----------------

COMMENTARY_TITLE = "Commentary (AI, not a proposal)"
COMMENTARY_SYSTEM = (
    "You comment on a diagnosed vLLM start-up crash for an on-call engineer, in at most three short sentences of "
    "plain English. Explain what the evidence shows. Use only facts, numbers and flags present in the JSON you are "
    "given. Never tell anyone to approve, click, run, set or change anything. Do not use Markdown.")
EXCERPT_LINES = 20
EXCERPT_BYTES = 64 * 1024
# Replies that try to steer the reader or the bot, rather than explain, are dropped whole.
_VERBS = (r"(?:set|change|increase|decrease|raise|lower|reduce|add|remove|apply|run|restart|delete|patch|"
          r"roll\s*back|rollback|try|use|edit|update|configure|pass|approve|click)")
# A reply that speaks of a decision at all (approval, agreement, authorisation, sign-off) or of
# acting on the proposal (clicking, applying, merging) is persuasion, not an explanation, even
# without an imperative: "the on-call lead already agreed" is dropped like "click Approve".
_DECISION = (r"approv\w*|agree\w*|agreement|consent\w*|authori[sz]\w*|permi(?:t|ts|tted|ssion)\w*|allow(?:ed|s)?|"
             r"sign(?:ed|s)?[\s-]*off|signoff|green[\s-]*light\w*|ok(?:ay)?(?:ed|'d)|lgtm|go[\s-]+ahead|"
             r"confirm\w*|accept(?:ed|s)?|vouch\w*|endors\w*|sanction\w*|blessed|"
             r"click\w*|button|press\w*|tap(?:ped)?|appl(?:y|ies|ied|ying)|merg\w*|deploy\w*|"
             r"on[\s-]*call\s+lead|lead\s+engineer|manager|team\s+lead|safe\s+to")
_STEERING = re.compile(
    rf"(?i)\b(?:{_DECISION}|ignore\s+(?:all|any|the|previous|prior|above)\w*|disregard\w*|system|"
    r"override\w*|instruction\w*|jailbreak|prompt|recommend\w*|suggest\w*|"
    r"you\s+(?:must|should|need\s+to|have\s+to|can|could)|kubectl)\b"
    r"|https?://|www\.|<!|@here|@channel|@everyone"
    rf"|(?i:(?:^|[.!?;:]\s*|\n\s*|\bto\s+|\bplease\s+){_VERBS}\b)"  # an imperative: a sentence that starts with a verb
    rf"|(?i:\b{_VERBS}\s+(?:the\s+)?(?:--|`|flag|option|argument|setting))", re.MULTILINE)
# Slack turns <@U1>, <#C1>, <!here>, <!subteam^S1>, <http://x|y> and <mailto:...> into pings
# and links; any angle-bracketed span is removed, and a stray < > & escaped by the chat.
_SLACK_ENTITY = re.compile(r"<[^<>\n]{0,200}>")
_AT_WORD = re.compile(r"@(?=\w)")
_FLAG_LIKE = re.compile(r"--[a-z0-9][a-z0-9-]*|\b[a-z]+(?:_[a-z0-9]+)+\b")


def steering(text: str) -> str | None:
    """The first approval, override, instruction or imperative-advice phrase in text, if any."""
    match = _STEERING.search(text)
    return match.group(0) if match else None


def acceptable_commentary(text: str, source: str) -> str | None:
    """Why the model's commentary cannot be shown (None: it can): too long, a number or a flag
    the diagnosis does not state, or language that steers instead of explaining."""
    if not text:
        return "empty"
    if len(text) > MAX_CHARS:
        return "too long"
    if not _numbers(text) <= _numbers(source):
        return "a number the diagnosis does not state"
    unknown = [f for f in _FLAG_LIKE.findall(text) if f not in source and f.replace("_", "-") not in source
               and "--" + f.replace("_", "-") not in source]
    if unknown:
        return f"a flag the diagnosis does not name ({unknown[0]})"
    phrase = steering(text)
    return f"steering language ({phrase!r})" if phrase else None


def inert(text: str) -> str:
    """The model's text with nothing that acts in chat: every `<...>` span (a mention, a
    channel or group ping, a link) removed, and a space after each `@` so no `@name` or
    `@here` can be read as a mention by any client. (Not an invisible joiner: redaction removes
    zero-width characters, which can hide a token.)"""
    text = _SLACK_ENTITY.sub("[removed]", text)
    text = text.replace("<", "(").replace(">", ")")
    return _AT_WORD.sub("@ ", text)


def labelled(text: str) -> str:
    """The block the commentary is shown in: titled, quoted, inert, never mistaken for the
    proposal or for anyone's decision."""
    quoted = "\n".join(f"> {line}" for line in inert(text).splitlines() if line.strip())
    return f"*{COMMENTARY_TITLE}*\n{quoted}"


class Commentator:
    """The model's commentary on an incident: once per incident key, within a timeout and a
    per-hour budget, fed only redacted text, and only when its reply passes
    acceptable_commentary(). `comment()` returns the labelled block to post in the thread
    after the diagnosis, or None. `on_outcome` gets one word per call (a metric label):
    posted, dropped, timeout, error, over_budget, repeat, disabled."""

    def __init__(self, settings: LLMSettings | None, *, timeout_seconds: float = 5.0, calls_per_hour: int = 60,
                 remember: int = 4096, redactor: Redactor | None = None,
                 on_outcome: Callable[[str], None] | None = None, clock: Callable[[], float] = time.monotonic):
        self.settings = settings
        self.timeout_seconds = timeout_seconds
        self.calls_per_hour = calls_per_hour
        self.remember = remember
        self.redactor = redactor or Redactor()
        self.on_outcome = on_outcome or (lambda outcome: None)
        self.clock = clock
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._calls: deque[float] = deque()
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="llm")
        self._client: Any = None
        # The client's own time-out and ours are the same figure and race each other: whichever
        # fires first, the model did not answer in time, and that is counted as a time-out.
        self._timeouts: tuple[type[BaseException], ...] = (FutureTimeout,)
        if settings is not None:
            # Made here, not in the first call: importing the client takes seconds on a loaded
            # machine, which would spend the first incident's whole timeout.
            from openai import APITimeoutError, OpenAI

            self._timeouts = (FutureTimeout, APITimeoutError)
            self._client = OpenAI(base_url=settings.base_url, api_key=settings.api_key, timeout=timeout_seconds,
                                  max_retries=0)

    def comment(self, incident_key: str, diagnosis: DiagnosisResult, evidence: Evidence | None = None) -> str | None:
        if self.settings is None or diagnosis.cause is None:
            return self._outcome("disabled")
        refusal = self._admit(incident_key)
        if refusal:
            return self._outcome(refusal)
        payload = self.prompt(diagnosis, evidence)
        future = self._pool.submit(self._ask, payload)
        try:
            text = future.result(timeout=self.timeout_seconds)
        except self._timeouts:
            log.warning("LLM commentary skipped: no answer within %g s", self.timeout_seconds)
            return self._outcome("timeout")
        except Exception as exc:  # any endpoint failure: the incident is posted without commentary
            log.warning("LLM commentary skipped: %s", printable_error(exc))
            return self._outcome("error")
        why = acceptable_commentary(text, payload)
        if why:
            log.warning("LLM commentary dropped: %s", why)
            return self._outcome("dropped")
        self._outcome("posted")
        return labelled(text)

    def _admit(self, incident_key: str) -> str | None:
        """Once per incident (remembered, bounded) and within the hour's budget."""
        now = self.clock()
        with self._lock:
            if incident_key in self._seen:
                self._seen.move_to_end(incident_key)
                return "repeat"
            self._seen[incident_key] = None
            while len(self._seen) > self.remember:
                self._seen.popitem(last=False)
            while self._calls and now - self._calls[0] >= 3600:
                self._calls.popleft()
            if len(self._calls) >= self.calls_per_hour:
                return "over_budget"
            self._calls.append(now)
        return None

    def prompt(self, diagnosis: DiagnosisResult, evidence: Evidence | None) -> str:
        """What is sent: the diagnosis, the log excerpt and the command line, all redacted."""
        container = pod_view(evidence).container if evidence is not None else None
        command = (container.command or []) + (container.args or []) if container else []
        excerpt = log_excerpt(evidence) if evidence is not None else []
        doc = {"cause": diagnosis.cause, "title": diagnosis.title, "explanation": diagnosis.explanation,
               "changes": [c.model_dump() for c in diagnosis.changes],
               "evidence": [self.redactor.text(line) for line in diagnosis.evidence[:5]],
               # redacted as one text: a token wrapped over two lines is masked whole
               "log_excerpt": self.redactor.text("\n".join(excerpt)).splitlines(),
               "command": self.redactor.args(command)}
        return self.redactor.text(json.dumps(doc))

    def _ask(self, payload: str) -> str:
        assert self.settings is not None and self._client is not None
        reply = self._client.chat.completions.create(
            model=self.settings.model, temperature=0,
            messages=[{"role": "system", "content": COMMENTARY_SYSTEM}, {"role": "user", "content": payload}])
        return (reply.choices[0].message.content or "").strip()

    def _outcome(self, outcome: str) -> str | None:
        """Report the outcome; the comment itself is None for every outcome but `posted`."""
        self.on_outcome(outcome)
        return None

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def log_excerpt(evidence: Evidence, lines: int = EXCERPT_LINES) -> list[str]:
    """The last lines of the previous container's log (read from the end, bounded), each up to
    its first request payload marker: a user's prompt printed by vLLM is not shown to the model
    (it could hold instructions), as it is never evidence."""
    source = evidence.log
    if source.text is not None:
        text = source.text[-EXCERPT_BYTES:]
    elif source.path is not None:
        try:
            with open(source.path, "rb") as handle:
                handle.seek(0, os.SEEK_END)
                handle.seek(max(0, handle.tell() - EXCERPT_BYTES))
                text = handle.read().decode("utf-8", "replace")
        except OSError:
            return []
    else:
        return []
    kept = (trusted_text(line) for line in text.splitlines())
    return [line for line in kept if line.strip()][-lines:]


def printable_error(exc: BaseException) -> str:
    return re.sub(r"[\x00-\x1f\x7f]", " ", f"{type(exc).__name__}: {exc}")[:200]
