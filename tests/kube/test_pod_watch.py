"""Detection at the first termination (bot/kube/watch.py), through the real kubernetes client's
watch against the API stand-in, with the real service, incident store and Slack client behind it.

The promise: a vLLM container's first crash is one Slack message, before any alert; the alert
that comes later folds into it; a relist after 410 Gone and a dropped watch connection miss no
crash and post none twice; two replicas watching post once."""

from __future__ import annotations

import time

import pytest
from builders import EXAMPLE_LOG, FIXTURE_BUNDLES
from kubeapi.objects import container, deployment, node, start_pod
from kubeapi.server import FakeKube
from slackapi import SlackStandIn
from standin_http import bound

from bot.app.records import AlertTarget
from bot.app.service import OncallService, Policy
from bot.app.work import WorkQueue
from bot.kube.api import KubeApi
from bot.kube.incidents import KubeIncidentStore
from bot.kube.live import LiveCluster
from bot.kube.retry import RetryPolicy
from bot.kube.watch import PodState, PodWatch, WatchSettings, is_vllm_container
from bot.slack.chat import SlackChat, make_client

NS = "inference"
SETTINGS = WatchSettings(namespaces=(NS,), timeout_seconds=5, backoff_initial=0.02, backoff_max=0.2)


def make_service(kube: FakeKube, slack: SlackStandIn, replica: str = "a") -> OncallService:
    api = KubeApi(kube.api_client(), retry=RetryPolicy(attempts=3, sleep=lambda s: None))
    chat = SlackChat(make_client("xoxb-watch", slack.url), "C0ALERTS", backoff_seconds=0.01)
    return OncallService(LiveCluster(api, name="watch"), KubeIncidentStore(api, "vllm-oncall"), chat,
                         Policy(approver_users=frozenset({"U0A"})), metrics=chat.metrics)


