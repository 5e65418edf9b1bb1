"""How fast does an alert become a Slack message, and how many alerts can one bot process take?

Everything is local and real except the two far ends: the bot runs as in production (HTTP
server, /alerts, bounded worker pool, the live Kubernetes client, incidents as vllmincidents
objects, the Slack WebClient with its retry layer), against the Kubernetes API stand-in and the
Slack Web API stand-in from tests/, all in this one process.

1. Latency: N crash-looping Deployments, one alert each, sent one after another; the time from
   sending the webhook to the stand-in receiving chat.postMessage. Each alert does the whole
   job: pod, previous log, events, node and owner from the API, diagnosis, server-side dry run,
   incident create, post, and storing the message's ts.
2. Throughput: W Deployments with P crashing pods each; A alerts (every pod, repeated, as
   Alertmanager re-sends and HA pairs duplicate) sent by 8 concurrent senders. Alerts per second
   from the first send until the last one is processed, and a check that every incident got
   exactly one message.

Run: python benchmarks/bench_alerts.py [--incidents 50] [--workloads 20] [--pods 3] [--alerts 600] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the stand-ins live in tests/


from kubeapi import server as kubeapi_server  # noqa: E402
from kubeapi.objects import container, crashing_deployment, start_pod  # noqa: E402
from kubeapi.server import FakeKube  # noqa: E402
from slackapi import SlackStandIn  # noqa: E402

from bot.app.service import OncallService, Policy  # noqa: E402
from bot.app.work import WorkQueue  # noqa: E402
from bot.http.server import BotServer  # noqa: E402
from bot.kube.api import KubeApi  # noqa: E402
from bot.kube.incidents import KubeIncidentStore  # noqa: E402
from bot.kube.live import LiveCluster  # noqa: E402
from bot.kube.retry import RetryPolicy  # noqa: E402
from bot.slack.chat import SlackChat, make_client  # noqa: E402

LOG = (ROOT / "examples" / "incident" / "bundle" / "previous.log").read_text()

# The Kubernetes stand-in writes a response's headers and body separately; with Nagle's algorithm
# on, each response then stalls ~40 ms for the client's delayed ACK, which a real kube-apiserver
# (Go, TCP_NODELAY) never does. Switch it off so the figures measure the bot, not that artefact.
kubeapi_server._Handler.disable_nagle_algorithm = True


class World:
    def __init__(self, workloads: int, pods: int, workers: int):
        self.kube = FakeKube().start()
        self.slack = SlackStandIn().start()
        self.pods: dict[str, list[str]] = {}
        for w in range(workloads):
            name = f"vllm-bench-{w:03d}"
            dep, first = crashing_deployment(self.kube, name=name, previous_log=LOG, events=False, containers=[
                container(command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
                          args=["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])])
            names = [first["metadata"]["name"]]
            for p in range(1, pods):
                names.append(start_pod(self.kube, dep, "crashloop", previous_log=LOG, suffix=f"p{p:04d}",
                                       restarts=3)["metadata"]["name"])
            self.pods[name] = names
        api_client = self.kube.api_client()
        retry = RetryPolicy(attempts=3, initial=0.01, maximum=0.05)
        api = KubeApi(api_client, retry=retry)
        cluster = LiveCluster(api, name="bench")
        store = KubeIncidentStore(api, "vllm-oncall")
        chat = SlackChat(make_client("xoxb-bench", self.slack.url), "C0BENCH")
        self.service = OncallService(cluster, store, chat, Policy(approver_users=frozenset({"U0A"})),
                                     metrics=chat.metrics)
        self.bot = BotServer(self.service, work=WorkQueue(workers=workers, queue_size=10_000)).start()

    def stop(self) -> None:
        self.bot.stop()
        self.slack.stop()
        self.kube.stop()

    def send(self, pod: str) -> None:
        body = json.dumps({"version": "4", "status": "firing", "receiver": "vllm-oncall", "alerts": [
            {"status": "firing", "labels": {"alertname": "KubePodCrashLooping", "namespace": "inference",
                                            "pod": pod, "container": "vllm"}, "annotations": {}}]}).encode()
        req = urllib.request.Request(self.bot.url + "/alerts", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200, resp.status

    def posts_for(self, workload: str) -> list:
        return [c for c in self.slack.posts() if f"inference/{workload}" in c.params.get("text", "")]


def latency_run(n: int, workers: int) -> list[float]:
    world = World(workloads=n, pods=1, workers=workers)
    try:
        seconds = []
        for workload, pods in world.pods.items():
            start = time.monotonic()
            world.send(pods[0])
            if not world.slack.wait_for(lambda w=workload: world.posts_for(w), timeout=60):
                raise SystemExit(f"no message for {workload} within 60 s")
            seconds.append(world.posts_for(workload)[0].at - start)
        return seconds
    finally:
        world.stop()


def throughput_run(workloads: int, pods: int, alerts: int, workers: int) -> tuple[float, int, int]:
    world = World(workloads=workloads, pods=pods, workers=workers)
    try:
        all_pods = [p for ps in world.pods.values() for p in ps]
        sequence = [all_pods[i % len(all_pods)] for i in range(alerts)]
        start = time.monotonic()
        with ThreadPoolExecutor(max_workers=8) as senders:
            list(senders.map(world.send, sequence))  # every webhook answered 200: every alert admitted
        # An alert for a pod whose earlier alert is still queued is folded into it (counted as a
        # duplicate, never handled on its own), so "handled == sent" never comes: wait for the
        # queue to drain instead, then check what the cluster and Slack show.
        if not world.bot.executor.wait_idle(600):
            raise SystemExit("the bot did not work through the alerts within 600 s")
        elapsed = time.monotonic() - start
        per_incident = [len(world.posts_for(w)) for w in world.pods]
        return alerts / elapsed, min(per_incident), max(per_incident)
    finally:
        world.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--incidents", type=int, default=50, help="alerts timed one by one (latency)")
    parser.add_argument("--workloads", type=int, default=20, help="Deployments in the throughput run")
    parser.add_argument("--pods", type=int, default=3, help="crashing pods per Deployment")
    parser.add_argument("--alerts", type=int, default=600, help="alerts sent in the throughput run")
    parser.add_argument("--workers", type=int, default=4, help="the bot's worker threads (its default)")
    parser.add_argument("--runs", type=int, default=3, help="fresh runs; the table shows their median")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)

    medians, p99s, rates, one_message = [], [], [], True
    for run in range(args.runs):
        seconds = sorted(latency_run(args.incidents, args.workers))
        medians.append(statistics.median(seconds))
        p99s.append(seconds[min(len(seconds) - 1, int(round(0.99 * (len(seconds) - 1))))])
        rate, least, most = throughput_run(args.workloads, args.pods, args.alerts, args.workers)
        rates.append(rate)
        one_message = one_message and least == most == 1
        print(f"run {run + 1}: alert->post median {medians[-1] * 1000:.0f} ms, p99 {p99s[-1] * 1000:.0f} ms; "
              f"{rate:.0f} alerts/s; messages per incident {least}..{most}", file=sys.stderr)

    print(f"\nvllm-oncall alert benchmark ({args.runs} fresh runs, median shown; "
          f"Kubernetes and Slack stand-ins in-process, {args.workers} workers)")
    print(f"{'measure':<48} {'value':>12}")
    print(f"{'-' * 48} {'-' * 12}")
    print(f"{'alert received -> message posted, median':<48} {statistics.median(medians) * 1000:>9.0f} ms")
    print(f"{'alert received -> message posted, p99':<48} {statistics.median(p99s) * 1000:>9.0f} ms")
    print(f"{'alerts/s sustained (' + str(args.alerts) + ' alerts, ' + str(args.workloads) + ' incidents)':<48} "
          f"{statistics.median(rates):>12.0f}")
    print(f"{'exactly one message per incident':<48} {'yes' if one_message else 'NO':>12}")
    return 0 if one_message else 1


if __name__ == "__main__":
    sys.exit(main())
