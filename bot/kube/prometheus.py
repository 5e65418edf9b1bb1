"""GPU memory over time from Prometheus (dcgm-exporter's metrics), for verification's last step.

Plain HTTP to Prometheus's own API (`GET /api/v1/query_range`), the answer read through pydantic
models. The metrics are dcgm-exporter's: `DCGM_FI_DEV_FB_USED` and `DCGM_FI_DEV_FB_FREE`, in MiB,
one series per GPU with the labels `Hostname` (the node), `gpu` (index), `UUID`, `modelName`, and
`pod` / `namespace` / `container` when the exporter maps GPUs to pods (its kubernetes mode).

The trend is read per GPU: start, peak, end (GiB), the card (used + free) and the slope over the
window; whether that is stable, climbing or near the limit is bot.app.verdict.gpu_trend's call.
"""

from __future__ import annotations

import json
import logging
import math
import re
import ssl
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

from bot.app import verdict
from bot.app.records import GpuMemory
from bot.remedy.impact import Bucket, Histogram

log = logging.getLogger("bot.kube.prometheus")

USED, FREE = "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE"
MIB_PER_GIB = 1024.0


class Series(BaseModel):
    metric: dict[str, str] = Field(default_factory=dict)
    values: list[tuple[float, str]] = Field(default_factory=list)


class MatrixData(BaseModel):
    resultType: Literal["matrix"]
    result: list[Series] = Field(default_factory=list)


class QueryRangeAnswer(BaseModel):
    status: Literal["success", "error"]
    data: MatrixData | None = None
    errorType: str | None = None
    error: str | None = None


class Sample(BaseModel):
    metric: dict[str, str] = Field(default_factory=dict)
    value: tuple[float, str]


class VectorData(BaseModel):
    resultType: Literal["vector"]
    result: list[Sample] = Field(default_factory=list)


class QueryAnswer(BaseModel):
    status: Literal["success", "error"]
    data: VectorData | None = None
    errorType: str | None = None
    error: str | None = None


class PrometheusError(RuntimeError):
    """Prometheus could not be asked, or refused the query; the message says which."""


class Prometheus:
    def __init__(self, url: str, timeout: float = 10.0):
        self.url, self.timeout = url.rstrip("/"), timeout
        # One TLS context per client: urlopen without one loads the system CA bundle again for
        # every query (22-35 ms of CPU each here; the same finding as bot/slack's make_client).
        self.tls = ssl.create_default_context() if self.url.startswith("https://") else None

    def _get(self, path: str, params: dict[str, str]) -> bytes:
        try:
            with urllib.request.urlopen(f"{self.url}{path}?{urllib.parse.urlencode(params)}",
                                        timeout=self.timeout, context=self.tls) as r:
                return bytes(r.read())
        except urllib.error.HTTPError as exc:
            return bytes(exc.read())  # a 400/422 carries Prometheus's own error
        except (OSError, ValueError) as exc:
            raise PrometheusError(f"Prometheus at {self.url} could not be asked: {exc}") from None

    def query(self, query: str) -> list[Sample]:
        """An instant query, evaluated now."""
        raw = self._get("/api/v1/query", {"query": query})
        try:
            answer = QueryAnswer.model_validate(json.loads(raw))
        except ValueError as exc:
            raise PrometheusError(f"Prometheus at {self.url} sent an answer that is not an instant query's: "
                                  f"{str(exc).splitlines()[0]}") from None
        if answer.status != "success" or answer.data is None:
            raise PrometheusError(f"Prometheus refused the query: {answer.errorType}: {answer.error}")
        return answer.data.result

    def query_range(self, query: str, start: datetime, end: datetime, step_seconds: float) -> list[Series]:
        raw = self._get("/api/v1/query_range", {"query": query, "start": f"{start.timestamp():.3f}",
                                                "end": f"{end.timestamp():.3f}", "step": f"{max(step_seconds, 0.001):g}s"})
        try:
            answer = QueryRangeAnswer.model_validate(json.loads(raw))
        except ValueError as exc:
            raise PrometheusError(f"Prometheus at {self.url} sent an answer that is not a range query's: "
                                  f"{str(exc).splitlines()[0]}") from None
        if answer.status != "success" or answer.data is None:
            raise PrometheusError(f"Prometheus refused the query: {answer.errorType}: {answer.error}")
        return answer.data.result


