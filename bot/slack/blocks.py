"""Block Kit for an incident: pure functions from the incident to (fallback text, blocks).

Everything that came from a log, a pod or a node goes through escape()/code_block(); our own
words (labels, states) are written here. Buttons carry only the incident name; the proposal
itself stays in the store, so a click can never smuggle in a different change.
"""

from __future__ import annotations

import shlex
from datetime import datetime
from typing import Any

from bot.diagnosis.models import DiagnosisResult
from bot.app.records import Incident
from bot.remedy.models import Proposal
from bot.slack.escape import code_block, escape, inline_code

APPROVE, REJECT, ROLLBACK = "vllm_approve", "vllm_reject", "vllm_rollback"
SECTION_LIMIT = 2900  # Slack allows 3000 characters per section text
STATE_LINES = {
    "proposed": "",
    "diagnosed": "",
    "approved": ":hourglass_flowing_sand: Approved by {who} at {when}",
    "applying": ":hourglass_flowing_sand: Applying, approved by {who} at {when}",
    "applied": ":white_check_mark: Applied by {who} at {when}; following the rollout in the thread",
    "verified": ":white_check_mark: Applied by {who} at {when}; the new pod is Ready (see thread)",
    "failed": ":x: Failed after the decision by {who} at {when} (see thread)",
    "rejected": ":no_entry_sign: Rejected by {who} at {when}; nothing was changed",
    "expired": ":alarm_clock: The proposal expired unused; nothing was changed",
    "rolled-back": ":leftwards_arrow_with_hook: Applied by {who}, then rolled back (see thread)",
    "resolved": ":large_green_circle: Resolved: Alertmanager reports the pod is no longer crash-looping",
}


def _time(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M UTC") if t else "?"


def _section(text: str) -> dict[str, Any]:
    if len(text) > SECTION_LIMIT:
        text = text[: SECTION_LIMIT - 15] + "\n… (truncated)"
    return {"type": "section", "text": {"type": "mrkdwn", "text": text}}


def command_line(argv: list[str]) -> str:
    return shlex.join(argv) if argv else "(none)"


def change_lines(proposal: Proposal) -> list[str]:
    return [f"{c.name}: {c.before if c.before is not None else '(unset)'} → "
            f"{c.after if c.after is not None else '(removed)'}" for c in proposal.changes]


def confirm_text(incident: Incident) -> str:
    """What the Approve button's confirm dialog says: the workload and the change."""
    assert incident.proposal is not None
    w = incident.proposal.workload
    text = f"Patch {w.kind} {w.namespace}/{w.name} (container {w.container}) in cluster {incident.cluster}: " + \
        "; ".join(change_lines(incident.proposal))
    return escape(text)[:300]


def incident_message(incident: Incident) -> tuple[str, list[dict[str, Any]]]:
    d = incident.diagnosis or DiagnosisResult(cause=incident.cause, title=incident.cause or "No known cause",
                                              explanation="")
    p = incident.proposal
    kind = p.workload.kind if p else "workload"
    fallback = escape(f"[{incident.cluster}] {incident.namespace}/{incident.workload}: {d.title}")
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "emoji": True,
                                    "text": f"vLLM crash loop: {incident.namespace}/{incident.workload}"[:150]}},
        {"type": "section", "fields": [
            {"type": "mrkdwn", "text": f"*Cluster*\n{escape(incident.cluster)}"},
            {"type": "mrkdwn", "text": f"*{escape(kind)}*\n{escape(incident.namespace)}/{escape(incident.workload)}"},
            {"type": "mrkdwn", "text": f"*Pod / container*\n{escape(d.pod or ', '.join(incident.pods))} / "
                                       f"{escape(d.container or '?')}"},
            {"type": "mrkdwn", "text": f"*Node*\n{escape(d.node or 'unknown')}"},
            {"type": "mrkdwn", "text": f"*GPU*\n{escape(d.gpu or 'unknown')}"},
            {"type": "mrkdwn", "text": f"*Restarts*\n{incident.restarts if incident.restarts is not None else '?'}"},
        ]},
        _section(f"*Cause:* {escape(d.title)}" + (f"  ({inline_code(d.cause)}, {d.confidence} confidence)"
                                                  if d.cause else "")),
    ]
    if d.explanation:
        blocks.append(_section(escape(d.explanation)))
    if d.evidence:
        lines = list(dict.fromkeys(d.evidence))  # the same line twice says nothing new
        blocks.append(_section("*Evidence* (from the previous container's log and the pod)\n"
                               + code_block("\n".join(lines))))
    if d.memory_picture:
        blocks.append(_section("*GPU memory*\n" + code_block(d.memory_picture)))
    blocks.extend(_proposal_blocks(incident))
    status = _status_line(incident)
    if status:
        blocks.append({**_section(status), "block_id": "status"})
    pods = ", ".join(incident.pods[:5]) + (f" and {len(incident.pods) - 5} more" if len(incident.pods) > 5 else "")
    blocks.append({"type": "context", "block_id": "context", "elements": [{"type": "mrkdwn", "text": escape(
        f"incident {incident.name} · pods {pods} · {incident.alert_count} alert(s) · "
        f"first seen {_time(incident.first_seen)} · last seen {_time(incident.last_seen)}")}]})
    return fallback, blocks[:50]


