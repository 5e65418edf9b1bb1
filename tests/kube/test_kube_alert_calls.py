"""How many Kubernetes API requests one new alert costs, through the real wiring.

OncallService with LiveCluster and KubeIncidentStore over the real kubernetes client, against
the Kubernetes API stand-in, posting to the Slack Web API stand-in. One alert goes all the way:
evidence, diagnosis, proposal with its server-side dry run, incident created, message posted,
incident updated with the message's ts. The stand-in records every request it receives.

Counts (this test's world: an exit-1 pod, as the example log's ValueError ends it, and a small
previous log, so one log read):
- before typed errors / resolved-workload proposals: 15 (ReplicaSet and Deployment read twice,
  the incident read three times).
- after them: 13 = 8 for the cluster (pod, previous log, events, node, GPU pods on the node,
  ReplicaSet, Deployment, dry run) + 5 for the incident (read: absent, create, read before
  posting, read + patch to store the ts).
- then: 8 = 5 for the cluster (pod, previous log, node, Deployment, dry run) + 3 for the incident
  (read: absent, create, patch to store the ts). What went:
  - events: read only when they can explain the crash (a kill: exit >= 128 or 0, a signal, a
    reason other than Error, or no termination record); an exit 1 with reason Error is the
    application raising, and its log says why (bot/kube/collect.py `events_can_explain`).
  - GPU pods on the node: only for a ticket bundle (`collect(gpu_pods=True)`); nothing in the
    diagnosis reads them.
  - ReplicaSet: the Deployment was read straight from the ReplicaSet's name when the pod's
    pod-template-hash label and the Deployment's selector agreed (a shortcut since removed).
  - the two incident reads after the create: the poster takes the incident it just created and
    stores the ts by a compare-and-swap update of it (bot/app/posting.py `ensure_posted`).
- now: 9, the ReplicaSet read again: names and labels are the pod's to write, so the shortcut
  let a forged pod aim the bot at any Deployment (issue 17); each owner is read and its uid
  checked (bot/remedy/ownership.py `resolve_owner`).
- a repeat of the same alert: 11 before, then 8, then 9 (pod, previous log, node, ReplicaSet,
  Deployment, then the incident: read, read, read + patch to count the repeat).
- now (issue 20): a new alert 8: the incident is created without reading it first (the create is
  the check: 409 when it exists); a repeat of the same crash 3: the pod (its restart count and
  last termination unchanged), then the incident read + patch to count it; no log read, no
  diagnosis, no owner reads. A new crash of the same pod is read and diagnosed in full.
"""

from __future__ import annotations

from collections import Counter

import pytest
from builders import EXAMPLE_LOG
from kubeapi.objects import container, crashing_deployment
from kubeapi.server import FakeKube
from slackapi import SlackStandIn

from bot.app.records import AlertTarget
from bot.app.service import OncallService, Policy
from bot.kube.api import KubeApi
from bot.kube.incidents import KubeIncidentStore
from bot.kube.live import LiveCluster
from bot.kube.retry import RetryPolicy
from bot.slack.chat import SlackChat, make_client

NS = "inference"
# What the cluster side costs for one new alert: every read once, one dry run.
CLUSTER_CALLS = {"get pods": 1, "get pods/log": 1, "get nodes": 1, "get replicasets": 1, "get deployments": 1,
                 "patch deployments (dry run)": 1}
# The incident: created holding the post lease (the create is the check), the message's ts stored.
INCIDENT_CALLS = {"create vllmincidents": 1, "patch vllmincidents": 1}
MAX_CALLS_PER_NEW_ALERT = 8  # CLUSTER_CALLS + INCIDENT_CALLS (see the module docstring)
MAX_CALLS_PER_REPEAT = 2  # the pod, the incident's patch (from the copy this process last wrote)


