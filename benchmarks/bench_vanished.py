"""An alert for a pod that no longer exists, in a namespace of 10,000 pods: what the bot spends
finding where it went (issue 20: under 50 ms).

The bot looks the pod up, reads the workload its name points at, and lists only that workload's
pods by its label selector (never the namespace). Measured in this process against the project's
Kubernetes API stand-in (tests/kubeapi), the real `kubernetes` client: the wall time of
`LiveCluster.collect` for the vanished pod, and the CPU of the calling thread
(`time.thread_time`, the bot's side only: the stand-in serves from its own threads). Beside it,
the floor: the same three GETs made with a plain kept-alive HTTP client.

Run: python benchmarks/bench_vanished.py [--pods 10000] [--workloads 250] [--runs 21]
"""

from __future__ import annotations

import argparse
import http.client
import os
import statistics
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the stand-ins live in tests/

from kubeapi.objects import crashing_deployment, crowd  # noqa: E402
from kubeapi.server import FakeKube  # noqa: E402

from bot.kube.api import KubeApi  # noqa: E402
from bot.kube.errors import PodGone  # noqa: E402
from bot.kube.live import LiveCluster  # noqa: E402
from bot.kube.retry import RetryPolicy  # noqa: E402

NS = "inference"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=10000)
    parser.add_argument("--workloads", type=int, default=250)
    parser.add_argument("--runs", type=int, default=21)
    args = parser.parse_args()
    kube = FakeKube().start()
    try:
        crowd(kube, args.pods, args.workloads)
        _, pod = crashing_deployment(kube)
        gone = pod["metadata"]["name"][:-5] + "zzzzz"
        cluster = LiveCluster(KubeApi(kube.api_client(), retry=RetryPolicy(attempts=1)))
        walls, cpus = [], []
        for _ in range(args.runs):
            kube.calls.clear()
            w0, c0 = time.perf_counter(), time.thread_time()
            try:
                cluster.collect(NS, gone)
            except PodGone:
                pass
            cpus.append((time.thread_time() - c0) * 1000)
            walls.append((time.perf_counter() - w0) * 1000)
        calls = [(c.verb, c.resource, dict(c.query)) for c in kube.calls]
        # the floor: the same GETs on one kept-alive connection
        base = urlsplit(kube.url)
        conn = http.client.HTTPConnection(base.hostname, base.port)
        paths = [f"/api/v1/namespaces/{NS}/pods/{gone}", f"/apis/apps/v1/namespaces/{NS}/deployments/llama",
                 f"/api/v1/namespaces/{NS}/pods?labelSelector=app%3Dllama&limit=500"]
        floor = []
        for _ in range(args.runs):
            t0 = time.perf_counter()
            for path in paths:
                conn.request("GET", path)
                conn.getresponse().read()
            floor.append((time.perf_counter() - t0) * 1000)
        print(f"vanished pod among {args.pods:,} pods ({args.workloads} workloads), {args.runs} runs, "
              f"load average {os.getloadavg()[0]:.1f}")
        print(f"  bot:   wall p50 {statistics.median(walls):.1f} ms, CPU (calling thread) p50 "
              f"{statistics.median(cpus):.1f} ms; calls: {calls}")
        print(f"  floor: the same 3 GETs on one kept-alive connection: p50 {statistics.median(floor):.1f} ms")
    finally:
        kube.stop()


if __name__ == "__main__":
    main()
