"""`serve --check` against Slack: the token, its scopes, the channel's membership. Each problem is
one line saying what to fix; the same fixes are logged when Slack refuses the bot at run time."""

from __future__ import annotations

import http.client
import logging
import urllib.error
from typing import Any

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError

# The scopes the bot's calls need (deploy/slack-app-manifest.yaml says which call uses which).
REQUIRED_SCOPES = ("chat:write", "commands", "channels:history", "groups:history", "users:read", "usergroups:read")
TOKEN_REFUSED = frozenset({"invalid_auth", "token_revoked", "token_expired", "account_inactive", "not_authed"})


def fix_for(error: str, channel: str, bot_name: str = "vllm-oncall") -> str | None:
    """The one line that says how to fix a Slack refusal that stops the bot, or None."""
    if error in TOKEN_REFUSED:
        return (f"token revoked or wrong: {error}; put the app's Bot User OAuth Token (xoxb-...) in SLACK_BOT_TOKEN "
                "(reinstall the app to get a new one)")
    if error in ("not_in_channel", "channel_not_found"):
        return f"invite the bot: /invite @{bot_name} in #{channel} (Slack answered {error})"
    return None


def slack_problems(client: WebClient, channel: str, api_url: str) -> list[str]:
    """Empty when Slack accepts the token, it carries every scope the bot uses and the bot is a
    member of `channel`; else one line per problem."""
    sdk_log = client.logger
    level = sdk_log.level
    sdk_log.setLevel(logging.CRITICAL)  # its "Failed to send a request" would come above our one line
    try:
        return _problems(client, channel, api_url)
    finally:
        sdk_log.setLevel(level)


def _unreachable(api_url: str, exc: Exception) -> str:
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return (f"Slack unreachable at {api_url}: {' '.join(str(reason).split()) or type(exc).__name__}; "
            "check SLACK_API_URL and that the pod may reach it (proxy, NetworkPolicy)")


def _problems(client: WebClient, channel: str, api_url: str) -> list[str]:
    try:
        auth = client.auth_test()
    except SlackApiError as exc:
        error = str(exc.response.get("error"))
        return [fix_for(error, channel) or f"Slack refused auth.test: {error}"]
    except (OSError, http.client.HTTPException) as exc:
        return [_unreachable(api_url, exc)]
    problems = []
    granted = _scopes(auth.headers)
    missing = [s for s in REQUIRED_SCOPES if granted is not None and s not in granted]
    if missing:
        problems.append(f"the token lacks the scopes {', '.join(missing)}: add them to the app "
                        "(deploy/slack-app-manifest.yaml) and reinstall it")
    bot_name = str(auth.get("user") or "vllm-oncall")
    try:
        info = client.conversations_info(channel=channel)
    except SlackApiError as exc:
        error = str(exc.response.get("error"))
        if error == "channel_not_found":
            problems.append(f"channel {channel} not found: set VLLM_ONCALL_SLACK_CHANNEL to its ID (C...) "
                            f"and /invite @{bot_name} there")
        elif error == "missing_scope":
            problems.append(f"cannot check that the bot is in {channel}: add channels:read (groups:read for a "
                            "private channel) to the app and reinstall it")
        else:
            problems.append(f"Slack refused conversations.info for {channel}: {error}")
        return problems
    except (OSError, http.client.HTTPException) as exc:
        return [*problems, _unreachable(api_url, exc)]
    conversation: dict[str, Any] = info.get("channel") or {}
    if not conversation.get("is_member"):
        problems.append(f"invite the bot: /invite @{bot_name} in #{conversation.get('name') or channel}")
    return problems


def _scopes(headers: Any) -> set[str] | None:
    """Slack's `x-oauth-scopes` header (comma-separated); None when it did not send one."""
    for key, value in dict(headers or {}).items():
        if key.lower() == "x-oauth-scopes":
            text = value[0] if isinstance(value, list) else value
            return {s.strip() for s in str(text).split(",") if s.strip()}
    return None
