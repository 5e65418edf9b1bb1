"""How long from a vLLM container's first crash to the Slack message: the pod watch against the alert path.

Everything is local and real except the two far ends, as in bench_alerts.py: the bot runs as in
`vllm-oncall serve --watch` (BotServer, the pod watch through the real kubernetes client's
watch.Watch, the live cluster adapter, incidents as vllmincidents objects, the Slack WebClient)
against the Kubernetes API stand-in and the Slack Web API stand-in from tests/, in this process.

N Deployments each run one vLLM pod that has never crashed. One after another, each pod's
container terminates as the kubelet reports it (the log kept as --previous, lastState.terminated
with exit 1, a restart); the time is taken from that status write to the stand-in receiving
chat.postMessage for it: watch event, evidence (pod, previous log, node, owner), diagnosis, dry
run, incident create, post.

The alert path is not simulated in wall-clock time (it is minutes): its delay is computed from
kube-prometheus-stack's KubePodCrashLooping rule and Alertmanager's defaults, named below.

Run: python benchmarks/bench_detect.py [--crashes 30]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # the stand-ins live in tests/

from kubeapi import server as kubeapi_server  # noqa: E402
from kubeapi.objects import container, deployment, node, start_pod  # noqa: E402
from kubeapi.server import FakeKube  # noqa: E402
from slackapi import SlackStandIn  # noqa: E402

from bot.app.service import OncallService, Policy  # noqa: E402
from bot.app.work import WorkQueue  # noqa: E402
from bot.http.server import BotServer  # noqa: E402
from bot.kube.api import KubeApi  # noqa: E402
from bot.kube.incidents import KubeIncidentStore  # noqa: E402
from bot.kube.live import LiveCluster  # noqa: E402
from bot.kube.retry import RetryPolicy  # noqa: E402
from bot.kube.watch import PodWatch, WatchSettings  # noqa: E402
from bot.slack.chat import SlackChat, make_client  # noqa: E402

LOG = (ROOT / "examples" / "incident" / "bundle" / "previous.log").read_text()
NS = "inference"
kubeapi_server._Handler.disable_nagle_algorithm = True  # as bench_alerts.py: measure the bot, not Nagle

# The alert path (kube-prometheus-stack's KubePodCrashLooping, Alertmanager's route defaults):
RULE_FOR_S = 15 * 60  # for: 15m
SCRAPE_AND_EVAL_S = (0, 60)  # kube-state-metrics scrape 30 s + rule evaluation 30 s: up to a minute
GROUP_WAIT_S = 30  # a new group
GROUP_INTERVAL_S = 5 * 60  # a group that already exists (another pod of the namespace alerting)


def alert_path_seconds() -> tuple[float, float]:
    """(earliest, latest) from the first crash to the webhook, before any model-load cycle."""
    return (RULE_FOR_S + SCRAPE_AND_EVAL_S[0] + GROUP_WAIT_S,
            RULE_FOR_S + SCRAPE_AND_EVAL_S[1] + GROUP_INTERVAL_S)


def crash(kube: FakeKube, pod: str) -> None:
    kube.set_log(NS, pod, "vllm", LOG, previous=True)

    def mutate(obj: dict) -> None:
        cs = obj["status"]["containerStatuses"][0]
        cs["restartCount"] = 1
        cs["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting failed"}}
        cs["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": "2026-11-30T05:00:00Z",
                                          "finishedAt": "2026-11-30T05:01:30Z"}}

    kube.edit("Pod", pod, NS, mutate)


def run(crashes: int) -> list[float]:
    kube, slack = FakeKube().start(), SlackStandIn().start()
    kube.put(node())
    pods = []
    for i in range(crashes):
        c = container(command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
                      args=["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])
        dep = kube.put(deployment(f"vllm-detect-{i:03d}", [c], NS))
        pods.append(start_pod(kube, dep, "starting")["metadata"]["name"])
    api = KubeApi(kube.api_client(), retry=RetryPolicy(attempts=3, initial=0.01, maximum=0.05))
    chat = SlackChat(make_client("xoxb-bench", slack.url), "C0BENCH")
    service = OncallService(LiveCluster(api, name="bench"), KubeIncidentStore(api, "vllm-oncall"), chat,
                            Policy(approver_users=frozenset({"U0A"})), metrics=chat.metrics)
    bot = BotServer(service, work=WorkQueue(workers=4, queue_size=100)).start()
    # the watch's crashes go into the server's work queue, as in `serve`
    watch = PodWatch(api, bot.executor, bot.router.handle_alert, WatchSettings(namespaces=(NS,))).start()
    took = []
    try:
        if not kube.wait_for_watchers(1, timeout=30):
            raise SystemExit("the pod watch never started")
        for pod in pods:
            before = len(slack.posts())
            started = time.monotonic()
            crash(kube, pod)
            if not slack.wait_for(lambda before=before: len(slack.posts()) > before, 30):
                raise SystemExit(f"no message for the crash of {pod}")
            took.append(slack.posts()[-1].at - started)
        time.sleep(0.5)
        if len(slack.posts()) != crashes:
            raise SystemExit(f"{len(slack.posts())} messages for {crashes} crashes")
    finally:
        watch.stop()
        bot.stop()
        slack.stop()
        kube.stop()
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crashes", type=int, default=30)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    took = sorted(run(args.crashes))
    p99 = took[min(len(took) - 1, int(round(0.99 * (len(took) - 1))))]
    print(f"first crash -> message: median {statistics.median(took):.3f} s, p99 {p99:.3f} s "
          f"({len(took)} crashes, pod watch, stand-ins local)")
    low, high = alert_path_seconds()
    print(f"first crash -> message, watch off (KubePodCrashLooping): {low / 60:.1f}-{high / 60:.1f} min "
          f"(for: {RULE_FOR_S // 60}m + scrape/eval up to {SCRAPE_AND_EVAL_S[1]} s + group_wait {GROUP_WAIT_S} s, "
          f"or group_interval {GROUP_INTERVAL_S // 60}m for a group that exists; then ~40 ms in the bot), "
          f"and never when a model load outlasts the rule's 5-minute window")
    return 0


if __name__ == "__main__":
    sys.exit(main())
