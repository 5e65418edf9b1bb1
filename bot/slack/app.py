"""The Bolt app: `/vllm` and the Approve / Reject / Roll back buttons.

Every listener acks first (Slack wants an answer within 3 s) and then calls the service; Bolt
runs the rest of the listener in its own thread pool. The handlers only translate Slack's
payloads into service calls: who may click, and what a click does, is decided in the service.
"""

from __future__ import annotations

import logging
from typing import Any

from slack_bolt import Ack, App
from slack_sdk import WebClient

from bot.diagnosis.playbooks import PlaybookError, default_playbooks
from bot.app.records import MessageRef
from bot.app.service import OncallService
from bot.slack.blocks import APPROVE, REJECT, ROLLBACK
from bot.slack.escape import escape

log = logging.getLogger(__name__)

HELP = """*`/vllm` — vLLM crash-loop helper* (cluster {cluster})
• `/vllm why POD` — diagnose a pod (also `NAMESPACE/POD`, or a Deployment/StatefulSet name: its newest crashing pod). Default namespace: `{namespace}`.
• `/vllm playbooks` — the causes the bot recognises and what each one changes.
• `/vllm help` — this text.
Proposals come with *Approve* / *Reject* buttons; only configured approvers may click them, and each proposal works once and expires."""


def playbooks_text() -> str:
    try:
        books = default_playbooks()
    except PlaybookError as exc:
        log.warning("playbooks not loaded: %s", exc)
        return "No playbooks are installed."
    lines = ["*Causes the bot recognises* (id: title → what it changes)"]
    lines += [f"• `{escape(b.id)}`: {escape(b.title)} → {escape(b.summary)}" for b in books]
    return "\n".join(lines)


def _clicked(body: dict[str, Any]) -> MessageRef | None:
    channel = (body.get("channel") or {}).get("id") or (body.get("container") or {}).get("channel_id")
    ts = (body.get("message") or {}).get("ts") or (body.get("container") or {}).get("message_ts")
    return MessageRef(channel=channel, ts=ts) if channel and ts else None


def build_app(service: OncallService, client: WebClient, signing_secret: str | None = None,
              token_verification_enabled: bool = True, default_namespace: str = "default") -> App:
    app = App(client=client, signing_secret=signing_secret or "", token_verification_enabled=token_verification_enabled,
              name="vllm-oncall")

    @app.command("/vllm")
    def vllm_command(ack: Ack, command: dict[str, Any]) -> None:
        verb, _, rest = (command.get("text") or "").strip().partition(" ")
        verb, rest = verb.lower(), rest.strip()
        if verb in ("", "help"):
            ack(HELP.format(cluster=escape(service.cluster.name), namespace=escape(default_namespace)))
        elif verb == "playbooks":
            ack(playbooks_text())
        elif verb == "why" and rest:
            ack(f"Looking at `{escape(rest)}` in cluster {escape(service.cluster.name)}…")
            service.answer_why(rest, channel=command["channel_id"], user=command["user_id"])
        elif verb == "why":
            ack("Usage: `/vllm why POD`, `/vllm why NAMESPACE/POD` or `/vllm why DEPLOYMENT`.")
        else:
            ack(f"Unknown command `{escape(verb)}`.\n"
                + HELP.format(cluster=escape(service.cluster.name), namespace=escape(default_namespace)))

    def on_click(use_case: str):
        def handler(ack: Ack, body: dict[str, Any]) -> None:
            ack()
            name = body["actions"][0]["value"]
            user = body["user"]["id"]
            outcome = getattr(service, use_case)(name, user, _clicked(body))
            log.info("%s on %s by %s: %s", use_case, name, user, outcome)
        return handler

    app.action(APPROVE)(on_click("approve"))
    app.action(REJECT)(on_click("reject"))
    app.action(ROLLBACK)(on_click("roll_back"))
    return app
