"""What Slack sends the bot: signed requests and button-click payloads, built like Slack builds them."""

from __future__ import annotations

import json
import time
from urllib.parse import urlencode

from slack_sdk.signature import SignatureVerifier

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
CHANNEL = "C0ALERTS"


def signed_headers(body: str, secret: str = SECRET, timestamp: int | None = None) -> dict[str, list[str]]:
    ts = str(timestamp if timestamp is not None else int(time.time()))
    signature = SignatureVerifier(secret).generate_signature(timestamp=ts, body=body)
    return {"content-type": ["application/x-www-form-urlencoded"], "x-slack-signature": [signature],
            "x-slack-request-timestamp": [ts]}


def click_payload(action_id: str, incident: str, user: str, ts: str, channel: str = CHANNEL) -> dict:
    return {"type": "block_actions", "api_app_id": "A0APP", "team": {"id": "T0STANDIN", "domain": "standin"},
               "user": {"id": user, "team_id": "T0STANDIN", "username": user.lower()},
               "channel": {"id": channel, "name": "inference-oncall"},
               "container": {"type": "message", "message_ts": ts, "channel_id": channel, "is_ephemeral": False},
               "message": {"type": "message", "ts": ts, "text": "incident"},
               "trigger_id": "4.5.6", "response_url": "https://hooks.slack.invalid/actions/1",
               "actions": [{"action_id": action_id, "block_id": "decision", "value": incident, "type": "button",
                            "action_ts": str(time.time())}]}


def command_payload(text: str, user: str, channel: str = CHANNEL, command: str = "/vllm") -> dict:
    """A slash command as Slack sends it: the HTTP form's fields; over Socket Mode this object is the payload."""
    return {"token": "verification-token-unused", "team_id": "T0STANDIN", "team_domain": "standin",
            "channel_id": channel, "channel_name": "inference-oncall", "user_id": user, "user_name": user.lower(),
            "command": command, "text": text, "api_app_id": "A0APP", "is_enterprise_install": "false",
            "response_url": "https://hooks.slack.invalid/commands/1", "trigger_id": "1.2.3"}


def click_body(action_id: str, incident: str, user: str, ts: str, channel: str = CHANNEL) -> str:
    return urlencode({"payload": json.dumps(click_payload(action_id, incident, user, ts, channel))})


def decision_value(incident) -> str:
    """What an Approve/Reject button of `incident`'s message carries: its name and proposal digest."""
    return f"{incident.name}|{incident.proposal.digest}"


def button_value(call, action_id: str) -> str | None:
    """The value of the `action_id` button in a recorded chat.postMessage/chat.update call."""
    for block in call.params.get("blocks") or []:
        for element in block.get("elements") or []:
            if element.get("action_id") == action_id:
                return element.get("value")
    return None


def command_body(text: str, user: str, channel: str = CHANNEL) -> str:
    """The form Slack posts for `/vllm TEXT`."""
    return urlencode({"token": "legacy", "team_id": "T0STANDIN", "team_domain": "standin", "channel_id": channel,
                      "channel_name": "inference-oncall", "user_id": user, "user_name": user.lower(),
                      "command": "/vllm", "text": text, "api_app_id": "A0APP",
                      "response_url": "https://hooks.slack.invalid/commands/1", "trigger_id": "1.2.3"})
