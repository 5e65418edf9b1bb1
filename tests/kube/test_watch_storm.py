"""A crash storm through the pod watch alone (no alert at all): 3,000 vLLM pods crash at once
across 750 Deployments, against the Kubernetes API stand-in and the Slack stand-in, with the real
client, service, incident store and the one work queue `serve` shares between the webhook and the
watch (bot/app/work.py).

Issue 16: the watch had a queue of its own, bounded by pods and not folded per workload; it
filled, crashes were "left to the alert path", and 492 of 750 workloads got no message. Now every
crash goes into the one queue folded per workload: one pending crash per workload at most, so the
storm waits as at most 750 entries, none is dropped, and each workload is named exactly once at
the top level (its message, or a line of a grouped message: bot/app/grouping.py).
"""

from __future__ import annotations

import itertools

import pytest
from builders import wait_for
from kubeapi.objects import container, deployment, node, start_pod
from kubeapi.server import FakeKube
from slackapi import SlackStandIn

from bot.app.service import OncallService, Policy
from bot.app.work import WorkQueue
from bot.kube.api import KubeApi
from bot.kube.incidents import KubeIncidentStore
from bot.kube.live import LiveCluster
from bot.kube.retry import RetryPolicy
from bot.kube.watch import PodWatch, WatchSettings
from bot.slack.chat import GROUP_EVENT_TYPE, SlackChat, make_client

NS = "inference"
WORKLOADS = 750
PODS_PER_WORKLOAD = 4  # 3,000 pods
# An application's own error: a message with the diagnosis, no fix to propose. The storm is about
# the queue; the proposal path has its own tests, and a KV-cache diagnosis costs about three times
# as much per incident here (the model catalogue is parsed per diagnosis), a minute more for 750.
CRASH_LOG = "Traceback (most recent call last):\nValueError: boom\n"
SUFFIXES = ["".join(s) for s in itertools.islice(itertools.product("bcdfg", repeat=5), PODS_PER_WORKLOAD)]


def crashed(obj: dict) -> None:
    """What the kubelet writes at a container's termination (the log is kept as --previous)."""
    cs = obj["status"]["containerStatuses"][0]
    cs["restartCount"] = 1
    cs["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting failed"}}
    cs["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": "2026-11-30T05:00:00Z",
                                      "finishedAt": "2026-11-30T05:01:30Z"}}


@pytest.fixture
def storm():
    kube = FakeKube().start()
    slack = SlackStandIn().start()
    kube.put(node())
    vllm = container(command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
                     args=["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])
    pods: dict[str, list[str]] = {}
    for i in range(WORKLOADS):
        dep = kube.put(deployment(f"storm-{i:04d}", [vllm], NS))
        pods[dep["metadata"]["name"]] = [start_pod(kube, dep, "starting", suffix=suffix)["metadata"]["name"]
                                         for suffix in SUFFIXES]
    api = KubeApi(kube.api_client(), retry=RetryPolicy(attempts=3, sleep=lambda s: None))
    chat = SlackChat(make_client("xoxb-storm", slack.url), "C0ALERTS", backoff_seconds=0.01)
    service = OncallService(LiveCluster(api, name="storm"), KubeIncidentStore(api, "vllm-oncall"), chat,
                            Policy(approver_users=frozenset({"U0A"})), metrics=chat.metrics)
    # serve's defaults: 4 workers, 100 work items (VLLM_ONCALL_WORKERS, VLLM_ONCALL_QUEUE_SIZE)
    work = WorkQueue(workers=4, queue_size=100)
    watch = PodWatch(api, work, service.handle_alert, WatchSettings(namespaces=(NS,), timeout_seconds=60))
    yield kube, slack, service, work, watch.start(), pods
    watch.stop()
    work.shutdown()
    slack.stop()
    kube.stop()


def named_at_top_level(slack) -> list[str]:
    """`namespace/workload` per top-level message, or per line of a grouped message."""
    named = []
    for post in slack.posts():
        if (post.params.get("metadata") or {}).get("event_type") == GROUP_EVENT_TYPE:
            named += [b["text"]["text"].split("`")[1] for b in post.params["blocks"]
                      if b.get("block_id", "").startswith("group-line-")]
        else:
            named.append(post.params["text"].split("] ", 1)[1].split(":", 1)[0])
    return named


def test_a_crash_storm_through_the_watch_alone_names_every_workload_once_and_drops_none(storm):
    kube, slack, service, work, watch, pods = storm
    assert kube.wait_for_watchers(1, timeout=30)
    for names in pods.values():
        for pod in names:
            kube.set_log(NS, pod, "vllm", CRASH_LOG, previous=True)
            kube.edit("Pod", pod, NS, crashed)
    total = WORKLOADS * PODS_PER_WORKLOAD

    # Every crash seen and taken by the queue (none refused), then the queue worked off.
    assert wait_for(lambda: watch.stats.crashes + watch.stats.dropped_crashes == total, timeout=120), watch.stats
    assert watch.stats.dropped_crashes == 0 and watch.stats.crashes == total
    assert work.wait_idle(timeout=300), f"{work.pending_alerts} still waiting"

    # Every workload named once at the top level, by its message or a line of a grouped message (a
    # storm's backlog, bot/app/grouping.py), and every incident's own message posted: the grouped
    # ones' by the sweep, in their group's thread.
    incidents = service.store.list(cluster="storm")
    assert len(incidents) == WORKLOADS
    assert sorted(i.workload for i in incidents) == sorted(pods)
    service.sweep()  # what serve runs periodically
    incidents = service.store.list(cluster="storm")
    assert all(i.message_id for i in incidents)
    assert sorted(named_at_top_level(slack)) == sorted(f"{NS}/{w}" for w in pods)  # none twice, none missing
    # Each incident counts only pods of its own workload.
    assert all(set(i.pods) <= set(pods[i.workload]) for i in incidents)

    # Memory bounded by workloads, not pods: never more than one waiting crash per workload.
    assert work.peak_pending <= WORKLOADS, f"{work.peak_pending} crashes waited at once"
    assert len(work.queue) == 0 and not work.by_key
