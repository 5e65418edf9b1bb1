"""Verification to the seeds' standard, against the stand-ins: the Kubernetes API (the Deployment
controller played by its on_write hook), a scripted vLLM pod behind its pod proxy, Slack. Only
Ready + vLLM's KV-cache line + a real completion + a clean soak make an incident `verified`; each
way it falls short gets its own thread reply."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from kubeapi.objects import container, crashing_deployment, rollout_controller
from kubeapi.server import FakeKube
from kubeapi.vllmpod import ScriptedVllm
from slackapi import SlackStandIn

from bot.app.records import AlertTarget
from bot.app.rollout import VerifySteps
from bot.app.service import OncallService, Policy
from bot.kube.api import KubeApi
from bot.kube.incidents import KubeIncidentStore
from bot.kube.live import LiveCluster
from bot.kube.retry import RetryPolicy
from bot.kube.verify import ServingChecks
from bot.slack.chat import SlackChat, make_client

NS = "inference"
APPROVER = "U0A"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
CRASH_LOG = """\
INFO 11-30 05:00:01 [core.py:76] Initializing a V1 LLM engine (v0.10.2) with config: model='m', max_seq_len=32768
ValueError: To serve at least one request with the models's max seq len (32768), (4.0 GiB KV cache is needed, which is larger than the available KV cache memory (2.34 GiB). Based on the available memory, the estimated maximum model length is 18432. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.
"""
READY_LOG = """\
INFO 11-30 05:10:01 [gpu_worker.py:298] Available KV cache memory: 10.55 GiB
INFO 11-30 05:10:01 [kv_cache_utils.py:1087] GPU KV cache size: 86,432 tokens
INFO 11-30 05:10:01 [kv_cache_utils.py:1091] Maximum concurrency for 18,432 tokens per request: 4.69x
"""


class World:
    def __init__(self, new_pod_log: str = READY_LOG, soak: float = 0.3, request_timeout: float = 5.0,
                 probe_time: dict | None = None, traffic=None):
        self.probe_time = probe_time or {}  # the probe's clock and sleep, when the test drives them
        self.traffic = traffic  # the workload's request histograms (bot.app.ports.TrafficHistory), if any
        self.kube, self.slack = FakeKube().start(), SlackStandIn().start()
        self.vllm = ScriptedVllm(model=MODEL).start()
        self.kube.default_pod_backend = self.vllm.url
        _, self.pod = crashing_deployment(self.kube, name="vllm-llama3-8b", previous_log=CRASH_LOG, exit_code=1,
                                          containers=[container(command=["vllm", "serve", MODEL],
                                                                args=["--max-model-len", "32768"])])
        self.kube.on_write = rollout_controller("ready", log=new_pod_log)
        self.steps = VerifySteps(probe=None, request_timeout_seconds=request_timeout, soak_seconds=soak)
        self.service = self.make_service()

    def make_service(self, run_later=None, clock=None) -> OncallService:
        api = KubeApi(self.kube.api_client(), retry=RetryPolicy(attempts=2, sleep=lambda s: None))
        probe = ServingChecks(api, poll_seconds=0.05, **self.probe_time)
        chat = SlackChat(make_client("xoxb-verify", self.slack.url), "C0ALERTS", backoff_seconds=0.01)
        return OncallService(LiveCluster(api, name="verify", poll_seconds=0.02), KubeIncidentStore(api, "vllm-oncall"),
                             chat, Policy(approver_users=frozenset({APPROVER}), verify_timeout_seconds=10),
                             metrics=chat.metrics, run_later=run_later, **({"clock": clock} if clock else {}),
                             verify_steps=VerifySteps(probe=probe, request_timeout_seconds=self.steps.request_timeout_seconds,
                                                      soak_seconds=self.steps.soak_seconds), traffic=self.traffic)

    def open_and_approve(self) -> str:
        incident = self.service.handle_alert(AlertTarget(namespace=NS, pod=self.pod["metadata"]["name"],
                                                         container="vllm"))
        assert incident is not None and incident.state == "proposed", incident
        assert self.service.approve(incident.name, APPROVER) == "applied"
        return incident.name

    def replies(self) -> list[str]:
        return [c.params.get("text", "") for c in self.slack.replies()]

    def stop(self) -> None:
        for part in (self.vllm, self.slack, self.kube):
            part.stop()


@pytest.fixture
def world():
    made: list[World] = []

    def make(**kwargs) -> World:
        made.append(World(**kwargs))
        return made[-1]

    yield make
    for w in made:
        w.stop()


def state(w: World, name: str) -> str:
    return str(w.service.store.get(name).state)


def test_ready_kv_line_completion_and_clean_soak_is_verified_step_by_step(world):
    w = world()
    name = w.open_and_approve()
    assert state(w, name) == "verified"
    replies = w.replies()
    assert any("1/4 New pod" in r and "is Ready" in r and "2/4 vLLM: GPU KV cache size: 86,432 tokens" in r
               for r in replies), replies
    completion = next(r for r in replies if "3/4" in r)
    assert "returned 16 tokens in" in completion and MODEL in completion
    assert any("4/4" in r and "no restart and no crash in 0.3 s" in r for r in replies)
    method, path, body = w.vllm.requests[-1]
    assert (method, path, body["model"], body["max_tokens"]) == ("POST", "/v1/completions", MODEL, 16)
    assert w.service.store.get(name).verification_step is None


def test_ready_without_a_kv_line_is_not_verified(world):
    w = world(new_pod_log="INFO 11-30 05:10:30 [api_server.py:1] Starting vLLM API server on http://0.0.0.0:8000\n")
    name = w.open_and_approve()
    assert state(w, name) == "applied"
    assert any("Ready, no KV figures" in r for r in w.replies())
    assert not w.vllm.requests  # no request to a pod whose fit is unconfirmed


def test_a_completion_error_fails_the_verification_with_a_re_diagnosis(world):
    w = world()
    w.vllm.mode = "error"
    name = w.open_and_approve()
    assert state(w, name) == "failed"
    failed = next(r for r in w.replies() if "3/4" in r)
    assert "does not serve" in failed and "HTTP 500" in failed and "illegal memory access" in failed
    last = w.slack.replies()[-1] if "3/4" in w.replies()[-1] else next(c for c in w.slack.replies()
                                                                       if "3/4" in c.params.get("text", ""))
    assert "roll_back" in str(last.params.get("blocks")) or "Roll back" in str(last.params.get("blocks"))


def test_a_completion_timeout_is_its_own_failure(world):
    w = world(request_timeout=0.3)
    w.vllm.mode, w.vllm.delay = "slow", 2.0
    name = w.open_and_approve()
    assert state(w, name) == "failed"
    assert any("3/4" in r and "no answer to a completion request within 0.3 s" in r for r in w.replies())


def test_a_crash_in_the_soak_is_re_diagnosed_with_a_roll_back_button(world):
    # The probe's clock moves only when its soak sleeps; its first sleep is where the pod crashes:
    # after the soak read the pod it started from, before the soak ends (no wall-time race).
    now = [0.0]
    done = threading.Event()

    def crash_while_soaking(seconds: float) -> None:
        if not done.is_set():
            assert any("4/4 Soak" in r for r in w.replies()), "the crash comes during the soak"
            crash()
        now[0] += seconds

    w = world(soak=15.0, probe_time={"clock": lambda: now[0], "sleep": crash_while_soaking})

    def crash() -> None:
        new = next(p for p in w.kube.list("Pod", NS) if p["metadata"]["name"].endswith("-newpd"))
        w.kube.set_log(NS, new["metadata"]["name"], "vllm", CRASH_LOG, previous=True)

        def restart(obj: dict) -> None:
            cs = obj["status"]["containerStatuses"][0]
            cs["restartCount"] = 1
            cs["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": "2026-11-30T05:20:00Z"}}

        w.kube.edit("Pod", new["metadata"]["name"], NS, restart)
        done.set()

    name = w.open_and_approve()
    assert done.is_set()
    assert state(w, name) == "failed"
    soak = next(c for c in w.slack.replies() if "4/4" in c.params.get("text", "") and "crashed" in c.params["text"])
    assert "crashed during the soak" in soak.params["text"]
    assert "Roll back" in str(soak.params.get("blocks"))


def later(minutes: float):
    """A clock `minutes` ahead: a bot that starts after the one before it died."""
    return lambda: datetime.now(UTC) + timedelta(minutes=minutes)


def test_a_restart_mid_verification_resumes_the_step_it_was_in(world):
    w = world()
    queued: list = []
    first = w.make_service(run_later=queued.append)  # the verification is queued, then the bot dies
    incident = first.handle_alert(AlertTarget(namespace=NS, pod=w.pod["metadata"]["name"], container="vllm"))
    assert first.approve(incident.name, APPROVER) == "applied" and len(queued) == 1
    stored = first.store.get(incident.name)
    first.store.update(stored.model_copy(update={"verification_step": "soak"}))  # where it was when it died

    w.make_service().sweep()  # restarted at once: within the grace the change counts as being followed
    assert not any("resuming it" in r for r in w.replies())
    restarted = w.make_service(clock=later(3))
    restarted.sweep()
    assert any("The bot restarted during verification (step: soak), or the replica following it stopped; "
               "resuming it." in r for r in w.replies())
    assert state(w, incident.name) == "verified"
    assert not w.vllm.requests  # it was past the request: only the soak ran again
    restarted.sweep()
    assert sum("resuming it" in r for r in w.replies()) == 1


def test_a_live_replicas_verification_is_left_alone_and_a_dead_ones_is_resumed_by_one_replica(world):
    w = world()
    queued: list = []
    first = w.make_service(run_later=queued.append)
    incident = first.handle_alert(AlertTarget(namespace=NS, pod=w.pod["metadata"]["name"], container="vllm"))
    assert first.approve(incident.name, APPROVER) == "applied"
    # the first replica is in its soak step: it wrote the step with its lease (renewed by its sweeps)
    first.rollout.leases.step(incident.name, "soak")
    lease = first.store.get(incident.name).verify_lease
    assert lease is not None and lease.holder == first.rollout.leases.holder

    other = w.make_service(clock=later(1))  # another replica, while the first one still renews its lease
    other.sweep()
    assert not any("resuming it" in r for r in w.replies()) and state(w, incident.name) == "applied"

    # the first replica dies: nobody renews; after the grace two replicas sweep at the same time
    b, c = w.make_service(clock=later(3), run_later=queued.append), w.make_service(clock=later(3),
                                                                                    run_later=queued.append)
    b.sweep()
    c.sweep()
    assert sum("resuming it" in r for r in w.replies()) == 1, "exactly one replica took it over"
    taken = w.service.store.get(incident.name).verify_lease
    assert taken is not None and taken.holder == b.rollout.leases.holder
    queued[-1]()  # b's resumed verification runs
    assert state(w, incident.name) == "verified"
    assert w.service.store.get(incident.name).verify_lease is None


def test_a_bot_killed_after_slack_took_its_applied_reply_but_before_it_recorded_so_does_not_say_it_twice(world):
    w = world()
    queued: list = []
    first = w.make_service(run_later=queued.append)  # its verification never runs: it dies
    incident = first.handle_alert(AlertTarget(namespace=NS, pod=w.pod["metadata"]["name"], container="vllm"))
    assert first.approve(incident.name, APPROVER) == "applied"
    assert sum("Applied by" in r for r in w.replies()) == 1
    stored = first.store.get(incident.name)  # as it was an instant before the "reported" write
    first.store.update(stored.model_copy(update={"verification_step": "report"}))

    restarted = w.make_service(clock=later(3))
    restarted.sweep()
    assert w.slack.delivered("conversations.replies"), "it looked in the thread first"
    assert sum("Applied by" in r for r in w.replies()) == 1, "the Applied report was said twice"
    assert state(w, incident.name) == "verified"


def test_a_bot_killed_before_its_applied_reply_reached_slack_sends_it_once_on_resume(world):
    w = world()
    queued: list = []
    first = w.make_service(run_later=queued.append)
    incident = first.handle_alert(AlertTarget(namespace=NS, pod=w.pod["metadata"]["name"], container="vllm"))
    w.slack.fail_next("chat.postMessage", status=429, retry_after=0, times=10)  # the Applied reply never lands
    assert first.approve(incident.name, APPROVER) == "applied"
    w.slack.clear_faults()
    assert not any("Applied by" in r for r in w.replies())
    stored = first.store.get(incident.name)
    first.store.update(stored.model_copy(update={"verification_step": "report"}))  # killed before "reported"

    w.make_service(clock=later(3)).sweep()
    assert sum("Applied by" in r for r in w.replies()) == 1
    assert state(w, incident.name) == "verified"
