"""The impact of a new --max-model-len on the workload's own traffic, from a real Prometheus
(Debian's `prometheus`, started here) scraping an exporter that serves vLLM's request
histograms; the bot's adapter (bot/kube/prometheus.py PrometheusTraffic) asks its HTTP API and
the core (bot/remedy/impact.py) does the arithmetic. The expected shares are worked out here
from the buckets served, by hand."""

from __future__ import annotations

import json
import time

import pytest
from kubeapi.prometheus import RealPrometheus
from kubeapi.vllm_metrics import PodTraffic, VllmMetricsExporter
from test_verify_steps import NS, World

from bot.kube.prometheus import Prometheus, PrometheusTraffic
from bot.remedy.impact import GENERATION, PROMPT, RUNNING, WAITING, max_model_len_impact, max_num_seqs_impact
from bot.slack.blocks import blocks_to_text

PROMPT_BUCKETS = [("1000", 300), ("2000", 400), ("5000", 450), ("10000", 480), ("20000", 495), ("50000", 500),
                  ("+Inf", 500)]
GENERATION_BUCKETS = [("100", 250), ("500", 450), ("2000", 500), ("+Inf", 500)]
# The workload's two pods serve the same buckets: 1,000 requests. Of them, the prompt buckets
# whose upper bound is above 18,432 (le 20000, 50000, +Inf) hold 2 x (500 - 480) = 40; every
# generation is at most 2,000 tokens, so the split "prompt above 16,432 or generation above
# 2,000" bounds prompt + generation > 18,432 by 40 + 0: 4.0%, an upper estimate.
EXPECTED_REQUESTS, EXPECTED_OVER = 1000, 40


def _pod(name: str, namespace: str = NS, running: float = 4, waiting: float = 0) -> PodTraffic:
    return PodTraffic(namespace=namespace, pod=name, buckets={PROMPT: PROMPT_BUCKETS, GENERATION: GENERATION_BUCKETS},
                      gauges={RUNNING: running, WAITING: waiting})


@pytest.fixture
def traffic(tmp_path):
    pods = [_pod("vllm-llama3-8b-5d9f7c6b8-abcde", running=12, waiting=3), _pod("vllm-llama3-8b-5d9f7c6b8-fghij"),
            _pod("vllm-llama3-8b-other-7f6d5c4b3-zzzzz", namespace="elsewhere", running=99),  # another namespace
            _pod("vllm-llama3-70b-6c5b4a3f2-yyyyy", running=99)]  # another workload whose name starts alike
    exporter = VllmMetricsExporter(pods).start()
    prom = RealPrometheus(exporter.address, tmp_path, job="vllm", honor_labels=True)
    try:
        _wait(prom.url, 'count(vllm:request_prompt_tokens_count == 0) >= 4')  # the zero start is scraped
        exporter.serve()
        _wait(prom.url, 'count(vllm:request_prompt_tokens_count > 0) >= 4')
        _wait(prom.url, 'count(count_over_time(vllm:request_prompt_tokens_count[1h]) >= 3) >= 4')  # and again
        yield prom
    finally:
        prom.stop()
        exporter.stop()


def _wait(url: str, query: str, timeout: float = 90) -> None:
    prom, deadline = Prometheus(url), time.monotonic() + timeout  # the deadline bounds a failure only
    while time.monotonic() < deadline:
        if prom.query(query):
            return
        time.sleep(0.2)
    raise AssertionError(f"no result for {query} within {timeout} s")


def test_the_share_of_requests_above_a_new_limit_from_a_real_prometheus(traffic):
    found = PrometheusTraffic(Prometheus(traffic.url)).histograms(NS, "vllm-llama3-8b", [PROMPT, GENERATION], 24)
    prompt, generation = found[PROMPT], found[GENERATION]
    assert prompt is not None and generation is not None
    # increase() extrapolates to the window's end alike for every bucket of one scrape: the ratio is exact
    impact = max_model_len_impact(prompt, generation, 18432)
    assert impact.share == pytest.approx(EXPECTED_OVER / EXPECTED_REQUESTS, rel=1e-9)
    assert impact.requests == pytest.approx(EXPECTED_REQUESTS, rel=0.5)
    assert "about 4.0% of the last 24 hours' requests" in impact.headline()
    # a limit above every bucket bound below +Inf but one: only le 50000 and +Inf count
    assert max_model_len_impact(prompt, generation, 49000).share == pytest.approx(10 / 1000, rel=1e-9)


def test_a_workload_without_vllm_series_cannot_be_known(traffic):
    found = PrometheusTraffic(Prometheus(traffic.url)).histograms(NS, "no-such-workload", [PROMPT, GENERATION], 24)
    impact = max_model_len_impact(found[PROMPT], found[GENERATION], 18432)
    assert impact.share is None and "cannot be known" in impact.sentence() and PROMPT in impact.sentence()


def _texts(calls) -> list[str]:
    out = []
    for c in calls:
        blocks = c.params.get("blocks")
        blocks = json.loads(blocks) if isinstance(blocks, str) else blocks
        out.append(blocks_to_text(blocks or []))
    return out


def test_the_message_states_the_share_of_requests_above_the_new_limit(traffic):
    w = World(traffic=PrometheusTraffic(Prometheus(traffic.url)))
    try:
        incident = w.open_and_approve()
        top = _texts(w.slack.posts())[0]
        assert "*Impact:* about 4.0% of the last 24 hours' requests" in top, top
        assert "longer than 18,432 tokens (an upper estimate)" in top
        details = "\n".join(_texts(w.slack.details()))
        assert "bucket's upper bound is above the limit" in details, details
        stored = w.service.store.get(incident).proposal.impact
        assert stored is not None and stored.share == pytest.approx(0.04, rel=1e-9)
    finally:
        w.stop()


def test_without_prometheus_the_thread_says_the_impact_cannot_be_known():
    w = World()
    try:
        w.open_and_approve()
        assert "Impact" not in _texts(w.slack.posts())[0]
        details = "\n".join(_texts(w.slack.details()))
        assert "longer than 18,432 tokens cannot be known: no Prometheus is configured" in details, details
    finally:
        w.stop()


def test_the_share_of_minutes_a_new_max_num_seqs_would_have_queued(traffic):
    # Gauges held constant: the workload's busiest pod runs 12 requests, the other 4; 3 wait on the first.
    # Pods of another namespace and of a workload whose name starts alike (99 running) are not counted.
    history = PrometheusTraffic(Prometheus(traffic.url), resolution_seconds=1)
    assert history.share_above(NS, "vllm-llama3-8b", RUNNING, 8, 24) == pytest.approx(1.0)
    assert history.share_above(NS, "vllm-llama3-8b", RUNNING, 12, 24) == pytest.approx(0.0)  # 12 is not above 12
    assert history.share_above(NS, "no-such-workload", RUNNING, 8, 24) is None
    impact = max_num_seqs_impact(history.share_above(NS, "vllm-llama3-8b", RUNNING, 8, 24),
                                 history.share_above(NS, "vllm-llama3-8b", WAITING, 0, 24), 8)
    assert impact.headline() == ("in about 100% of the last 24 hours' minutes a pod ran more than 8 requests at once "
                                 "(those would have queued)")
    assert "requests already waited in about 100% of them" in impact.sentence()
