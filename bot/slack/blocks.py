"""Block Kit for an incident: pure functions from the incident to (fallback text, blocks).

The blocks are written straight as the JSON chat.postMessage sends (plain dicts and lists),
with Slack's limits checked here, once, by the few builders below (_plain_text ... _actions).
Every text from outside is fitted to its limit before it reaches a builder, and a long log
excerpt ends in "… (truncated)" rather than failing the post; a text a builder still finds too
long is a bug here, so it raises instead of sending a message Slack would refuse.

Everything that came from a log, a pod or a node goes through escape()/code_block(); our own
words (labels, states) are written here. Buttons carry only the incident name; the proposal
itself stays in the store, so a click can never smuggle in a different change.
"""

from __future__ import annotations

import re
import shlex
from datetime import datetime
from typing import Any

from bot.app.links import IncidentLinks, LinkKind
from bot.app.records import Incident, Note, NoteKind
from bot.app.redaction import redacted_diagnosis, redacted_incident
from bot.app.state import IncidentState
from bot.diagnosis.models import Change, DiagnosisResult, revised
from bot.diagnosis.redact import DEFAULT, Redactor
from bot.remedy.models import Proposal
from bot.slack.escape import code_block, escape, inline_code, unescape
from bot.slack.notes import mention, note_text

APPROVE, REJECT, ROLLBACK = "vllm_approve", "vllm_reject", "vllm_rollback"
# Slack's Block Kit limits (docs.slack.dev/reference/block-kit), the ones these messages can meet.
MAX_BLOCKS = 50  # blocks per message
SECTION_TEXT_MAX = 3000  # a section's text
FIELD_TEXT_MAX = 2000  # one section field's text
FIELDS_MAX = 10  # fields per section
HEADER_TEXT_MAX = 150  # a header's text
BLOCK_ID_MAX = 255
CONTEXT_ELEMENTS_MAX = 10
ACTIONS_ELEMENTS_MAX = 25
BUTTON_TEXT_MAX, BUTTON_VALUE_MAX, ACTION_ID_MAX = 75, 2000, 255
CONFIRM_TITLE_LIMIT, CONFIRM_TEXT_LIMIT, CONFIRM_BUTTON_MAX = 100, 300, 30  # a confirm dialog's title, text, buttons
BUTTON_STYLES = ("primary", "danger")  # or no style: the default, harmless look
SECTION_LIMIT = SECTION_TEXT_MAX - 100  # what we fit a section's text to: a margin below Slack's 3000
TRUNCATED = "\n… (truncated)"
S = IncidentState
STATE_LINES: dict[IncidentState, str] = {
    S.PROPOSED: "",
    S.DIAGNOSED: "",
    S.APPROVED: ":hourglass_flowing_sand: Approved by {who} at {when}",
    S.APPLYING: ":hourglass_flowing_sand: Applying, approved by {who} at {when}",
    S.APPLIED: ":white_check_mark: Applied by {who} at {when}; following the rollout in the thread",
    S.VERIFIED: ":white_check_mark: Applied by {who} at {when}; the new pod is Ready (see thread)",
    S.MEMORY_CLIMBING: ":warning: Applied by {who} at {when}; running, memory climbing: not verified (see thread)",
    S.FAILED: ":x: Failed after the decision by {who} at {when} (see thread)",
    S.REJECTED: ":no_entry_sign: Rejected by {who} at {when}; nothing was changed",
    S.EXPIRED: ":alarm_clock: The proposal expired unused; nothing was changed",
    S.ROLLED_BACK: ":leftwards_arrow_with_hook: Applied by {who}, then rolled back (see thread)",
    S.RESOLVED: ":large_green_circle: Resolved: Alertmanager reports the pod is no longer crash-looping",
}


