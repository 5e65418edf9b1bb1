"""The Bolt app: `/vllm` and the Approve / Reject / Roll back buttons.

Every listener acks first (Slack wants an answer within 3 s) and then calls the service; Bolt
runs the rest of the listener in its own thread pool. The handlers only translate Slack's
payloads (read into the typed models of bot/slack/payloads.py) into service calls: who may
click, and what a click does, is decided in the service. A payload that cannot be read gets one
logged line and, where it says who sent it, an answer saying nothing was done.

One process may serve several clusters (bot.app.router): a click goes to the cluster whose store
holds its incident, `/vllm why CLUSTER:NS/POD` to the cluster named (the default without one).
A click for an incident no served cluster holds, or a cluster this bot does not serve, is
answered with one line saying nothing was changed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any

from slack_bolt import Ack, App
from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

from bot.app.errors import ClusterUnavailable
from bot.app.rehearsal import TEST_CLICK_ANSWER, is_test_incident
from bot.app.router import ClusterRouter, UnknownCluster
from bot.app.service import OncallService
from bot.app.state import Outcome
from bot.diagnosis.playbooks import PlaybookError, default_playbooks
from bot.slack.blocks import APPROVE, REJECT, ROLLBACK
from bot.slack.escape import escape
from bot.slack.payloads import ButtonClick, ClickOrigin, PayloadError, SlashCommand, click_origin, read

log = logging.getLogger(__name__)

HELP = """*`/vllm` — vLLM crash-loop helper* ({where})
• `/vllm why POD` — diagnose a pod (also `NAMESPACE/POD`, or a Deployment/StatefulSet name: its newest crashing pod). Default namespace: `{namespace}`.{clusters}
• `/vllm playbooks` — the causes the bot recognises and what each one changes.
• `/vllm test` — approvers: post a test incident here (its buttons change nothing).
• `/vllm help` — this text.
Proposals come with *Approve* / *Reject* buttons; only configured approvers may click them, and each proposal works once and expires."""


COMMAND_UNREADABLE = "Sorry, this `/vllm` command could not be read, so nothing was done. Please try again."
CLICK_UNREADABLE = "Sorry, this click could not be read, so nothing was changed. Please try again."
CLUSTERS_HELP = ("\n• `/vllm why CLUSTER:NAMESPACE/POD` — the same in another cluster this bot serves: {served}. "
                 "Without `CLUSTER:` it looks in `{default}`.")
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


def build_app(served: OncallService | ClusterRouter, client: WebClient, signing_secret: str | None = None,
              token_verification_enabled: bool = True, default_namespace: str = "default",
              listener_executor: Executor | None = None,
              post_test_incident: Callable[[str], str] | None = None) -> App:
    """The Bolt app of one cluster's service, or of a router over several clusters. The listeners
    run on `listener_executor` (Bolt's own thread pool when None; a test passes one it can wait on)."""
    router = ClusterRouter.of(served)
    app = App(client=client, signing_secret=signing_secret or "", token_verification_enabled=token_verification_enabled,
              name="vllm-oncall", listener_executor=listener_executor)

    @app.command("/vllm")
    def vllm_command(ack: Ack, command: dict[str, Any]) -> None:
        try:
            asked = read(SlashCommand, command)
        except PayloadError as exc:
            log.warning("could not read a /vllm command: %s", exc)
            ack(COMMAND_UNREADABLE)
            return
        if asked.verb == "test" and post_test_incident is not None:
            answer_test(router, asked, ack, post_test_incident)
            return
        answer_command(router, asked, ack, default_namespace)

    def on_click(use_case: str, decide: Callable[[OncallService, ButtonClick], Outcome]):
        def handler(ack: Ack, body: dict[str, Any]) -> None:
            ack()
            try:
                click = read(ButtonClick, body)
            except PayloadError as exc:
                log.warning("could not read a button click (%s): %s", use_case, exc)
                tell_unreadable_click(client, click_origin(body))
                return
            if is_test_incident(click.incident):  # the test incident's buttons change nothing, anywhere
                tell(client, click.channel_id, click.user_id, TEST_CLICK_ANSWER)
                log.info("%s on test incident %s by %s: nothing to change", use_case, click.incident, click.user_id)
                return
            service, refusal = route_click(router, click)
            if service is None:
                tell(client, click.channel_id, click.user_id, refusal)
                outcome = Outcome.NOT_SERVED
            else:
                outcome = decide(service, click)
            log.info("%s on %s by %s: %s", use_case, click.incident, click.user_id, outcome)
        return handler

    def decision(use_case: str) -> Callable[[OncallService, ButtonClick], Outcome]:
        """Approve and Reject act only on the proposal the clicked message showed (its digest)."""
        def run(service: OncallService, click: ButtonClick) -> Outcome:
            if click.digest is None:
                tell(client, click.channel_id, click.user_id, OLD_BUTTON)
                return Outcome.NO_DIGEST
            decide = service.approve if use_case == "approve" else service.reject
            return decide(click.incident, click.user_id, click.message_ref, click.digest)
        return run

    app.action(APPROVE)(on_click("approve", decision("approve")))
    app.action(REJECT)(on_click("reject", decision("reject")))
    app.action(ROLLBACK)(on_click("roll_back", lambda s, c: s.roll_back(c.incident, c.user_id, c.message_ref)))
    return app


# The cluster an incident message names: its fallback text begins `[CLUSTER] ` (bot.slack.blocks).
_MESSAGE_CLUSTER = re.compile(r"\[([A-Za-z0-9][A-Za-z0-9._-]{0,62})\] ")


def route_click(router: ClusterRouter, click: ButtonClick) -> tuple[OncallService | None, str]:
    """The service of the cluster whose store holds the clicked incident, or None and the one
    line to answer with (nothing was changed). A single cluster's service answers every click."""
    try:
        service = router.for_incident(click.incident)
    except ClusterUnavailable as exc:
        return None, f"Nothing was changed: {escape(str(exc))}. Please try again in a moment."
    if service is not None:
        return service, ""
    named = _MESSAGE_CLUSTER.match(click.message_text or "")
    served = ", ".join(f"`{escape(n)}`" for n in router.names)
    if named and named.group(1) not in router.services:
        return None, (f"Nothing was changed: this bot does not serve cluster `{escape(named.group(1))}` "
                      f"(it serves {served}).")
    where = f"in cluster `{escape(named.group(1))}`" if named else f"in any cluster this bot serves ({served})"
    return None, f"Nothing was changed: this proposal no longer exists {where}."


def help_text(router: ClusterRouter, default_namespace: str) -> str:
    clusters = ""
    if len(router) > 1:
        clusters = CLUSTERS_HELP.format(served=", ".join(f"`{escape(n)}`" for n in router.names),
                                        default=escape(router.default_name))
    where = f"cluster {escape(router.default_name)}" if len(router) == 1 else \
        f"clusters {', '.join(escape(n) for n in router.names)}; default {escape(router.default_name)}"
    return HELP.format(where=where, namespace=escape(default_namespace), clusters=clusters)


def route_why(router: ClusterRouter, argument: str) -> tuple[OncallService, str]:
    """`CLUSTER:NS/POD` -> (that cluster's service, `NS/POD`); no prefix -> the default cluster.
    Kubernetes names never hold a colon, so the first one ends the cluster. Raises UnknownCluster."""
    cluster, colon, query = argument.partition(":")
    if not colon:
        return router.default, argument
    return router.for_cluster(cluster.strip()), query.strip()


def answer_command(router: ClusterRouter, asked: SlashCommand, ack: Ack, default_namespace: str) -> None:
    verb, rest = asked.verb, asked.argument
    helping = help_text(router, default_namespace)
    if verb in ("", "help"):
        ack(helping)
    elif verb == "playbooks":
        ack(playbooks_text())
    elif verb == "why" and rest:
        try:
            service, query = route_why(router, rest)
        except UnknownCluster as exc:
            served = ", ".join(f"`{escape(n)}`" for n in exc.served)
            ack(f"Nothing was done: this bot does not serve cluster `{escape(exc.cluster)}`; it serves {served} "
                "(`/vllm why CLUSTER:NAMESPACE/POD`).")
            return
        if not query:
            ack("Usage: `/vllm why CLUSTER:NAMESPACE/POD` — the pod is missing after the cluster.")
            return
        ack(f"Looking at `{escape(query)}` in cluster {escape(service.cluster.name)}…")
        service.answer_why(query, channel=asked.channel_id, user=asked.user_id)
    elif verb == "why":
        ack("Usage: `/vllm why POD`, `/vllm why NAMESPACE/POD` or `/vllm why DEPLOYMENT`.")
    else:
        ack(f"Unknown command `{escape(verb)}`.\n" + helping)


def answer_test(router: ClusterRouter, asked: SlashCommand, ack: Ack, post_test_incident: Callable[[str], str]) -> None:
    """`/vllm test`, for approvers: the test incident in this channel (bot.app.rehearsal)."""
    if not router.default.approvers.is_approver(asked.user_id, channel=asked.channel_id):
        ack("Only approvers may post a test incident; nothing was posted.")
        return
    ack("Posting a test incident here (its buttons change nothing)…")
    log.info("/vllm test by %s in %s: %s", asked.user_id, asked.channel_id, post_test_incident(asked.channel_id))


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
