"""A small exporter serving vLLM's own request histograms, for a real Prometheus to scrape.

Names and buckets as vLLM's /metrics prints them (`vllm:request_prompt_tokens` and
`vllm:request_generation_tokens`, cumulative `_bucket{le=...}` counters, `_count`, `_sum`,
labelled `model_name`). In a cluster Prometheus's Kubernetes discovery adds `namespace` and
`pod`; here the exporter prints them and the scrape keeps them (`honor_labels: true`).

The counters start at zero and jump to the served buckets when `serve()` is called, so the
window's `increase` is the served counts (a counter's first sample is where it starts).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from standin_http import MetricsExporter

METRICS = ("vllm:request_prompt_tokens", "vllm:request_generation_tokens")


@dataclass
class PodTraffic:
    namespace: str
    pod: str
    model: str = "meta-llama/Llama-3.1-8B-Instruct"
    # metric -> [(le, cumulative count)], the last le "+Inf"
    buckets: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    # gauge -> value (vllm:num_requests_running, vllm:num_requests_waiting), served as is
    gauges: dict[str, float] = field(default_factory=dict)


class VllmMetricsExporter(MetricsExporter):
    name = "vllm-metrics"

    def __init__(self, pods: list[PodTraffic]):
        self.pods = pods
        self.serving = False  # False: every counter at zero

    def serve(self) -> None:
        self.serving = True

    def text(self) -> str:
        lines: list[str] = []
        for metric in METRICS:
            lines += [f"# HELP {metric} Number of tokens per finished request.", f"# TYPE {metric} histogram"]
            for p in self.pods:
                labels = f'model_name="{p.model}",namespace="{p.namespace}",pod="{p.pod}"'
                buckets = p.buckets.get(metric, [])
                for le, count in buckets:
                    lines.append(f'{metric}_bucket{{{labels},le="{le}"}} {count if self.serving else 0}')
                total = buckets[-1][1] if buckets and self.serving else 0
                lines += [f"{metric}_count{{{labels}}} {total}", f"{metric}_sum{{{labels}}} {total * 100}"]
        for gauge in sorted({g for p in self.pods for g in p.gauges}):
            lines += [f"# HELP {gauge} Requests.", f"# TYPE {gauge} gauge"]
            lines += [f'{gauge}{{model_name="{p.model}",namespace="{p.namespace}",pod="{p.pod}"}} {p.gauges[gauge]:g}'
                      for p in self.pods if gauge in p.gauges]
        return "\n".join(lines) + "\n"
