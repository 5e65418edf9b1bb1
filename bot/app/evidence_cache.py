"""Evidence kept with its incident, so `/vllm why` still answers once the `--previous` log is gone.

The kubelet keeps one previous container log: after the container has restarted twice, the log of
the crash that opened the incident is gone, and a fresh collect reads a log of a container that
has not crashed (yet). The evidence the watch or the alert collected is therefore stored on the
incident (`Incident.evidence`), bounded, and `/vllm why` diagnoses from it when the collect says
the previous log is gone, saying when it was collected.

What is kept is what the diagnosis reads (the numbers in the log lines, the pod's command line,
limits and last state, the node's GPU labels and capacity, the events), redacted here, once, when
it is kept: a CachedEvidence is only ever made by `keep`, so every later step (each store write,
each render) stores and shows this redacted form as it is, without redacting it again. The text
rules leave vLLM's numbers alone, so the diagnosis from it is the same. Bounds: the first HEAD_CHARS and the last
TAIL_CHARS of the log (vLLM prints its config at the top and dies at the bottom; the middle is
request logs), the pod and node without managedFields, at most EVENTS events.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field

from bot.diagnosis.models import Evidence, LogText
from bot.diagnosis.redact import DEFAULT, Redactor
from bot.remedy.models import Model

HEAD_CHARS = 48 * 1024
TAIL_CHARS = 64 * 1024
EVENTS = 20
MIDDLE = "\n[... vllm-oncall: the middle of this log was not kept with the incident ...]\n"
GONE_NOTE = "The previous container's log is no longer available"  # bot/kube/collect.py's note


class CachedEvidence(Model):
    collected_at: datetime
    source: str = ""
    container: str | None = None
    log_text: str
    truncated_middle: bool = False
    pod: dict[str, Any] | None = None
    node: dict[str, Any] | None = None
    events: list[dict[str, Any]] = Field(default_factory=list)


def previous_log_gone(evidence: Evidence) -> bool:
    """The collect fell back to the current container's log (the previous one is gone)."""
    return any(e.get("reason") == "VllmOncallNote" and GONE_NOTE in str(e.get("message") or "")
               for e in evidence.events)


def _log_text(log: LogText) -> tuple[str, bool]:
    if log.text is not None:
        text = log.text
    elif log.path is not None:
        with open(log.path, "rb") as f:
            head = f.read(HEAD_CHARS + TAIL_CHARS + 1)
            if len(head) <= HEAD_CHARS + TAIL_CHARS:
                return head.decode("utf-8", errors="replace"), log.truncated_middle
            f.seek(-TAIL_CHARS, 2)
            tail = f.read()
        return (head[:HEAD_CHARS].decode("utf-8", errors="replace") + MIDDLE
                + tail.decode("utf-8", errors="replace")), True
    else:
        return "", log.truncated_middle
    if len(text) <= HEAD_CHARS + TAIL_CHARS:
        return text, log.truncated_middle
    return text[:HEAD_CHARS] + MIDDLE + text[-TAIL_CHARS:], True


def _slim(obj: dict[str, Any] | None) -> dict[str, Any] | None:
    if not obj:
        return obj
    out = dict(obj)
    meta = dict(out.get("metadata") or {})
    meta.pop("managedFields", None)
    out["metadata"] = meta
    return out


def keep(evidence: Evidence, now: datetime, redactor: Redactor = DEFAULT) -> CachedEvidence | None:
    """The evidence to store with the incident, redacted; None when it is not worth keeping (its
    log is the current container's, the previous one being gone already). The log's text goes
    through the text rules, the pod's containers through the argv and env rules, everything else
    through the text rules."""
    if previous_log_gone(evidence):
        return None
    text, truncated = _log_text(evidence.log)
    if not text.strip():
        return None
    return CachedEvidence(collected_at=now, source=evidence.source, container=evidence.container,
                          log_text=redactor.text(text), truncated_middle=truncated,
                          pod=redactor.structure(_slim(evidence.pod)), node=redactor.structure(_slim(evidence.node)),
                          events=redactor.structure(list(evidence.events)[-EVENTS:]))


def restore(cached: CachedEvidence) -> Evidence:
    return Evidence(log=LogText(text=cached.log_text, truncated_middle=cached.truncated_middle), pod=cached.pod,
                    node=cached.node, events=cached.events, container=cached.container,
                    source=f"{cached.source} (kept with the incident)")


def age(cached: CachedEvidence, now: datetime) -> str:
    seconds = max(0, int((now - cached.collected_at).total_seconds()))
    if seconds < 120:
        return f"{seconds} s ago"
    if seconds < 7200:
        return f"{seconds // 60} min ago"
    return f"{seconds // 3600} h ago"
