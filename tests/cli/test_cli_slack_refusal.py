"""At run time, Slack refusing the bot (not in the channel, a revoked token) turns /readyz to 503
with the fix, logs it once and counts it (issue 19)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from builders import free_port, http
from test_cli_serve_process import env_for

ROOT = Path(__file__).resolve().parents[2]


def start(slack, tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bot.cli", "serve"], env={**os.environ, **env_for(slack, tmp_path, port)},
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return proc, f"http://127.0.0.1:{port}"


def send_alert(base: str) -> None:
    body = (ROOT / "examples" / "incident" / "alert.json").read_bytes()
    req = urllib.request.Request(base + "/alerts", data=body, headers={"Authorization": "Bearer tok",
                                                                       "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=5) as r:
        assert json.loads(r.read())["accepted"] == 1


def stop(proc) -> str:
    proc.terminate()
    out, _ = proc.communicate(timeout=15)
    return out


def test_not_in_channel_turns_readyz_to_503_with_the_invite(slack, tmp_path):
    proc, base = start(slack, tmp_path)
    try:
        assert slack.wait_for(lambda: http(base + "/readyz")[0] == 200, 30), "never became ready"
        slack.not_member.add("C0ALERTS")
        send_alert(base)
        assert slack.wait_for(lambda: http(base + "/readyz")[0] == 503, 30)
        status, text = http(base + "/readyz")
        assert "invite the bot: /invite @vllm-oncall in #C0ALERTS" in text
        assert 'vllm_oncall_slack_refusals_total{error="not_in_channel"}' in http(base + "/metrics")[1]
    finally:
        log = stop(proc)
    fixes = [line for line in log.splitlines() if "/invite @vllm-oncall" in line]
    assert len(fixes) == 1 and "Traceback" not in log, log


def test_a_revoked_token_keeps_readyz_at_503_with_the_reason(slack, tmp_path):
    slack.revoked.add("xoxb-serve")
    proc, base = start(slack, tmp_path)
    try:
        assert slack.wait_for(lambda: "invalid_auth" in http(base + "/readyz")[1], 30)
        status, text = http(base + "/readyz")
        assert status == 503 and "SLACK_BOT_TOKEN" in text
    finally:
        log = stop(proc)
    assert len([line for line in log.splitlines() if "token revoked or wrong: invalid_auth" in line]) == 1, log
