"""The incident as it may be stored and shown: every text and value from the cluster redacted.

The incident object (a VLLMIncident in the cluster, or a file) is readable by more people than
the workload's Secrets, and its text goes on to Slack: so the stores keep only this copy. What
stays exact is what the apply path needs: the proposal's `changes`; the stored patch and the
container as diagnosed are compared with the live workload by bot.remedy.plan.redacted_equal,
and the patch applied is re-derived from the live object (plan.exact_patch / plan.rebase).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel

from bot.app.evidence_cache import CachedEvidence
from bot.app.records import Incident
from bot.diagnosis.models import DiagnosisResult, revised
from bot.diagnosis.redact import DEFAULT, Redactor
from bot.remedy.plan import redact_proposal


def redacted_diagnosis(diagnosis: DiagnosisResult, redactor: Redactor = DEFAULT) -> DiagnosisResult:
    text = redactor.text
    return revised(
        diagnosis, title=text(diagnosis.title), explanation=text(diagnosis.explanation),
        evidence=[text(line) for line in diagnosis.evidence], memory_picture=text(diagnosis.memory_picture),
        command_before=redactor.args(diagnosis.command_before),
        command_after=redactor.args(diagnosis.command_after), facts=redactor.structure(diagnosis.facts))


def redacted_incident(incident: Incident, redactor: Redactor = DEFAULT) -> Incident:
    """A copy with the diagnosis, the proposal's display fields and patch values, and the
    history redacted. Idempotent: redacting a redacted incident changes nothing."""
    return incident.revised(
        diagnosis=_once(redacted_diagnosis, incident.diagnosis, redactor) if incident.diagnosis else None,
        proposal=_once(redact_proposal, incident.proposal, redactor) if incident.proposal else None,
        history=[_text(line, redactor) for line in incident.history],
        applied=revised(incident.applied, message=_text(incident.applied.message, redactor))
        if incident.applied else None,
        evidence=_once(redacted_evidence, incident.evidence, redactor) if incident.evidence else None,
    )


def redacted_evidence(kept: CachedEvidence, redactor: Redactor = DEFAULT) -> CachedEvidence:
    """The evidence kept with an incident for `/vllm why`: the log's text through the text rules
    (which leave vLLM's numbers alone: the diagnosis from it is the same), the pod's containers
    through the argv and env rules, everything else through the text rules."""
    return revised(kept, log_text=redactor.text(kept.log_text), pod=redactor.structure(kept.pod),
                   node=redactor.structure(kept.node), events=redactor.structure(kept.events))


# ---- each part redacted once ---------------------------------------------------------------
#
# Every store write redacts the whole incident, and most of it (the diagnosis, the proposal, the
# evidence kept for `/vllm why`, the older history lines) is what the previous write redacted:
# the same input through the same redactor gives the same output, so it is computed once and
# remembered (bounded). Keyed by the redactor object itself (held by the key, so its id is never
# reused by another redactor) and the part's exact content.

M = TypeVar("M", bound=BaseModel)
_REMEMBERED = 256
_memo: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
_memo_lock = threading.Lock()


def _remembered(key: tuple[Any, ...], make: Callable[[], Any]) -> Any:
    with _memo_lock:
        if key in _memo:
            _memo.move_to_end(key)
            return _memo[key]
    value = make()
    with _memo_lock:
        _memo[key] = value
        while len(_memo) > _REMEMBERED:
            _memo.popitem(last=False)
    return value


def _once(redact: Callable[[M, Redactor], M], part: M, redactor: Redactor) -> M:
    """`redact(part, redactor)`, computed once per distinct part; a copy, so no caller shares it."""
    done = _remembered((redact.__name__, redactor, part.model_dump_json()), lambda: redact(part, redactor))
    return done.model_copy(deep=True)


def _text(line: str, redactor: Redactor) -> str:
    return _remembered(("text", redactor, line), lambda: redactor.text(line))