def running_vllm(kube: FakeKube, name: str, image_only: bool = False) -> str:
    """A Deployment whose one vLLM pod is running, never crashed yet; returns the pod name."""
    kube.put(node())
    c = container(command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
                  args=["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])
    dep = kube.put(deployment(name, [c], NS))
    return start_pod(kube, dep, "starting")["metadata"]["name"]


def crash(kube: FakeKube, pod: str, exit_code: int = 1, reason: str = "Error", restarts: int = 1,
          finished: str = "2026-11-30T05:01:30Z", log: str = EXAMPLE_LOG) -> str:
    """What the kubelet does at a container's termination: the log is kept as --previous, the
    status gets lastState.terminated and a restart. Returns the pod's new resourceVersion."""
    kube.set_log(NS, pod, "vllm", log, previous=True)

    def mutate(obj: dict) -> None:
        cs = obj["status"]["containerStatuses"][0]
        cs["restartCount"] = restarts
        cs["state"] = {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting failed"}}
        cs["lastState"] = {"terminated": {"exitCode": exit_code, "reason": reason,
                                          "startedAt": "2026-11-30T05:00:00Z", "finishedAt": finished}}

    return str(kube.edit("Pod", pod, NS, mutate)["metadata"]["resourceVersion"])


def alert_count(kube: FakeKube, slack: SlackStandIn) -> int:
    incidents = make_service(kube, slack).store.list()
    return incidents[0].alert_count if incidents else 0


def wait_until(predicate, timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + bound(timeout)  # only bounds a failure
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def handled(w: PodWatch, rv: str) -> None:
    """The watch has taken the pod state of resourceVersion `rv` (and so every earlier event), and
    what it queued is done: a look at what did NOT happen needs this, not a sleep."""
    assert wait_until(lambda: rv in w.stats.seen), f"the watch never saw resourceVersion {rv}"
    assert w.work.wait_idle(bound(15)), "the work queue never went idle"


@pytest.fixture
def world():
    kube = FakeKube().start()
    slack = SlackStandIn().start()
    watches: list[PodWatch] = []
    queues: list[WorkQueue] = []

    def watch(service: OncallService) -> PodWatch:
        api = KubeApi(kube.api_client(), retry=RetryPolicy(attempts=2, sleep=lambda s: None))
        work = WorkQueue(workers=1, queue_size=10)  # each replica's own, as in `serve`
        w = PodWatch(api, work, service.handle_alert, SETTINGS).start()
        watches.append(w)
        queues.append(work)
        return w

    yield kube, slack, watch
    for w in watches:
        w.stop()
    for work in queues:
        work.shutdown()
    slack.stop()
    kube.stop()


def test_the_first_crash_is_one_message_before_any_alert_and_the_alert_folds_into_it(world):
    kube, slack, watch = world
    pod = running_vllm(kube, "vllm-llama3-8b")
    service = make_service(kube, slack)
    w = watch(service)
    assert kube.wait_for_watchers(1)
    rv = crash(kube, pod)
    assert wait_until(lambda: len(slack.posts()) == 1), "the first crash posted nothing"
    handled(w, rv)
    assert len(slack.posts()) == 1 and w.stats.crashes == 1
    incidents = service.store.list()
    assert len(incidents) == 1 and incidents[0].alert_count == 1 and incidents[0].pods == [pod]

    # KubePodCrashLooping, 16-21 minutes later: the same incident and thread, no second message.
    folded = service.handle_alert(AlertTarget(namespace=NS, pod=pod, container="vllm"))
    assert folded is not None and folded.name == incidents[0].name and folded.alert_count == 2
    assert len(slack.posts()) == 1


def test_a_restart_count_moving_on_without_a_new_termination_is_not_a_crash(world):
    kube, slack, watch = world
    pod = running_vllm(kube, "vllm-a")
    w = watch(make_service(kube, slack))
    assert kube.wait_for_watchers(1)
    crash(kube, pod)
    assert wait_until(lambda: w.stats.crashes == 1)
    kube.edit("Pod", pod, NS, lambda o: o["status"]["containerStatuses"][0].update(ready=True))  # same termination
    handled(w, crash(kube, pod, restarts=2, finished="2026-11-30T05:01:30Z"))  # a re-sent status, same finishedAt
    assert w.stats.crashes == 1
    crash(kube, pod, restarts=2, finished="2026-11-30T05:03:00Z")  # the next crash: folds, posts nothing new
    assert wait_until(lambda: w.stats.crashes == 2)
    assert wait_until(lambda: alert_count(kube, slack) == 2)
    assert len(slack.posts()) == 1


def test_a_relist_after_410_gone_misses_no_crash_and_posts_none_twice(world):
    kube, slack, watch = world
    first, second = running_vllm(kube, "vllm-a"), running_vllm(kube, "vllm-b")
    w = watch(make_service(kube, slack))
    assert kube.wait_for_watchers(1)
    crash(kube, first)
    assert wait_until(lambda: len(slack.posts()) == 1)
    opened = kube.watches_opened
    with kube.lock:  # nothing reaches the watch between these: its connection is cut, the crash
        kube.drop_watches()  # happens while it is away, and the history it would resume from is gone
        rv = crash(kube, second)
        kube.compact()
    assert wait_until(lambda: len(slack.posts()) == 2), "the crash during the gap was missed"
    assert kube.wait_for_watchers(1, opened_more_than=opened)
    handled(w, rv)  # the relist that found it is over, and all it queued is done
    assert w.stats.relists_after_gone >= 1 and w.stats.lists >= 2
    assert len(slack.posts()) == 2 and w.stats.crashes == 2  # the first pod's crash was not re-reported


def test_a_dropped_watch_connection_resumes_from_its_resource_version(world):
    kube, slack, watch = world
    first, second = running_vllm(kube, "vllm-a"), running_vllm(kube, "vllm-b")
    w = watch(make_service(kube, slack))
    assert kube.wait_for_watchers(1)
    crash(kube, first)
    assert wait_until(lambda: len(slack.posts()) == 1)
    with kube.lock:
        kube.drop_watches()
        rv = crash(kube, second)
    assert wait_until(lambda: len(slack.posts()) == 2), "the crash during the drop was missed"
    handled(w, rv)
    assert len(slack.posts()) == 2 and w.stats.crashes == 2
    assert w.stats.reconnects >= 1 and w.stats.relists_after_gone == 0 and w.stats.lists == 1


def test_two_replicas_watching_post_once(world):
    kube, slack, watch = world
    pod = running_vllm(kube, "vllm-llama3-8b")
    a, b = watch(make_service(kube, slack, "a")), watch(make_service(kube, slack, "b"))
    assert kube.wait_for_watchers(2)
    crash(kube, pod)
    assert wait_until(lambda: a.stats.crashes == 1 and b.stats.crashes == 1)
    assert wait_until(lambda: alert_count(kube, slack) == 2)
    assert len(slack.posts()) == 1


def test_crashes_that_are_not_a_vllm_containers_or_not_failures_are_ignored(world):
    kube, slack, watch = world
    pod = running_vllm(kube, "vllm-a")
    kube.put(node())
    other = kube.put(deployment("web", [{"name": "vllm", "image": "nginx:1.27"}], NS))
    web = start_pod(kube, other, "starting")["metadata"]["name"]
    w = watch(make_service(kube, slack))
    assert kube.wait_for_watchers(1)
    crash(kube, web)  # not vLLM: nginx, no vllm command
    handled(w, crash(kube, pod, exit_code=0, reason="Completed"))  # a clean exit is not a crash
    assert w.stats.crashes == 0 and not slack.posts()
    crash(kube, pod, exit_code=137, reason="OOMKilled", finished="2026-11-30T05:09:00Z", restarts=2)
    assert wait_until(lambda: w.stats.crashes == 1)


def test_memory_is_two_numbers_per_vllm_container_and_nothing_for_other_pods():
    state = PodState(all_containers=False)
    for i in range(1000):
        image = "vllm/vllm-openai:v0.11.0" if i % 10 == 0 else "nginx"
        state.observe({"metadata": {"namespace": NS, "name": f"p{i}"},
                       "spec": {"containers": [{"name": "c", "image": image}]},
                       "status": {"containerStatuses": [{"name": "c", "restartCount": 0}]}}, report=True)
    assert len(state.pods) == 100
    assert all(v == {"c": (0, None)} for v in state.pods.values())
    assert is_vllm_container({"image": "registry.local/llm:1", "command": ["python3", "-m",
                                                                            "vllm.entrypoints.openai.api_server"]})
    assert not is_vllm_container({"image": "registry.local/llm:1", "args": ["serve"]})


RUNTIME_BUNDLE = FIXTURE_BUNDLES / "runtime-oom-after-ready-v1-logits"


def test_a_container_that_had_been_ready_dies_serving_and_becomes_an_incident_with_a_proposal(world):
    """Issue 21: a crash hours after start (run-time OOM, then EngineDeadError) is one incident, as a
    start-up crash is: the same message, with the proposal from the run-time playbook."""
    kube, slack, watch = world
    kube.put(node(labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "nvidia.com/gpu.memory": "81559"}))
    c = container(command=["vllm", "serve", "Qwen/Qwen2.5-32B-Instruct"],
                  args=["--max-model-len", "32768", "--gpu-memory-utilization", "0.92"])
    dep = kube.put(deployment("qwen-32b", [c], NS))
    pod = start_pod(kube, dep, "ready")["metadata"]["name"]  # Ready, serving
    service = make_service(kube, slack)
    w = watch(service)
    assert kube.wait_for_watchers(1)
    crash(kube, pod, log=(RUNTIME_BUNDLE / "previous.log").read_text(), finished="2026-11-30T11:05:22Z")
    assert wait_until(lambda: len(slack.posts()) == 1), "the run-time crash posted nothing"
    assert w.stats.crashes == 1 and w.stats.crashes_after_ready == 1
    incident = service.store.list()[0]
    assert incident.cause == "runtime-oom-after-ready"
    assert incident.proposal is not None
    assert any(ch.name == "--gpu-memory-utilization" and ch.after == "0.87" for ch in incident.proposal.changes)
    assert "ran out of GPU memory while serving, after it had been Ready" in str(slack.posts()[0])


def test_ready_is_remembered_per_run():
    state = PodState(all_containers=False)
    pod = {"metadata": {"namespace": NS, "name": "p"},
           "spec": {"containers": [{"name": "c", "image": "vllm/vllm-openai:v0.11.0"}]},
           "status": {"containerStatuses": [{"name": "c", "restartCount": 0, "ready": True}]}}
    assert state.observe(pod, report=False) == []
    died = {"exitCode": 1, "reason": "Error", "finishedAt": "2026-11-30T11:05:22Z"}
    pod["status"]["containerStatuses"][0].update(ready=False, restartCount=1, lastState={"terminated": died})
    assert state.observe(pod, report=True) == [("c", died, True)]
    # the next run never got Ready: its crash is a start-up crash
    again = dict(died, finishedAt="2026-11-30T11:07:00Z")
    pod["status"]["containerStatuses"][0].update(restartCount=2, lastState={"terminated": again})
    assert state.observe(pod, report=True) == [("c", again, False)]
