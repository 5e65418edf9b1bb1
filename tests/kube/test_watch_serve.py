"""`vllm-oncall serve` with VLLM_ONCALL_WATCH=true as a real process, against the Kubernetes API
stand-in (through a kubeconfig) and the Slack stand-in: a vLLM container's first crash becomes a
Slack message with no alert sent at all."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kubeapi.server import FakeKube
from slackapi import SlackStandIn
from test_pod_watch import NS, crash, running_vllm

ROOT = Path(__file__).resolve().parents[2]


def test_serve_with_the_watch_posts_a_first_crash_without_any_alert(tmp_path):
    kube, slack = FakeKube().start(), SlackStandIn().start()
    pod = running_vllm(kube, "vllm-llama3-8b")
    env = {**os.environ, "KUBECONFIG": str(kube.write_kubeconfig(tmp_path / "kubeconfig")),
           "VLLM_ONCALL_CLUSTER": "watch-test", "SLACK_BOT_TOKEN": "xoxb-serve", "SLACK_SIGNING_SECRET": "s3",
           "SLACK_API_URL": slack.url, "VLLM_ONCALL_SLACK_CHANNEL": "C0ALERTS", "VLLM_ONCALL_APPROVERS": "U0A",
           "VLLM_ONCALL_ALERTS_UNAUTHENTICATED": "true", "VLLM_ONCALL_LISTEN": "127.0.0.1:0", "VLLM_ONCALL_STORE": "kube",
           "VLLM_ONCALL_INCIDENT_NAMESPACE": "vllm-oncall", "VLLM_ONCALL_WATCH": "true",
           "VLLM_ONCALL_WATCH_NAMESPACES": NS}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    proc = subprocess.Popen([sys.executable, "-m", "bot.cli", "serve"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert kube.wait_for_watchers(1, timeout=30), "serve never opened the pod watch"
        crash(kube, pod)
        # No alert is ever sent, so a post can only come from the watch's event. How many seconds
        # it takes is the machine's load, not the bot's (a stopwatch here failed under load).
        assert slack.wait_for(lambda: len(slack.posts()) == 1, 15), "the first crash was not posted"
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=60)  # a bound for a loaded machine; it exits at once when idle
        slack.stop()
        kube.stop()
    assert "pod watch on: first crashes of vLLM containers in inference" in out
