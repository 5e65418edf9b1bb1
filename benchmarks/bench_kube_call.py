"""CPU of one Kubernetes API call in the calling thread: KubeApi.get_pod against the local API
stand-in (tests/kubeapi), a bearer token through the configuration's refresh hook as loaded from a
kubeconfig or in-cluster. The stand-in answers in its own threads, so thread_time counts only the
bot's side: building the request, the client's HTTP layer, reading and parsing the answer.

Run: python benchmarks/bench_kube_call.py [--calls 2000] [--runs 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from kubeapi.objects import crashing_deployment  # noqa: E402
from kubeapi.server import FakeKube  # noqa: E402

from bot.kube.api import KubeApi  # noqa: E402
from bot.kube.retry import RetryPolicy  # noqa: E402


def one_run(calls: int) -> float:
    """Median microseconds of CPU per get_pod, over `calls` calls after a warm-up."""
    kube = FakeKube().start()
    try:
        _, pod = crashing_deployment(kube)
        api_client = kube.api_client()
        api_client.configuration.api_key = {"authorization": "token"}
        api_client.configuration.api_key_prefix = {"authorization": "Bearer"}
        api_client.configuration.refresh_api_key_hook = lambda configuration: None
        api = KubeApi(api_client, retry=RetryPolicy(attempts=1))
        namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        for _ in range(50):
            api.get_pod(namespace, name)
        costs = []
        for _ in range(calls):
            start = time.thread_time()
            api.get_pod(namespace, name)
            costs.append(time.thread_time() - start)
        return statistics.median(costs) * 1e6
    finally:
        kube.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    runs = []
    for run in range(args.runs):
        runs.append(one_run(args.calls))
        print(f"run {run + 1}: {runs[-1]:.0f} us per get_pod", file=sys.stderr)
    print(f"CPU per get_pod, calling thread ({args.runs} runs of {args.calls}, median; load average "
          f"{os.getloadavg()[0]:.1f}): {statistics.median(runs):.0f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
