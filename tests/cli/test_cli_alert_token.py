"""Issue 17, item 9: `serve` never listens for unauthenticated alerts by omission.

Without VLLM_ONCALL_ALERT_TOKEN the process refuses to start (one line, exit 2), and so does
`serve --check`; VLLM_ONCALL_ALERTS_UNAUTHENTICATED=true starts it all the same, says so loudly
at start, and /alerts then takes an alert without a bearer token. The real process, the Slack
stand-in, the bundled example as a local cluster.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from builders import free_port, http
from test_cli_serve_process import env_for

from bot.cli.settings import load_settings
from bot.cli.wiring import CheckFailed, build

ROOT = Path(__file__).resolve().parents[2]


def without_token(slack, tmp_path, port: int) -> dict[str, str]:
    return {k: v for k, v in {**os.environ, **env_for(slack, tmp_path, port)}.items()
            if k not in ("VLLM_ONCALL_ALERT_TOKEN", "VLLM_ONCALL_ALERTS_UNAUTHENTICATED")}


def test_serve_without_an_alert_token_refuses_to_start_in_one_line(slack, tmp_path):
    for args in (["serve"], ["serve", "--check", "--offline"]):
        done = subprocess.run([sys.executable, "-m", "bot.cli", *args], env=without_token(slack, tmp_path, free_port()),
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
        [line] = done.stderr.strip().splitlines()
        assert "VLLM_ONCALL_ALERT_TOKEN is not set" in line and "VLLM_ONCALL_ALERTS_UNAUTHENTICATED=true" in line
        assert not slack.posts()


def test_an_empty_token_is_no_token(slack, tmp_path):
    env = {**without_token(slack, tmp_path, 0), "VLLM_ONCALL_ALERT_TOKEN": ""}
    try:
        build(load_settings(env)).server.stop()
    except CheckFailed as exc:
        assert "VLLM_ONCALL_ALERT_TOKEN is not set" in str(exc)
    else:
        raise AssertionError("built a server whose /alerts takes anyone's alerts")


def test_unauthenticated_alerts_only_when_said_and_said_loudly(slack, tmp_path):
    port = free_port()
    env = {**without_token(slack, tmp_path, port), "VLLM_ONCALL_ALERTS_UNAUTHENTICATED": "true"}
    proc = subprocess.Popen([sys.executable, "-m", "bot.cli", "serve"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        assert slack.wait_for(lambda: http(base + "/readyz")[0] == 200, 30), "never became ready"
        body = (ROOT / "examples" / "incident" / "alert.json").read_bytes()
        req = urllib.request.Request(base + "/alerts", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            assert json.loads(r.read())["accepted"] == 1
        assert slack.wait_for(lambda: len(slack.posts()) == 1, 30)
        proc.terminate()
        out, _ = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    warnings = [line for line in out.splitlines() if "WARNING" in line and "WITHOUT a bearer token" in line]
    assert len(warnings) == 1, out
    assert "(NO bearer token: unauthenticated)" in out