GpuTrend = GpuMemory  # one GPU's figures and trend (the trend is bot.app.verdict's reading)


def _selector(node: str | None, namespace: str | None, pod: str | None) -> str:
    parts = [f'Hostname="{node}"'] if node else []
    if pod:
        parts += [f'namespace="{namespace}"', f'pod="{pod}"']
    return "{" + ",".join(parts) + "}"


def _key(series: Series) -> str:
    m = series.metric
    return f"{m.get('gpu', '?')} ({m.get('UUID', 'no UUID')})"


def _trend(used: Series, free: Series | None) -> GpuTrend:
    points = [(t, float(v)) for t, v in used.values]
    values = [v for _, v in points]
    capacity = None
    if free is not None and free.values:
        capacity = (float(free.values[-1][1]) + values[-1]) / MIB_PER_GIB
    hours = (points[-1][0] - points[0][0]) / 3600 if len(points) > 1 else 0.0
    slope = ((values[-1] - values[0]) / MIB_PER_GIB / hours) if hours > 0 else 0.0
    peak, end = max(values) / MIB_PER_GIB, values[-1] / MIB_PER_GIB
    return GpuMemory(gpu=_key(used), start_gib=values[0] / MIB_PER_GIB, peak_gib=peak, end_gib=end,
                     capacity_gib=capacity, slope_gib_per_hour=slope, trend=verdict.gpu_trend(capacity, peak, end, slope))


def gpu_memory_trend(prom: Prometheus, node: str | None, namespace: str, pod: str, start: datetime,
                     end: datetime) -> list[GpuTrend]:
    """One trend per GPU of the pod (by the exporter's pod mapping, else every GPU of its node)."""
    step = max(1.0, (end - start).total_seconds() / 200)
    for sel in (_selector(node, namespace, pod), _selector(node, None, None)):
        if sel == "{}":
            continue
        used = prom.query_range(f"{USED}{sel}", start, end, step)
        if used:
            free = {_key(s): s for s in prom.query_range(f"{FREE}{sel}", start, end, step)}
            return [_trend(s, free.get(_key(s))) for s in sorted(used, key=_key) if s.values]
    return []


# ---- the workload's own traffic: vLLM's request histograms (the impact of a new limit) --------


def workload_selector(namespace: str, workload: str) -> str:
    """The workload's pods as Prometheus's Kubernetes discovery labels them (`namespace`, `pod`):
    a Deployment's pods are <name>-<hash>-<id>, a StatefulSet's <name>-<n>."""
    pods = re.escape(workload).replace("\\", "\\\\")
    return f'{{namespace="{namespace}",pod=~"{pods}-.+"}}'


class PrometheusTraffic:
    """The cluster side of bot.app.ports.TrafficHistory: vLLM's histograms summed over the
    workload's pods, `increase` over the window (counter resets of crashed pods included)."""

    def __init__(self, prometheus: Prometheus, resolution_seconds: float = 60):
        self.prometheus, self.resolution = prometheus, resolution_seconds

    def share_above(self, namespace: str, workload: str, gauge: str, threshold: float, hours: float) -> float | None:
        sel = workload_selector(namespace, workload)
        samples = self.prometheus.query(f"avg_over_time((max({gauge}{sel}) > bool {threshold:g})"
                                        f"[{hours:g}h:{self.resolution:g}s])")
        return float(samples[0].value[1]) if samples else None

    def histograms(self, namespace: str, workload: str, metrics: list[str], hours: float) -> dict[str, Histogram | None]:
        sel = workload_selector(namespace, workload)
        found: dict[str, Histogram | None] = {}
        for metric in metrics:
            samples = self.prometheus.query(f"sum by (le) (increase({metric}_bucket{sel}[{hours:g}h]))")
            buckets = [Bucket(le=_le(s.metric.get("le", "+Inf")), count=float(s.value[1])) for s in samples]
            found[metric] = Histogram(metric=metric, buckets=buckets) if buckets else None
        return found


def _le(text: str) -> float:
    return math.inf if text in ("+Inf", "Inf") else float(text)
