"""`vllm-oncall test-incident` and `/vllm test` (issue 19): the bundled example posted to the real
channel, labelled as a test, with buttons that answer and change nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from builders import free_port, http
from slackapi.requests import button_value, click_body, command_body, signed_headers
from test_cli_serve_process import env_for

from bot.slack.blocks import APPROVE

ROOT = Path(__file__).resolve().parents[2]


def approve_env(slack, tmp_path, port):
    return {**os.environ, **env_for(slack, tmp_path, port), "VLLM_ONCALL_MODE": "approve"}


def signed_post(url: str, body: str) -> tuple[int, str]:
    headers = {k: v[0] for k, v in signed_headers(body, secret="s3").items()}
    with urllib.request.urlopen(urllib.request.Request(url, data=body.encode(), headers=headers), timeout=10) as r:
        return r.status, r.read().decode()


def test_test_incident_posts_a_labelled_incident_whose_approve_changes_nothing(slack, tmp_path):
    env = approve_env(slack, tmp_path, free_port())
    out = subprocess.run([sys.executable, "-m", "bot.cli", "test-incident"], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "posted test incident vllm-oncall-test-" in out.stdout and "C0ALERTS" in out.stdout
    [post] = slack.posts()
    assert post.params["channel"] == "C0ALERTS" and "[vllm-oncall-test]" in post.params["text"]
    [note] = slack.replies()
    assert "Test incident" in note.params["text"] and "nobody was paged" in note.params["text"]
    approve = button_value(post, APPROVE)
    assert approve and approve.startswith("vllm-oncall-test-")

    # The running bot answers a click on it: a test, nothing changed, and nothing patched.
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bot.cli", "serve"], env=approve_env(slack, tmp_path, port),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        assert slack.wait_for(lambda: http(base + "/readyz")[0] == 200, 30), "never became ready"
        ts = note.params["thread_ts"]
        assert signed_post(base + "/slack/events", click_body(APPROVE, approve, "U0A", ts))[0] == 200
        assert slack.wait_for(lambda: slack.delivered("chat.postEphemeral"), 30)
        [told] = slack.delivered("chat.postEphemeral")
        assert told.params["user"] == "U0A" and "test incident" in told.params["text"]
        assert "nothing was changed" in told.params["text"]
        assert slack.delivered("chat.update") == []
        assert not list((tmp_path / "state").rglob("*.yaml")), "nothing patched"
    finally:
        proc.terminate()
        proc.wait(15)


def test_slash_vllm_test_posts_for_approvers_only(slack, tmp_path):
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bot.cli", "serve"], env=approve_env(slack, tmp_path, port),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        assert slack.wait_for(lambda: http(base + "/readyz")[0] == 200, 30), "never became ready"
        status, answer = signed_post(base + "/slack/events", command_body("test", "U0STRANGER"))
        assert status == 200 and "Only approvers" in answer
        status, answer = signed_post(base + "/slack/events", command_body("test", "U0A"))
        assert status == 200 and "Posting a test incident" in answer
        assert slack.wait_for(lambda: len(slack.replies()) == 1, 60)  # the incident, then its thread note
        assert [p.params["channel"] for p in slack.posts()] == ["C0ALERTS"]
        assert "[vllm-oncall-test]" in slack.posts()[0].params["text"]
    finally:
        proc.terminate()
        proc.wait(15)