def _proposal_blocks(incident: Incident) -> list[dict[str, Any]]:
    p = incident.proposal
    d = incident.diagnosis
    if p is None:
        if d is not None and d.cause and d.command_after and d.command_after != d.command_before:
            return [_section("*Suggested change* (no live patch offered for this workload)\nbefore:\n"
                             + code_block(command_line(d.command_before)) + "\nafter:\n"
                             + code_block(command_line(d.command_after)))]
        return [_section("*No change proposed:* no known cause was recognised, so there is nothing safe to apply. "
                         "The evidence above is what the bot saw.")]
    w = p.workload
    changes = "\n".join(f"• {escape(line)}" for line in change_lines(p))
    out = [_section(f"*Proposed change* to {escape(w.kind)} {escape(w.namespace)}/{escape(w.name)}, container "
                    f"{inline_code(w.container)}:\n{changes}"),
           _section("*Command line before*\n" + code_block(command_line(p.command_before), 1400)
                    + "\n*after*\n" + code_block(command_line(p.command_after), 1400))]
    if w.live_patch_blocked:
        where = "\n" + code_block(p.manifest_diff or w.repository_hint or "", 2000) \
            if (p.manifest_diff or w.repository_hint) else ""
        out.append(_section(f":no_entry: *No live patch:* {escape(w.live_patch_blocked)}\n"
                            f"Make this change in the repository instead:{where}"))
    elif p.dry_run_ok is False:
        out.append(_section(f":no_entry: *The server-side dry run failed*, so no button is offered: "
                            f"{escape(p.dry_run_message or 'no reason given')}"))
    if incident.state == "proposed":
        out.append(_decision_buttons(incident))
    return out


def _decision_buttons(incident: Incident) -> dict[str, Any]:
    assert incident.proposal is not None
    return {"type": "actions", "block_id": "decision", "elements": [
        {"type": "button", "action_id": APPROVE, "style": "primary", "value": incident.name,
         "text": {"type": "plain_text", "text": "Approve"},
         "confirm": {"title": {"type": "plain_text", "text": "Apply this change?"},
                     "text": {"type": "mrkdwn", "text": confirm_text(incident)},
                     "confirm": {"type": "plain_text", "text": "Apply"},
                     "deny": {"type": "plain_text", "text": "Cancel"}}},
        {"type": "button", "action_id": REJECT, "style": "danger", "value": incident.name,
         "text": {"type": "plain_text", "text": "Reject"}},
    ]}


def _status_line(incident: Incident) -> str:
    template = STATE_LINES.get(incident.state, incident.state)
    if not template:
        if incident.state == "proposed" and incident.proposal:
            return f"Approvers may apply this until {_time(incident.proposal.expires_at)}."
        return ""
    who = f"<@{incident.approver}>" if incident.approver else "someone"
    return template.format(who=who, when=_time(incident.decided_at))


def rollback_button(incident_name: str) -> dict[str, Any]:
    return {"type": "actions", "block_id": "rollback", "elements": [
        {"type": "button", "action_id": ROLLBACK, "style": "danger", "value": incident_name,
         "text": {"type": "plain_text", "text": "Roll back"},
         "confirm": {"title": {"type": "plain_text", "text": "Roll back this change?"},
                     "text": {"type": "mrkdwn", "text": "Restore the command line recorded before the change."},
                     "confirm": {"type": "plain_text", "text": "Roll back"},
                     "deny": {"type": "plain_text", "text": "Cancel"}}}]}


def note_message(text: str, diagnosis: DiagnosisResult | None = None,
                 rollback_incident: str | None = None) -> tuple[str, list[dict[str, Any]]]:
    """A thread reply. `text` is ours (may hold <@U> mentions we made); the diagnosis is escaped."""
    blocks = [_section(text)]
    if diagnosis is not None:
        blocks.append(_section(f"*Re-diagnosed:* {escape(diagnosis.title)}\n{escape(diagnosis.explanation)}"))
        if diagnosis.evidence:
            blocks.append(_section(code_block("\n".join(diagnosis.evidence))))
        if diagnosis.memory_picture:
            blocks.append(_section(code_block(diagnosis.memory_picture)))
    if rollback_incident:
        blocks.append(rollback_button(rollback_incident))
    return text[:3000], blocks


def blocks_to_text(blocks: list[dict[str, Any]]) -> str:
    """The terminal's rendering of a message: the same words, buttons shown as [Approve]."""
    from bot.slack.escape import unescape

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
