"""`vllm-oncall serve` as a real process: settings -> wiring -> HTTP server -> Slack stand-in."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from builders import free_port, http
from slackapi import SlackStandIn
from slackapi.requests import command_payload

from bot.cli.settings import load_settings
from bot.cli.wiring import build_server

ROOT = Path(__file__).resolve().parents[2]




def env_for(slack: SlackStandIn, tmp_path: Path, port: int) -> dict[str, str]:
    return {"VLLM_ONCALL_CLUSTER": "serve-test", "SLACK_BOT_TOKEN": "xoxb-serve", "SLACK_SIGNING_SECRET": "s3",
            "SLACK_API_URL": slack.url, "VLLM_ONCALL_SLACK_CHANNEL": "C0ALERTS", "VLLM_ONCALL_APPROVERS": "U0A",
            "VLLM_ONCALL_LISTEN": f"127.0.0.1:{port}", "VLLM_ONCALL_ALERT_TOKEN": "tok",
            "VLLM_ONCALL_STORE": "folder", "VLLM_ONCALL_STATE_DIR": str(tmp_path / "state"),
            "VLLM_ONCALL_CLUSTER_SOURCE": "local",
            "VLLM_ONCALL_BUNDLE_DIR": str(ROOT / "examples" / "incident" / "bundle")}


def test_serve_process_takes_an_alert_to_slack(slack, tmp_path):
    port = free_port()
    env = {**os.environ, **env_for(slack, tmp_path, port)}
    proc = subprocess.Popen([sys.executable, "-m", "bot.cli", "serve"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        assert slack.wait_for(lambda: http(base + "/readyz")[0] == 200, 30), "never became ready"
        assert http(base + "/healthz") == (200, "ok\n")
        body = (ROOT / "examples" / "incident" / "alert.json").read_bytes()
        req = urllib.request.Request(base + "/alerts", data=body, headers={"Authorization": "Bearer tok",
                                                                           "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            assert json.loads(r.read())["accepted"] == 1
        assert slack.wait_for(lambda: len(slack.posts()) == 1, 30)
        assert "serve-test" in json.dumps(slack.posts()[0].params["blocks"])
        assert slack.delivered("auth.test"), "readiness asked Slack"
        # the stand-in records the post before the bot has read Slack's answer and counted it
        assert slack.wait_for(lambda: "vllm_oncall_incidents_posted_total 1.0" in http(base + "/metrics")[1], 30)
        assert http(base + "/metrics")[0] == 200
        # posted once, carrying the identity it was stored with (nothing to recover on a clean post)
        [message] = slack.channel_messages("C0ALERTS")
        [record] = [json.loads(p.read_text()) for p in (tmp_path / "state").rglob("*.json")]
        assert message["ts"] == record["slack_ts"] and message["metadata"]["event_payload"] == {
            "incident": record["name"], "post_key": record["post_key"]}
        assert "vllm_oncall_posts_recovered_total 0.0" in http(base + "/metrics")[1]
        proc.terminate()  # SIGTERM, as Kubernetes sends it
        assert proc.wait(15) == 0
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_serve_process_in_socket_mode_answers_over_the_socket_and_stops_on_sigterm(slack, socket_mode, tmp_path):
    """The real process: apps.connections.open with the app token, the WebSocket, /vllm over it."""
    env = {**os.environ, **env_for(slack, tmp_path, free_port()), "SLACK_APP_TOKEN": "xapp-1-serve",
           "VLLM_ONCALL_SLACK_PING_SECONDS": "0.5"}
    proc = subprocess.Popen([sys.executable, "-m", "bot.cli", "serve"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert socket_mode.wait_for(lambda: len(socket_mode.open_connections("xapp-1-serve")) == 1, 30), \
            "the process never connected over Socket Mode"
        helped = socket_mode.slash_command(command_payload("help", "U0A"))
        assert helped.wait_acked(10) and "/vllm why POD" in helped.response["text"]
        asked = socket_mode.slash_command(command_payload("why inference/vllm-llama3-8b-7d9f8c6b5-x2k4p", "U0A", channel="C0ALERTS"))
        assert asked.wait_acked(10) and "Looking at" in asked.response["text"]
        assert slack.wait_for(lambda: len(slack.posts()) == 1, 30), "the diagnosis was never posted"
        assert "Approve" in json.dumps(slack.posts()[0].params["blocks"])
        proc.terminate()  # SIGTERM: the socket is closed and the process exits cleanly
        assert proc.wait(15) == 0
        assert socket_mode.wait_for(lambda: socket_mode.open_connections("xapp-1-serve") == [], 10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_socket_mode_is_chosen_by_the_app_token(slack, tmp_path):
    env = {**env_for(slack, tmp_path, 0), "SLACK_APP_TOKEN": "xapp-1-test"}
    server, socket_handler = build_server(load_settings(env))
    try:
        assert socket_handler is not None and server.bolt_app is None  # Slack events come over the socket
    finally:
        server.stop()
    server, socket_handler = build_server(load_settings(env_for(slack, tmp_path, 0)))
    try:
        assert socket_handler is None and server.bolt_app is not None  # HTTP: /slack/events
    finally:
        server.stop()
