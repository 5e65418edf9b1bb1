"""`serve --check` asks Slack (issue 19): the token, its scopes, the channel; one line per fix."""

from __future__ import annotations

import os
import subprocess
import sys

from builders import free_port
from test_cli_serve_process import env_for


def check(env: dict[str, str], *extra: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bot.cli", "serve", "--check", *extra], env={**os.environ, **env},
                          cwd=cwd, capture_output=True, text=True, timeout=120)


def test_check_passes_when_slack_accepts_the_bot(slack, tmp_path):
    done = check(env_for(slack, tmp_path, 0), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "slack OK" in done.stdout and slack.delivered("auth.test") and slack.delivered("conversations.info")


def test_a_bot_not_invited_is_told_to_invite_it(slack, tmp_path):
    slack.not_member.add("C0ALERTS")
    done = check(env_for(slack, tmp_path, 0), cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "vllm-oncall serve: Slack: invite the bot: /invite @vllm-oncall in #name-of-c0alerts"]


def test_a_revoked_token_is_named(slack, tmp_path):
    slack.revoked.add("xoxb-serve")
    done = check(env_for(slack, tmp_path, 0), cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "token revoked or wrong: invalid_auth" in line and "SLACK_BOT_TOKEN" in line


def test_missing_scopes_are_listed(slack, tmp_path):
    slack.scopes = ["chat:write", "commands"]
    done = check(env_for(slack, tmp_path, 0), cwd=tmp_path)
    assert done.returncode == 2
    assert "lacks the scopes channels:history, groups:history, users:read, usergroups:read" in done.stderr


def test_unreachable_slack_names_the_url(slack, tmp_path):
    port = free_port()  # nothing listens there
    env = {**env_for(slack, tmp_path, 0), "SLACK_API_URL": f"http://127.0.0.1:{port}/api/"}
    done = check(env, cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert f"Slack unreachable at http://127.0.0.1:{port}/api/" in line


def test_offline_check_does_not_call_slack(slack, tmp_path):
    slack.revoked.add("xoxb-serve")
    done = check(env_for(slack, tmp_path, 0), "--offline", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert slack.delivered("auth.test") == [] and "slack OK" not in done.stdout


