"""The Kubernetes client keeps a connection for every thread that calls at once.

`serve` calls the API from 16 alert workers by default (up to 64), while the client's own pool
keeps cpu_count * 5 connections (10 on 2 cores). Past the pool, every call opened a connection of
its own (a TCP handshake, in production a TLS one) and threw it away after one request, logging
"Connection pool is full, discarding connection". Against the API stand-in, whose answers wait
until 16 requests are in flight at once, so the calls truly overlap."""

from __future__ import annotations

import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from kubeapi.objects import crashing_deployment
from kubeapi.server import FakeKube
from kubernetes import client

from bot.kube.api import KubeApi, api_client_without_its_own_retries

NS = "inference"
CALLERS = 16  # serve's default VLLM_ONCALL_WORKERS
FAILURE_BOUND_SECONDS = 60  # only bounds a failure: the barrier opens as soon as all have arrived


class Together(FakeKube):
    """Answers a GET of a pod only once CALLERS of them are being served at the same time."""

    def __init__(self) -> None:
        super().__init__()
        self.together = threading.Barrier(CALLERS)

    def handle(self, method: str, path: str, query: dict[str, str], body: bytes,
               content_type: str) -> tuple[int, Any, dict[str, str]]:
        if method == "GET" and "/pods/" in path:
            self.together.wait(FAILURE_BOUND_SECONDS)
        return super().handle(method, path, query, body, content_type)


@pytest.fixture
def kube():
    fake = Together().start()
    crashing_deployment(fake)
    yield fake
    fake.stop()


def connections_opened(records: list[logging.LogRecord]) -> int:
    return sum(1 for r in records if r.name == "urllib3.connectionpool" and "Starting new" in r.getMessage())


def test_overlapping_calls_reuse_their_connections(kube: Together, caplog: pytest.LogCaptureFixture) -> None:
    cfg = client.Configuration()
    cfg.host = kube.url
    api = KubeApi(api_client_without_its_own_retries(cfg))
    pod = next(p["metadata"]["name"] for p in kube.list("Pod", NS))

    def burst() -> None:
        with ThreadPoolExecutor(CALLERS) as pool:
            names = list(pool.map(lambda _: api.get_pod(NS, pod)["metadata"]["name"], range(CALLERS)))
        assert names == [pod] * CALLERS

    caplog.set_level(logging.DEBUG, logger="urllib3.connectionpool")
    burst()
    assert connections_opened(caplog.records) == CALLERS
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()]
    caplog.clear()
    burst()  # the same overlap again: every connection was kept
    assert connections_opened(caplog.records) == 0
