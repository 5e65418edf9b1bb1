"""GPU memory over the soak from a real Prometheus (Debian's `prometheus`, started here on
127.0.0.1 with a temporary config and storage) scraping an exporter with dcgm-exporter's metric
names and labels; the bot's adapter (bot/kube/prometheus.py) asks its HTTP API."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import pytest
from builders import free_port
from kubeapi.dcgm import DcgmExporter, Gpu
from kubeapi.prometheus import RealPrometheus
from test_verify_steps import MODEL, World

from bot.kube.prometheus import Prometheus, PrometheusError, gpu_memory_trend
from bot.kube.verify import ServingChecks

NS = "inference"





@pytest.fixture
def climbing(tmp_path):
    """One A10G on gpu-node-1, mapped to the pod, climbing 200 MiB a second from 18 GiB."""
    exporter = DcgmExporter([Gpu(hostname="gpu-node-1", used_mib=lambda t: 18432 + 200 * t,
                                 pod=(NS, "vllm-llama3-8b-x-newpd", "vllm"))]).start()
    prom = RealPrometheus(exporter.address, tmp_path)
    yield exporter, prom
    prom.stop()
    exporter.stop()


def test_the_trend_of_a_climbing_gpu_from_a_real_prometheus(climbing):
    exporter, prom = climbing
    started = datetime.now(UTC)
    prom.wait_for_samples(3)
    trends = gpu_memory_trend(Prometheus(prom.url), "gpu-node-1", NS, "vllm-llama3-8b-x-newpd", started,
                              datetime.now(UTC))
    assert len(trends) == 1
    t = trends[0]
    assert t.gpu.startswith("0 (GPU-5f1c5e58") and t.capacity_gib == pytest.approx(23028 / 1024, abs=0.01)
    assert 18.0 <= t.start_gib < t.end_gib <= t.peak_gib + 1e-9 and t.slope_gib_per_hour > 100
    assert t.warning and "climbing" in t.warning
    line = t.line()
    assert "GiB/h" in line and "of 22.5 GiB" in line


def test_the_pods_node_is_used_when_the_exporter_does_not_map_pods(climbing):
    exporter, prom = climbing
    exporter.gpus[0].pod = None
    started = datetime.now(UTC)
    deadline, trends = time.monotonic() + 90, []
    while not trends and time.monotonic() < deadline:  # until a scrape of the unmapped series landed
        time.sleep(0.3)
        trends = gpu_memory_trend(Prometheus(prom.url), "gpu-node-1", NS, "other-pod", started, datetime.now(UTC))
    assert [t.gpu[:1] for t in trends] == ["0"]
    assert gpu_memory_trend(Prometheus(prom.url), "gpu-node-9", NS, "other-pod", started, datetime.now(UTC)) == []


def test_a_prometheus_that_does_not_answer_is_one_clear_error():
    with pytest.raises(PrometheusError, match="could not be asked"):
        Prometheus(f"http://127.0.0.1:{free_port()}", timeout=1).query_range("up", datetime.now(UTC),
                                                                             datetime.now(UTC), 1)


def test_verification_reports_the_gpu_memory_over_the_soak(climbing):
    exporter, prom = climbing
    w = World(soak=3.0)
    try:
        exporter.gpus[0].pod = None  # by node: the new pod's name is the controller's to choose
        prom.wait_for_series('DCGM_FI_DEV_FB_USED{Hostname="gpu-node-1",pod=""}')
        w.service.rollout.steps = w.service.rollout.steps.__class__(
            probe=ServingChecks(w.service.cluster.api, poll_seconds=0.1, prometheus=Prometheus(prom.url)),
            request_timeout_seconds=5, soak_seconds=3.0)
        name = w.open_and_approve()
        assert str(w.service.store.get(name).state) == "memory-climbing"  # never verified on a climb
        memory = next(r for r in w.replies() if "GPU memory over the soak" in r)
        assert "GPU 0 (GPU-5f1c5e58" in memory and "slope" in memory and "climbing" in memory, memory
        assert w.vllm.requests and w.vllm.requests[-1][2]["model"] == MODEL
    finally:
        w.stop()


def test_without_prometheus_the_reply_says_why_there_is_no_trend():
    w = World(soak=0.2)
    try:
        name = w.open_and_approve()
        assert str(w.service.store.get(name).state) == "verified"
        assert any("GPU memory over the soak: not measured (no Prometheus URL configured" in r for r in w.replies())
    finally:
        w.stop()