def _time(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M UTC") if t else "?"


def fit(text: str, limit: int = SECTION_LIMIT) -> str:
    """The text cut to `limit` characters, saying so at the end when it was cut."""
    if len(text) <= limit:
        return text
    return text[: limit - len(TRUNCATED) - 1] + TRUNCATED


Block = dict[str, Any]  # one block as Slack receives it


# ---- Block Kit as JSON ---------------------------------------------------------------------
# Keys are written in the order slack_sdk's models wrote them (sorted by name; a confirm
# dialog's title, text, confirm, deny), so the bytes sent did not change when the models went.

def _within(what: str, text: str, limit: int) -> str:
    if len(text) > limit:
        raise ValueError(f"{what} has {len(text)} characters; Slack allows {limit}")
    return text


def _plain_text(text: str, limit: int, emoji: bool | None = None) -> dict[str, Any]:
    _within("a plain text", text, limit)
    if emoji is None:
        return {"text": text, "type": "plain_text"}
    return {"emoji": emoji, "text": text, "type": "plain_text"}


def _mrkdwn_text(text: str, limit: int) -> dict[str, Any]:
    return {"text": _within("a mrkdwn text", text, limit), "type": "mrkdwn"}


def _mrkdwn(text: str, limit: int = SECTION_LIMIT) -> dict[str, Any]:
    # An empty text is a block Slack refuses: one space stands in for it.
    return _mrkdwn_text(fit(text, limit) or " ", limit)


def _with_block_id(block_id: str | None, block: Block) -> Block:
    if block_id is None:
        return block
    return {"block_id": _within("a block_id", block_id, BLOCK_ID_MAX), **block}


def _section(text: str, block_id: str | None = None) -> Block:
    return _with_block_id(block_id, {"text": _mrkdwn(text), "type": "section"})


def _fields_section(fields: list[dict[str, Any]]) -> Block:
    if len(fields) > FIELDS_MAX:
        raise ValueError(f"a section has {len(fields)} fields; Slack allows {FIELDS_MAX}")
    return {"fields": fields, "type": "section"}


def _field(label: str, value: str) -> dict[str, Any]:
    return _mrkdwn(f"*{label}*\n{value}", FIELD_TEXT_MAX)


def _header(title: str, emoji: bool) -> Block:
    return {"text": _plain_text(title, HEADER_TEXT_MAX, emoji), "type": "header"}


def _context_block(block_id: str, elements: list[dict[str, Any]]) -> Block:
    if len(elements) > CONTEXT_ELEMENTS_MAX:
        raise ValueError(f"a context block has {len(elements)} elements; Slack allows {CONTEXT_ELEMENTS_MAX}")
    return _with_block_id(block_id, {"elements": elements, "type": "context"})


def _actions(block_id: str, elements: list[dict[str, Any]]) -> Block:
    if len(elements) > ACTIONS_ELEMENTS_MAX:
        raise ValueError(f"an actions block has {len(elements)} elements; Slack allows {ACTIONS_ELEMENTS_MAX}")
    return _with_block_id(block_id, {"elements": elements, "type": "actions"})


def _button(action_id: str, label: str, style: str | None, value: str, confirm: dict[str, Any] | None = None
            ) -> dict[str, Any]:
    button: dict[str, Any] = {"action_id": _within("an action_id", action_id, ACTION_ID_MAX)}
    if confirm is not None:
        button["confirm"] = confirm
    if style is not None:
        if style not in BUTTON_STYLES:
            raise ValueError(f"a button's style is {style!r}; Slack knows {', '.join(BUTTON_STYLES)}")
        button["style"] = style
    button.update(text=_plain_text(label, BUTTON_TEXT_MAX), type="button",
                  value=_within("a button's value", value, BUTTON_VALUE_MAX))
    return button


def _confirm(title: str, text: str, yes: str) -> dict[str, Any]:
    return {"title": _plain_text(title, CONFIRM_TITLE_LIMIT), "text": _mrkdwn_text(text, CONFIRM_TEXT_LIMIT),
            "confirm": _plain_text(yes, CONFIRM_BUTTON_MAX), "deny": _plain_text("Cancel", CONFIRM_BUTTON_MAX)}


def _json(blocks: list[Block]) -> list[Block]:
    """What Slack is sent: at most its MAX_BLOCKS blocks."""
    return blocks[:MAX_BLOCKS]


def command_line(argv: list[str]) -> str:
    return shlex.join(argv) if argv else "(none)"


def change_lines(proposal: Proposal, redactor: Redactor = DEFAULT) -> list[str]:
    """`--flag: before → after` per change, redacted (the message and the confirm dialog)."""
    return [redactor.text(f"{c.name}: {c.before if c.before is not None else '(unset)'} → "
                          f"{c.after if c.after is not None else '(removed)'}") for c in proposal.changes]


def _shown(incident: Incident, redactor: Redactor) -> Incident:
    """The incident with every text from the cluster redacted, ready to be escaped and shown.
    The proposal's workload texts and change values (kept exact in the store: the apply path
    needs them) are redacted here; a record is copied only when its redaction changed it, as
    the copy would otherwise equal it (the common case, rendered at every repeat alert)."""
    incident = redacted_incident(incident, redactor)
    p = incident.proposal
    if p is None:
        return incident
    w = p.workload
    blocked = redactor.text(w.live_patch_blocked) if w.live_patch_blocked else None
    hint = redactor.text(w.repository_hint) if w.repository_hint else None
    workload = w if (blocked, hint) == (w.live_patch_blocked, w.repository_hint) \
        else revised(w, live_patch_blocked=blocked, repository_hint=hint)
    changes = [_shown_change(c, redactor) for c in p.changes]
    if workload is w and all(shown is c for shown, c in zip(changes, p.changes, strict=True)):
        return incident
    return incident.revised(proposal=revised(p, workload=workload, changes=changes))


def _shown_change(change: Change, redactor: Redactor) -> Change:
    before = redactor.text(change.before) if change.before else change.before
    after = redactor.text(change.after) if change.after else change.after
    return change if (before, after) == (change.before, change.after) else revised(change, before=before, after=after)


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + "…"


def consequence(proposal: Proposal) -> str:
    """What approving does beyond the flag itself: the restart, and what the new value refuses."""
    out = f"A rolling restart of the {proposal.workload.kind}'s pods."
    for c in proposal.changes:
        if c.name == "--max-model-len" and c.after and c.after.isdigit():
            out += f" Requests longer than {int(c.after):,} tokens will be refused."
        elif c.name == "--max-num-seqs" and c.after and c.after.isdigit():
            out += f" More than {int(c.after):,} concurrent requests will queue."
    return out


def confirm_text(incident: Incident) -> str:
    """What the Approve button's confirm dialog says: the change, its consequence, that Roll back
    exists and the proposal's digest, from the same record as the message and the button. The
    names (which the cluster chooses, up to 253 characters) get only what room is left, so a long
    name never pushes the change or the digest out of Slack's 300 characters."""
    assert incident.proposal is not None
    p = incident.proposal
    w = p.workload
    change = escape("; ".join(change_lines(p)))
    tail = escape(f" {consequence(p)} Roll back is offered after. (proposal {p.digest[:12]})")
    where_room = CONFIRM_TEXT_LIMIT - len(change) - len(tail) - len(" on ") - 1
    where = escape(f"{w.kind} {w.namespace}/{w.name} in {p.cluster}")
    if where_room < 12:  # not even a useful part of the name fits: the change and digest come first
        return _cut(change + tail, CONFIRM_TEXT_LIMIT)
    return change + " on " + _cut(where, where_room) + "." + tail


def confirm_title(incident: Incident) -> str:
    assert incident.proposal is not None
    return _cut(f"Apply to {incident.proposal.workload.name}?", CONFIRM_TITLE_LIMIT)


DIGEST_SEPARATOR = "|"  # a decision button's value: "<incident name>|<proposal digest>"


def decision_value(incident: Incident) -> str:
    assert incident.proposal is not None
    return f"{incident.name}{DIGEST_SEPARATOR}{incident.proposal.digest}"


TOP_EVIDENCE_LINES = 3  # the top message quotes at most this many log lines; the thread has them all
EFFECT_LIMIT = 220  # one line of effect per change in the top message
NOTICE_LIMIT = 240  # why there is no button, in one line; the details go in the thread
# vLLM's line prefix: "(EngineCore_DP0 pid=87) ERROR 11-30 04:52:14 [core.py:718] ", each part optional.
_LOG_PREFIX = re.compile(r"^(?:\([\w.-]+ pid=\d+\)\s*)?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+)?"
                         r"(?:\d\d-\d\d \d\d:\d\d:\d\d\s+)?(?:\[[\w./-]+:\d+\]\s*)?")


def trimmed(line: str) -> str:
    """A log line without vLLM's process/level/time/source prefix: the words that say what happened."""
    return _LOG_PREFIX.sub("", line, count=1) or line


def top_evidence(evidence: list[str]) -> list[str]:
    """At most TOP_EVIDENCE_LINES lines, oldest first, prefixes trimmed. The diagnosis lists its
    evidence decisive line first, then older context, so the decisive one is kept and ends the quote."""
    lines = list(dict.fromkeys(evidence))[:TOP_EVIDENCE_LINES]
    return [trimmed(line) for line in reversed(lines)]


def change_effect(change: Change, explanation: str) -> str:
    """The sentence the diagnosis wrote for this change ("Proposed: --flag value. <effect>"), if any."""
    for line in explanation.splitlines():
        head = f"Proposed: {change.name}"
        if line.startswith(head):
            rest = line[len(head):].strip()
            if change.after and rest.startswith(change.after):
                rest = rest[len(change.after):].lstrip(". ")
            return _cut(rest, EFFECT_LIMIT)
    return ""


def incident_message(incident: Incident, redactor: Redactor = DEFAULT) -> tuple[str, list[dict[str, Any]]]:
    """The incident's message, the decision first: header, cause, change and its effect, the
    buttons, then a few evidence lines. Everything else is in the thread (incident_thread).
    Every text from the cluster is redacted (with `redactor`: the built-in rules plus the
    operator's patterns) and escaped."""
    incident = _shown(incident, redactor)
    d = _diagnosis_of(incident)
    fallback = escape(f"[{incident.cluster}] {incident.namespace}/{incident.workload}: {d.title}")
    title = f"{incident.cluster} · {incident.namespace}/{incident.workload}"[:HEADER_TEXT_MAX]
    blocks: list[Block] = [_header(title, emoji=True),
                           _section(_decision_text(incident, d), block_id="decision-text")]
    notice = _no_button_notice(incident)
    if notice:
        blocks.append(_section(notice, block_id="approvals-off" if incident.proposal
                               and incident.proposal.approvals_off else "no-button"))
    if incident.state == S.PROPOSED and incident.proposal is not None:
        blocks.append(_decision_buttons(incident))
    status = _status_line(incident)
    if status:
        blocks.append(_section(status, block_id="status"))
    if d.findings:
        blocks.append(_section(_findings_line(d), block_id="findings"))
    if d.evidence:
        blocks.append(_section("*Evidence* (oldest first; all of it in the thread)\n"
                               + code_block("\n".join(top_evidence(d.evidence))), block_id="evidence"))
    if incident.log_cut:
        blocks.append(_section(note_text(Note(kind=NoteKind.LOG_CUT), redactor), block_id="log-cut"))
    blocks.append(_context(incident))
    return fallback, _json(blocks)


GROUP_LINE_LIMIT = 600  # one grouped line: the workload, the cause and the change, never a paragraph


def group_line(incident: Incident) -> str:
    """One workload of a grouped message (the incident already redacted): `namespace/name`, the
    cause in words, the proposed change (before -> after) or "no change"."""
    d = _diagnosis_of(incident)
    p = incident.proposal
    change = "; ".join(inline_code(line) for line in change_lines(p)) if p is not None and p.changes \
        else "no change"
    return f"{inline_code(f'{incident.namespace}/{incident.workload}')} · {escape(d.title)} · {change}"


def group_message(incidents: list[Incident], redactor: Redactor = DEFAULT) -> tuple[str, list[dict[str, Any]]]:
    """A storm's grouped message (bot/app/grouping.py): a header with the count, the count per
    namespace, a line per workload (grouped by namespace), and where each one's own message is.
    Within Slack's 50 blocks: the caller sends at most GROUP_LINES incidents. Redacted and escaped
    as every other message; no buttons (they are on each incident's own message, in the thread)."""
    if len(incidents) + 3 > MAX_BLOCKS:
        raise ValueError(f"{len(incidents)} lines do not fit one message of {MAX_BLOCKS} blocks")
    shown = sorted((_shown(i, redactor) for i in incidents), key=lambda i: (i.namespace, i.workload))
    per_namespace: dict[str, int] = {}
    for incident in shown:
        per_namespace[incident.namespace] = per_namespace.get(incident.namespace, 0) + 1
    n = len(shown)
    title = f"{n} vLLM workload{'s' if n != 1 else ''} crashing"
    cluster = shown[0].cluster if shown else ""
    header = f"{cluster} · {title}"[:HEADER_TEXT_MAX]
    counts = ", ".join(f"{escape(ns)} {count}" for ns, count in per_namespace.items())
    blocks: list[Block] = [_header(header, emoji=False),
                           _section(f"*By namespace:* {counts}", block_id="group-namespaces")]
    blocks += [_section(fit(group_line(i), GROUP_LINE_LIMIT), block_id=f"group-line-{k}") for k, i in enumerate(shown)]
    blocks.append(_context_block("group-thread", [_mrkdwn(
        "Each workload's own message, with Approve / Reject and its details, follows in this thread.")]))
    names = ", ".join(f"{i.namespace}/{i.workload}" for i in shown)
    fallback = escape(f"[{cluster}] {title}: {names}")[:3000]
    return fallback, _json(blocks)


def _diagnosis_of(incident: Incident) -> DiagnosisResult:
    return incident.diagnosis or DiagnosisResult(cause=incident.cause, title=incident.cause or "No known cause",
                                                 explanation="")


def _decision_text(incident: Incident, d: DiagnosisResult) -> str:
    cause = f"*vLLM crash loop:* {escape(d.title)}" + (f" ({inline_code(d.cause)})" if d.cause else "")
    p = incident.proposal
    if p is not None:
        changes = [(c, line) for c, line in zip(p.changes, change_lines(p), strict=True)]
    elif d.cause and d.changes and d.command_after and d.command_after != d.command_before:
        changes = [(c, line) for c, line in zip(d.changes, _diag_change_lines(d), strict=True)]
        cause += "\n*Suggested change* (no live patch offered for this workload):"
    else:
        if d.advice:
            return cause + "\n*No change proposed;* what would fit is advice in the thread."
        return cause + "\n*No change proposed:* no known cause was recognised, so there is nothing safe to apply."
    lines = []
    for c, line in changes:
        effect = change_effect(c, d.explanation)
        lines.append(f"*Change:* {inline_code(line)}" + (f": {escape(effect)}" if effect else ""))
    measured = p.impact.headline() if p is not None and p.impact is not None else None
    if measured:  # unmeasured: the thread says why it cannot be known
        lines.append(f"*Impact:* {escape(measured)}")
    return cause + "\n" + "\n".join(lines)


def _findings_line(d: DiagnosisResult) -> str:
    """The pod-spec faults beside the cause, one line each (their arithmetic and changes in the thread)."""
    return "*Also wrong in the pod spec* (not part of this change; details in the thread)\n" + "\n".join(
        f"• {escape(f.title)}" + (f": {inline_code(_diag_change_lines_of(f.changes)[0])}" if f.changes else "")
        for f in d.findings)


def _advice_text(d: DiagnosisResult) -> str:
    """Each piece of advice: what and why, the workload changes it takes, its node selector as YAML."""
    parts = []
    for a in d.advice:
        lines = [f"• {escape(a.text)}"]
        lines += [f"   would set {inline_code(f'{c.name}: {c.after}')}" for c in a.changes]
        if a.yaml:
            lines.append(code_block(a.yaml, 600))
        parts.append("\n".join(lines))
    return "*What would fit* (advice, not a change to approve)\n" + "\n".join(parts)


def _findings_thread(d: DiagnosisResult) -> str:
    parts = []
    for f in d.findings:
        lines = [f"*{escape(f.title)}* ({inline_code(f.kind.value)})", escape(f.text)]
        lines += [f"Would change: {inline_code(line)}" for line in _diag_change_lines_of(f.changes)]
        parts.append("\n".join(lines))
    return "*Also wrong in the pod spec* (not part of the proposed change)\n" + "\n\n".join(parts)


def _diag_change_lines(d: DiagnosisResult) -> list[str]:
    return _diag_change_lines_of(d.changes)


def _diag_change_lines_of(changes: list[Change]) -> list[str]:
    return [f"{c.name}: {c.before if c.before is not None else '(unset)'} → "
            f"{c.after if c.after is not None else '(removed)'}" for c in changes]


def _no_button_notice(incident: Incident) -> str:
    """One line on why no Approve button is offered, or "" when it is."""
    p = incident.proposal
    if p is None:
        return ""
    w = p.workload
    if w.live_patch_blocked:
        return _cut(f":no_entry: *No live patch:* {escape(w.live_patch_blocked)}. "
                    "The repository change is in the thread.", NOTICE_LIMIT)
    if p.dry_run_ok is False:
        return _cut(":no_entry: *The server-side dry run failed*, so no button is offered: "
                    f"{escape(p.dry_run_message or 'no reason given')}", NOTICE_LIMIT)
    if p.approvals_off:
        return _cut(f":eyes: *No Approve button:* {escape(p.approvals_off)}", NOTICE_LIMIT)
    return ""


def incident_thread(incident: Incident, redactor: Redactor = DEFAULT) -> tuple[str, list[dict[str, Any]]]:
    """The details posted in the message's thread with it: the facts, the explanation, the memory
    picture and budget table, the command lines, the repository change and the full evidence."""
    incident = _shown(incident, redactor)
    d = _diagnosis_of(incident)
    blocks: list[Block] = [_facts(incident, d)]
    if d.explanation:
        blocks.append(_section("*Why*\n" + escape(d.explanation)))
    if d.memory_picture:
        blocks.append(_section("*GPU memory and budget*\n" + code_block(d.memory_picture)))
    if d.alternative:
        blocks.append(_section("*Instead?* " + escape(d.alternative), block_id="alternative"))
    if d.advice:
        blocks.append(_section(_advice_text(d), block_id="advice"))
    if d.findings:
        blocks.append(_section(_findings_thread(d), block_id="findings"))
    p = incident.proposal
    if p is not None and p.impact is not None:
        blocks.append(_section("*Impact on the last day's traffic*\n" + escape(p.impact.sentence()), block_id="impact"))
    before, after = (p.command_before, p.command_after) if p else (d.command_before, d.command_after)
    if d.cause and after and after != before:
        blocks.append(_section("*Command line before*\n" + code_block(command_line(before), 1400)
                               + "\n*after*\n" + code_block(command_line(after), 1400)))
    if p is not None and p.workload.live_patch_blocked and (p.manifest_diff or p.workload.repository_hint):
        blocks.append(_section("*Make this change in the repository instead:*\n"
                               + code_block(p.manifest_diff or p.workload.repository_hint or "", 2000)))
    if d.evidence:
        lines = list(dict.fromkeys(d.evidence))
        blocks.append(_section("*Evidence* (from the previous container's log and the pod, oldest first)\n"
                               + code_block("\n".join(reversed(lines)))))
    if incident.links is not None:
        blocks.append(_section(_look_yourself(incident.links), block_id="links"))
    text = escape(f"Details: {incident.namespace}/{incident.workload}: {d.title}")
    return text, _json(blocks)


LINK_LABELS = {LinkKind.RUNBOOK: "Runbook", LinkKind.DASHBOARD: "Dashboard"}


def _look_yourself(links: IncidentLinks) -> str:
    """The runbook and dashboard (URLs the core built from checked templates, names URL-encoded)
    and the kubectl commands that show the same evidence."""
    out = "*Look for yourself*"
    if links.links:
        out += "\n" + " · ".join(f"<{escape(link.url)}|{LINK_LABELS[link.kind]}>" for link in links.links)
    if links.commands:
        out += "\n" + code_block("\n".join(links.commands), 1200)
    return out


def _facts(incident: Incident, d: DiagnosisResult) -> Block:
    kind = incident.proposal.workload.kind if incident.proposal else "workload"
    restarts = incident.restarts if incident.restarts is not None else "?"
    return _fields_section([
        _field("Cluster", escape(incident.cluster)),
        _field(escape(kind), f"{escape(incident.namespace)}/{escape(incident.workload)}"),
        _field("Pod / container", f"{escape(d.pod or ', '.join(incident.pods))} / {escape(d.container or '?')}"),
        _field("Node", escape(d.node or "unknown")),
        _field("GPU", escape(d.gpu or "unknown")),
        _field("Restarts", str(restarts)),
    ])


def _context(incident: Incident) -> Block:
    pods = ", ".join(incident.pods[:5]) + (f" and {len(incident.pods) - 5} more" if len(incident.pods) > 5 else "")
    return _context_block("context", [_mrkdwn(escape(
        f"incident {incident.name} · pods {pods} · {incident.alert_count} alert(s) · "
        f"first seen {_time(incident.first_seen)} · last seen {_time(incident.last_seen)}"))])


def _decision_buttons(incident: Incident) -> Block:
    assert incident.proposal is not None
    return _actions("decision", [
        _button(APPROVE, "Approve", "primary", decision_value(incident),
                _confirm(confirm_title(incident), confirm_text(incident), "Apply")),
        _button(REJECT, "Reject", None, decision_value(incident)),  # harmless: no style, by Slack's convention
    ])


def _status_line(incident: Incident) -> str:
    template = STATE_LINES[incident.state]
    if not template:
        if incident.state == S.PROPOSED and incident.proposal:
            return f"Approvers may apply this until {_time(incident.proposal.expires_at)}."
        return ""
    return template.format(who=mention(incident.approver), when=_time(incident.decided_at))


def rollback_button(incident_name: str) -> Block:
    return _actions("rollback", [
        _button(ROLLBACK, "Roll back", "danger", incident_name,
                _confirm("Roll back this change?", "Restore the command line recorded before the change.",
                         "Roll back"))])


def note_message(note: Note, redactor: Redactor = DEFAULT) -> tuple[str, list[dict[str, Any]]]:
    """A thread reply: the note's words (bot.slack.notes: its facts redacted and escaped), its
    re-diagnosis (redacted and escaped) and its Roll back button."""
    text = note_text(note, redactor)
    blocks: list[Block] = [_section(text)]
    diagnosis, rollback_incident = note.diagnosis, note.rollback_incident
    if diagnosis is not None:
        diagnosis = redacted_diagnosis(diagnosis, redactor)
        blocks.append(_section(f"*Re-diagnosed:* {escape(diagnosis.title)}\n{escape(diagnosis.explanation)}"))
        if diagnosis.evidence:
            blocks.append(_section(code_block("\n".join(diagnosis.evidence))))
        if diagnosis.memory_picture:
            blocks.append(_section(code_block(diagnosis.memory_picture)))
    if rollback_incident:
        blocks.append(rollback_button(rollback_incident))
    return text[:3000], _json(blocks)  # the fallback (notifications) is the escaped text too


def blocks_to_text(blocks: list[dict[str, Any]]) -> str:
    """The terminal's rendering of a message: the same words, buttons shown as [Approve]."""
    lines: list[str] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "header":
            title = block["text"]["text"]
            lines += [title, "=" * len(title)]
        elif kind == "section":
            if "text" in block:
                lines.append(unescape(block["text"]["text"]))
            for f in block.get("fields") or []:
                label, _, value = f["text"].partition("\n")
                lines.append(f"{unescape(label.strip('*')) + ':':<18} {unescape(value)}")
        elif kind == "context":
            lines.append(" ".join(unescape(e.get("text", "")) for e in block["elements"]))
        elif kind == "actions":
            buttons = []
            for e in block["elements"]:
                label = f"[{e['text']['text']}]"
                if "confirm" in e:
                    label += f" (asks: {unescape(e['confirm']['text']['text'])})"
                buttons.append(label)
            lines.append("  ".join(buttons))
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"
