"""The incident as it may be stored and shown: every text and value from the cluster redacted.

The incident object (a VLLMIncident in the cluster, or a file) is readable by more people than
the workload's Secrets, and its text goes on to Slack: so the stores keep only this copy. What
stays exact is what the apply path needs: the proposal's `changes`; the stored patch and the
container as diagnosed are compared with the live workload by bot.remedy.plan.redacted_equal,
and the patch applied is re-derived from the live object (plan.exact_patch / plan.rebase).
"""

from __future__ import annotations

from typing import Any

from bot.app.records import Incident
from bot.diagnosis.models import DiagnosisResult, revised
from bot.diagnosis.redact import DEFAULT, Redactor
from bot.remedy.models import Proposal
from bot.remedy.plan import redact_proposal
from bot.support.marks import ObjectMarks

# ---- redacted once --------------------------------------------------------------------------
#
# A record (an incident, its diagnosis, its proposal) that a redactor made, or that a store read
# back from what it wrote redacted, is marked with that redactor: every later store write and
# render takes it as it is instead of redacting it again. The mark is on the object (by identity,
# dropped with the object), never on its content: a record revised afterwards is a new object,
# unmarked, and is redacted again. Nothing is serialised or compared to find out.

_marks: ObjectMarks[Redactor] = ObjectMarks()


def mark_redacted(record: Any, redactor: Redactor) -> Any:
    """`record`, marked as `redactor`'s output (see above)."""
    _marks.put(record, redactor)
    return record


def redacted_by(record: Any, redactor: Redactor) -> bool:
    return _marks.get(record) is redactor


def redacted_diagnosis(diagnosis: DiagnosisResult, redactor: Redactor = DEFAULT) -> DiagnosisResult:
    if redacted_by(diagnosis, redactor):
        return diagnosis  # made by this redactor already (mark_redacted above)
    text = redactor.text
    return mark_redacted(revised(
        diagnosis, title=text(diagnosis.title), explanation=text(diagnosis.explanation),
        evidence=[text(line) for line in diagnosis.evidence], memory_picture=text(diagnosis.memory_picture),
        command_before=redactor.args(diagnosis.command_before),
        command_after=redactor.args(diagnosis.command_after), facts=redactor.structure(diagnosis.facts),
        findings=[revised(f, title=text(f.title), text=text(f.text)) for f in diagnosis.findings]), redactor)


def redacted_incident(incident: Incident, redactor: Redactor = DEFAULT) -> Incident:
    """A copy with the diagnosis, the proposal's display fields and patch values, and the
    history redacted. Idempotent: redacting a redacted incident changes nothing.

    The evidence kept for `/vllm why` (up to 112 KB of log) is not redacted here: it was redacted
    once, when it was kept (bot.app.evidence_cache.keep, the only maker of a CachedEvidence), and
    every store write and render takes it as it is. The diagnosis and the proposal are redacted
    once too: a part this redactor made, or a store read back, is marked and taken as it is
    (mark_redacted above); so is a whole incident a store read back."""
    if redacted_by(incident, redactor):
        return incident
    return mark_redacted(incident.revised(
        diagnosis=redacted_diagnosis(incident.diagnosis, redactor) if incident.diagnosis else None,
        proposal=_redacted_proposal(incident.proposal, redactor) if incident.proposal else None,
        history=redacted_lines(incident.history, redactor),
        applied=revised(incident.applied, message=redactor.text(incident.applied.message))
        if incident.applied else None,
    ), redactor)


def _redacted_proposal(proposal: Proposal, redactor: Redactor) -> Proposal:
    if redacted_by(proposal, redactor):
        return proposal
    return mark_redacted(redact_proposal(proposal, redactor), redactor)


def redacted_lines(lines: list[str], redactor: Redactor) -> list[str]:
    """Each line redacted, in one pass over them all (the combined scan runs once, not once per
    line); line by line when a rule's match spanned two of them (a multi-line key), so a line
    never takes another's text."""
    if not lines:
        return []
    if not any("\n" in line for line in lines):
        joined = redactor.text("\n".join(lines)).split("\n")
        if len(joined) == len(lines):
            return joined
    return [redactor.text(line) for line in lines]


def carried_over(before: Incident, after: Incident, redactor: Redactor) -> Incident:
    """`after`, a revision of `before`: marked as redacted when `before` is and the revision kept
    every part redaction rewrites (the same diagnosis, proposal and applied change, the same
    history), e.g. a repeat's counters; so the write of a count does not redact the incident again."""
    if redacted_by(before, redactor) and after.diagnosis is before.diagnosis and after.proposal is before.proposal \
            and after.applied is before.applied and after.history == before.history:
        mark_redacted(after, redactor)
    return after


def marked_as_stored(incident: Incident, redactor: Redactor) -> Incident:
    """An incident a store read back from what it wrote (redacted by `redactor`): marked, with
    its diagnosis and proposal, so the next write or render does not redact it again."""
    for part in (incident.diagnosis, incident.proposal):
        if part is not None:
            mark_redacted(part, redactor)
    return mark_redacted(incident, redactor)