@pytest.fixture
def world():
    kube = FakeKube().start()
    slack = SlackStandIn().start()
    # exit 1, as the example log's ValueError ends the process: an application's error exit
    vllm = container(command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
                     args=["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])
    dep, pod = crashing_deployment(kube, name="vllm-llama3-8b", previous_log=EXAMPLE_LOG, exit_code=1,
                                   containers=[vllm])
    yield {"kube": kube, "slack": slack, "service": make_service(kube, slack), "pod": pod["metadata"]["name"]}
    slack.stop()
    kube.stop()


def make_service(kube: FakeKube, slack: SlackStandIn, wrap_chat=lambda chat: chat) -> OncallService:
    api = KubeApi(kube.api_client(), retry=RetryPolicy(attempts=3, sleep=lambda s: None))
    chat = SlackChat(make_client("xoxb-count", slack.url), "C0ALERTS", backoff_seconds=0.01)
    return OncallService(LiveCluster(api, name="count"), KubeIncidentStore(api, "vllm-oncall"), wrap_chat(chat),
                         Policy(approver_users=frozenset({"U0A"})), metrics=chat.metrics)


def counted(calls) -> Counter:
    return Counter(f"{c.verb} {c.resource}{' (dry run)' if c.dry_run else ''}" for c in calls)


def breakdown(calls) -> str:
    return ", ".join(f"{what} x{n}" for what, n in sorted(counted(calls).items()))


def test_one_new_alert_reads_everything_once(world):
    kube, slack = world["kube"], world["slack"]
    before = len(kube.calls)
    incident = world["service"].handle_alert(AlertTarget(namespace=NS, pod=world["pod"], container="vllm"))
    calls = kube.calls[before:]
    # The whole job was done: a proposal that passed its dry run, one message, its ts stored.
    assert incident is not None and incident.state == "proposed" and incident.proposal.dry_run_ok
    assert len(slack.posts()) == 1 and incident.message_id
    cluster_side = {what: n for what, n in counted(calls).items() if "vllmincidents" not in what}
    incident_side = {what: n for what, n in counted(calls).items() if "vllmincidents" in what}
    assert cluster_side == CLUSTER_CALLS, f"cluster calls for one new alert: {breakdown(calls)}"
    assert incident_side == INCIDENT_CALLS, f"incident calls for one new alert: {breakdown(calls)}"
    assert len(calls) <= MAX_CALLS_PER_NEW_ALERT, (
        f"{len(calls)} Kubernetes API calls for one new alert (at most {MAX_CALLS_PER_NEW_ALERT}): "
        f"{breakdown(calls)}")


def test_a_repeat_alert_makes_no_dry_run_and_no_create(world):
    kube, service = world["kube"], world["service"]
    target = AlertTarget(namespace=NS, pod=world["pod"], container="vllm")
    service.handle_alert(target)
    before = len(kube.calls)
    incident = service.handle_alert(target)
    calls = kube.calls[before:]
    assert incident is not None and incident.alert_count == 2 and len(world["slack"].posts()) == 1
    assert not any(c.dry_run or c.verb == "create" for c in calls), breakdown(calls)
    assert counted(calls) == {"get pods": 1, "patch vllmincidents": 1}, breakdown(calls)
    assert len(calls) <= MAX_CALLS_PER_REPEAT, (
        f"{len(calls)} Kubernetes API calls for a repeat alert (at most {MAX_CALLS_PER_REPEAT}): {breakdown(calls)}")


def test_a_new_crash_of_the_same_pod_is_read_and_diagnosed_again(world):
    kube, service = world["kube"], world["service"]
    target = AlertTarget(namespace=NS, pod=world["pod"], container="vllm")
    service.handle_alert(target)

    def crashed_again(pod: dict) -> None:
        status = pod["status"]["containerStatuses"][0]
        status["restartCount"] = status.get("restartCount", 0) + 1
        status["lastState"]["terminated"]["finishedAt"] = "2026-11-30T06:00:00Z"

    kube.edit("Pod", world["pod"], NS, crashed_again)
    before = len(kube.calls)
    incident = service.handle_alert(target)
    calls = counted(kube.calls[before:])
    assert incident is not None and incident.alert_count == 2 and len(world["slack"].posts()) == 1
    assert calls["get pods/log"] == 1 and calls["get replicasets"] == 1, breakdown(kube.calls[before:])
    assert not calls["create vllmincidents"]  # known to exist: folded straight into it


class RepeatWhilePosting:
    """The chat, with a repeat of the alert arriving (and writing the incident) while the first
    alert's post is in flight."""

    def __init__(self, chat: SlackChat):
        self.chat, self.repeat = chat, None

    def post_incident(self, incident, channel=None, thread=None):
        message = self.chat.post_incident(incident, channel, thread)
        if self.repeat is not None:
            repeat, self.repeat = self.repeat, None
            repeat()
        return message

    def __getattr__(self, name):
        return getattr(self.chat, name)


def test_a_write_during_the_post_falls_back_to_read_modify_write(world):
    kube, slack = world["kube"], world["slack"]
    target = AlertTarget(namespace=NS, pod=world["pod"], container="vllm")
    chat: RepeatWhilePosting | None = None

    def wrap(real: SlackChat) -> RepeatWhilePosting:
        nonlocal chat
        chat = RepeatWhilePosting(real)
        return chat

    service = make_service(kube, slack, wrap_chat=wrap)
    assert chat is not None
    chat.repeat = lambda: service.handle_alert(target)

    incident = service.handle_alert(target)

    # The repeat's write made the patch storing the ts lose its compare-and-swap: the poster
    # re-reads and patches again, keeping the repeat's counter; still one message.
    assert incident is not None and incident.message_id and incident.alert_count == 2
    stored = KubeIncidentStore(KubeApi(kube.api_client()), "vllm-oncall").get(incident.name)
    assert stored.message_id == incident.message_id and stored.alert_count == 2 and stored.post_lease is None
    assert len(slack.posts()) == 1
    patches = [c.code for c in kube.calls if c.resource == "vllmincidents" and c.verb == "patch"]
    assert patches == [200, 409, 200], breakdown(kube.calls)  # the repeat's, ours refused, ours again


def test_an_alert_whose_container_label_names_no_container_is_diagnosed_on_the_vllm_container(world):
    """Alertmanager's `container` label is input: one naming no container of the pod (a rule
    relabelled, a sidecar's name) falls back to the vLLM container instead of failing after the 200."""
    incident = world["service"].handle_alert(AlertTarget(namespace=NS, pod=world["pod"], container="no-such-one"))
    assert incident is not None and incident.state == "proposed"
    assert incident.proposal is not None and incident.proposal.workload.container == "vllm"
    assert len(world["slack"].posts()) == 1


def test_a_resolved_alert_lists_only_the_unresolved_incidents_and_writes_its_own(world):
    """Incidents are never deleted: listing every incident of the namespace for each resolved
    alert would read all the resolved ones too, more with every week."""
    kube, service = world["kube"], world["service"]
    vllm = container(command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"], args=["--max-model-len", "32768"])
    others = [crashing_deployment(kube, name=f"vllm-other-{i}", previous_log=EXAMPLE_LOG, exit_code=1,
                                  containers=[vllm])[1]["metadata"]["name"] for i in range(2)]
    mine = service.handle_alert(AlertTarget(namespace=NS, pod=world["pod"], container="vllm"))
    still_open = service.handle_alert(AlertTarget(namespace=NS, pod=others[0], container="vllm"))
    service.handle_alert(AlertTarget(namespace=NS, pod=others[1], container="vllm"))
    service.handle_alert(AlertTarget(namespace=NS, pod=others[1], container="vllm", firing=False))
    store = KubeIncidentStore(KubeApi(kube.api_client()), "vllm-oncall")
    untouched = {i.name: i.version for i in store.list() if i.name != mine.name}
    before = len(kube.calls)
    resolved = service.handle_alert(AlertTarget(namespace=NS, pod=world["pod"], container="vllm", firing=False))
    calls = kube.calls[before:]
    assert resolved is not None and resolved.name == mine.name and resolved.state == "resolved"
    assert counted(calls) == {"list vllmincidents": 1, "patch vllmincidents": 1}, breakdown(calls)
    listed = next(c for c in calls if c.verb == "list")
    assert "oncall.vllm.ai/state!=resolved" in listed.query["labelSelector"].split(",")
    assert {i.name: i.version for i in store.list() if i.name != mine.name} == untouched
    assert store.get(still_open.name).state == "proposed" and store.get(mine.name).state == "resolved"
