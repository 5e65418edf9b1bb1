"""A 429 with Retry-After: 3600 from the Kubernetes API, through the real client: the bot's
policy caps the wait, logs that it capped it, and the retry reaches the bot's own Prometheus
counter as `serve` wires it."""

from __future__ import annotations

import threading

import pytest
from kubeapi.objects import crashing_deployment
from prometheus_client import generate_latest

from bot.app.metrics import Metrics
from bot.cli.settings import load_settings
from bot.cli.wiring import Parts

NS = "inference"


def metric(metrics: Metrics, name: str) -> float:
    for line in generate_latest(metrics.registry).decode().splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not exported")


@pytest.mark.integration
def test_an_hour_long_retry_after_is_capped_logged_and_counted_on_metrics(kube_api, caplog):
    _, pod = crashing_deployment(kube_api)
    kube_api.fail("get", "pods", 429, times=1, retry_after="3600")
    waits: list[float] = []
    metrics = Metrics()
    settings = load_settings({"VLLM_ONCALL_CLUSTER": "c", "SLACK_BOT_TOKEN": "xoxb-t", "SLACK_SIGNING_SECRET": "s",
                              "VLLM_ONCALL_SLACK_CHANNEL": "C0A", "VLLM_ONCALL_APPROVERS": "U0A"})
    api = Parts(settings, None, lambda evidence: None, metrics).api(kube_api.api_client())  # as serve builds it
    api.retry.sleep = waits.append
    got: list[dict] = []
    with caplog.at_level("WARNING", logger="bot.retry"):
        worker = threading.Thread(target=lambda: got.append(api.get_pod(NS, pod["metadata"]["name"])), daemon=True)
        worker.start()
        worker.join(timeout=20)
    assert not worker.is_alive() and got, "the hour was slept, or the call failed"
    assert waits == [60.0]
    assert any("(Retry-After 3600s capped)" in r.getMessage() for r in caplog.records)
    assert metric(metrics, 'vllm_oncall_retries_total{api="kubernetes",call="get pods",reason="http_429"}') == 1.0
