"""The Bolt app: `/vllm` and the Approve / Reject / Roll back buttons.

Every listener acks first (Slack wants an answer within 3 s) and then calls the service; Bolt
runs the rest of the listener in its own thread pool. The handlers only translate Slack's
payloads (read into the typed models of bot/slack/payloads.py) into service calls: who may
click, and what a click does, is decided in the service. A payload that cannot be read gets one
logged line and, where it says who sent it, an answer saying nothing was done.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from slack_bolt import Ack, App
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.app.service import OncallService
from bot.diagnosis.playbooks import PlaybookError, default_playbooks
from bot.slack.blocks import APPROVE, REJECT, ROLLBACK
from bot.slack.escape import escape
from bot.slack.payloads import ButtonClick, ClickOrigin, PayloadError, SlashCommand, click_origin, read

log = logging.getLogger(__name__)

HELP = """*`/vllm` — vLLM crash-loop helper* (cluster {cluster})
• `/vllm why POD` — diagnose a pod (also `NAMESPACE/POD`, or a Deployment/StatefulSet name: its newest crashing pod). Default namespace: `{namespace}`.
• `/vllm playbooks` — the causes the bot recognises and what each one changes.
• `/vllm help` — this text.
Proposals come with *Approve* / *Reject* buttons; only configured approvers may click them, and each proposal works once and expires."""


COMMAND_UNREADABLE = "Sorry, this `/vllm` command could not be read, so nothing was done. Please try again."
CLICK_UNREADABLE = "Sorry, this click could not be read, so nothing was changed. Please try again."
OLD_BUTTON = ("Nothing was changed: this button is from an older message that does not say which proposal it "
              "shows. Use the newest message, or run `/vllm why NAMESPACE/WORKLOAD` for a fresh one.")


def playbooks_text() -> str:
    try:
        books = default_playbooks()
    except PlaybookError as exc:
        log.warning("playbooks not loaded: %s", exc)
        return "No playbooks are installed."
    lines = ["*Causes the bot recognises* (id: title → what it changes)"]
    lines += [f"• `{escape(b.id)}`: {escape(b.title)} → {escape(b.summary)}" for b in books]
    return "\n".join(lines)


def build_app(service: OncallService, client: WebClient, signing_secret: str | None = None,
              token_verification_enabled: bool = True, default_namespace: str = "default") -> App:
    app = App(client=client, signing_secret=signing_secret or "", token_verification_enabled=token_verification_enabled,
              name="vllm-oncall")

    @app.command("/vllm")
    def vllm_command(ack: Ack, command: dict[str, Any]) -> None:
        try:
            asked = read(SlashCommand, command)
        except PayloadError as exc:
            log.warning("could not read a /vllm command: %s", exc)
            ack(COMMAND_UNREADABLE)
            return
        answer_command(service, asked, ack, default_namespace)

    def on_click(use_case: str, decide: Callable[[ButtonClick], str]):
        def handler(ack: Ack, body: dict[str, Any]) -> None:
            ack()
            try:
                click = read(ButtonClick, body)
            except PayloadError as exc:
                log.warning("could not read a button click (%s): %s", use_case, exc)
                tell_unreadable_click(client, click_origin(body))
                return
            outcome = decide(click)
            log.info("%s on %s by %s: %s", use_case, click.incident, click.user_id, outcome)
        return handler

    def decision(decide: Callable[..., str]) -> Callable[[ButtonClick], str]:
        """Approve and Reject act only on the proposal the clicked message showed (its digest)."""
        def run(click: ButtonClick) -> str:
            if click.digest is None:
                tell(client, click.channel_id, click.user_id, OLD_BUTTON)
                return "no_digest"
            return decide(click.incident, click.user_id, click.message_ref, click.digest)
        return run

    app.action(APPROVE)(on_click("approve", decision(service.approve)))
    app.action(REJECT)(on_click("reject", decision(service.reject)))
    app.action(ROLLBACK)(on_click("roll_back", lambda c: service.roll_back(c.incident, c.user_id, c.message_ref)))
    return app


def answer_command(service: OncallService, asked: SlashCommand, ack: Ack, default_namespace: str) -> None:
    verb, rest = asked.verb, asked.argument
    help_text = HELP.format(cluster=escape(service.cluster.name), namespace=escape(default_namespace))
    if verb in ("", "help"):
        ack(help_text)
    elif verb == "playbooks":
        ack(playbooks_text())
    elif verb == "why" and rest:
        ack(f"Looking at `{escape(rest)}` in cluster {escape(service.cluster.name)}…")
        service.answer_why(rest, channel=asked.channel_id, user=asked.user_id)
    elif verb == "why":
        ack("Usage: `/vllm why POD`, `/vllm why NAMESPACE/POD` or `/vllm why DEPLOYMENT`.")
    else:
        ack(f"Unknown command `{escape(verb)}`.\n" + help_text)


def tell_unreadable_click(client: WebClient, origin: ClickOrigin) -> None:
    """Tell whoever clicked that nothing happened, if the payload says who and where."""
    tell(client, origin.channel_id, origin.user.id if origin.user else None, CLICK_UNREADABLE)


def tell(client: WebClient, channel: str | None, user: str | None, text: str) -> None:
    if not (user and channel):
        return
    try:
        client.chat_postEphemeral(channel=channel, user=user, text=text)
    except (SlackApiError, OSError) as exc:
        detail = exc.response.get("error") if isinstance(exc, SlackApiError) else exc
        log.warning("could not tell %s that their click was unreadable: %s", user, detail)
