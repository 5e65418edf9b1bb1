"""The Slack app manifest asks for every scope the Web API methods the bot calls need."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
# bot/slack/chat.py's methods and the scope each needs (conversations.history: public and private channels)
NEEDED = {"chat.postMessage": {"chat:write"}, "chat.update": {"chat:write"}, "chat.postEphemeral": {"chat:write"},
          "users.info": {"users:read"}, "usergroups.users.list": {"usergroups:read"},
          "conversations.history": {"channels:history", "groups:history"},
          "conversations.replies": {"channels:history", "groups:history"}, "auth.test": set(),
          "chat.getPermalink": set()}  # Slack: no scope required


def test_the_manifest_grants_what_the_bot_calls():
    manifest = yaml.safe_load((ROOT / "deploy" / "slack-app-manifest.yaml").read_text())
    scopes = set(manifest["oauth_config"]["scopes"]["bot"])
    for method, needed in NEEDED.items():
        assert needed <= scopes, f"{method} needs {needed - scopes}"
    source = (ROOT / "bot" / "slack" / "chat.py").read_text()
    called = set(re.findall(r'"((?:chat|conversations|users|usergroups|auth)\.[A-Za-z.]+)"', source))  # every method named
    assert called == set(NEEDED), (called - set(NEEDED), set(NEEDED) - called)  # this table follows the code
