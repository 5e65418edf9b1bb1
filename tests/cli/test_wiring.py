"""`serve`'s composition root (bot/cli/wiring.py) built from settings as `serve` builds it, against
the Kubernetes API stand-in (real kubernetes client) and the Slack stand-in:

- the operator's playbooks (VLLM_ONCALL_PLAYBOOKS) reach every diagnosis, the verification's
  re-diagnosis of a new pod that crashes included (issue 16: it used the bundled playbooks only);
- a pod with a forged owner (a ReplicaSet that does not exist, the labels of a healthy
  Deployment) is never patched (issue 17 item 5);
- the webhook and the pod watch submit to the one work queue.
"""

from __future__ import annotations

import pytest
from builders import EXAMPLE_LOG, use_kubeconfig, wait_for
from kubeapi.objects import container, crashing_deployment, deployment, node, rollout_controller

from bot.app.ports import ChatUnavailable
from bot.app.records import AlertTarget
from bot.app.state import IncidentState
from bot.cli.settings import load_settings
from bot.cli.wiring import Wiring, build

NS = "inference"
APPROVER = "U0APPROVER"
# The verification ends as soon as the new pod is Ready (or crashes); this only bounds it. 20 s can be
# outlasted on a loaded machine (load 26 on 2 cores seen), and the outcome would read "timeout" instead.
VERIFY_BOUND = "120"
SITE_PLAYBOOK = """\
id: site-model-cache-corrupt
title: The site's model cache returned a corrupt shard
summary: re-sync the model cache volume
priority: 990
when:
  - log: 'SITE-CACHE: checksum mismatch'
explanation: >-
  The operator's own failure, known only to the operator's playbook.
evidence: []
fixes: []
"""
SITE_CRASH_LOG = ("INFO 11-30 05:20:00 [loader.py:10] loading shards from /models\n"
                  "SITE-CACHE: checksum mismatch in shard 3 of 4\n"
                  "Traceback (most recent call last):\nRuntimeError: corrupt shard\n")
VLLM = dict(command=["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct"],
            args=["--max-model-len", "32768", "--gpu-memory-utilization", "0.9"])


@pytest.fixture
def wired(kube_api, slack, tmp_path, monkeypatch):
    """build(settings), as `serve` calls it, with an extra playbooks folder."""
    books = tmp_path / "site-playbooks"
    books.mkdir()
    (books / "site-model-cache-corrupt.yaml").write_text(SITE_PLAYBOOK)
    use_kubeconfig(monkeypatch, kube_api.url, tmp_path)
    settings = load_settings({
        "VLLM_ONCALL_CLUSTER": "wiring-test", "SLACK_BOT_TOKEN": "xoxb-wiring", "SLACK_API_URL": slack.url,
        "SLACK_SIGNING_SECRET": "s3cret", "VLLM_ONCALL_SLACK_CHANNEL": "C0ALERTS", "VLLM_ONCALL_APPROVERS": APPROVER,
        "VLLM_ONCALL_ALERTS_UNAUTHENTICATED": "true", "VLLM_ONCALL_LISTEN": "127.0.0.1:0", "VLLM_ONCALL_STORE": "kube", "VLLM_ONCALL_INCIDENT_NAMESPACE": "vllm-oncall",
        "VLLM_ONCALL_VERIFY_TIMEOUT_SECONDS": VERIFY_BOUND, "VLLM_ONCALL_VERIFY_SOAK_SECONDS": "0",
        "VLLM_ONCALL_PLAYBOOKS": str(books)})
    wiring = build(settings)
    yield wiring
    wiring.server.stop()


def alert(wiring: Wiring, pod: str):
    return wiring.router.default.handle_alert(AlertTarget(namespace=NS, pod=pod, container="vllm"))


def test_a_new_pod_that_crashes_during_verification_is_rediagnosed_with_the_operators_playbook(wired, kube_api,
                                                                                               slack):
    dep, pod = crashing_deployment(kube_api, name="vllm-llama3-8b", previous_log=EXAMPLE_LOG,
                                   containers=[container(**VLLM)])
    # The approved change rolls out a new pod, which crashes with a failure only the site's playbook knows.
    kube_api.on_write = rollout_controller("crashloop", previous_log=SITE_CRASH_LOG)
    incident = alert(wired, pod["metadata"]["name"])
    assert incident is not None and incident.state == IncidentState.PROPOSED

    service = wired.router.default
    assert service.approve(incident.name, APPROVER, digest=incident.proposal.digest) == "applied"
    assert wait_for(lambda: service.store.get(incident.name).state == IncidentState.FAILED, timeout=30)

    rollout = service.store.get(incident.name).applied.rollout
    assert rollout.outcome == "crashed"
    assert "The site's model cache returned a corrupt shard" in rollout.message, rollout.message
    # the thread reply follows the state write: wait for it (a loaded run looked before it came)
    assert wait_for(lambda: any("corrupt shard" in str(reply.params.get("blocks") or reply.params.get("text"))
                                for reply in slack.replies()), timeout=30)


def test_a_pod_with_a_forged_owner_is_never_patched(wired, kube_api):
    # Issue 17 item 5: a healthy Deployment `victim`, and a pod anyone who may create pods could
    # make: its ownerReference names a ReplicaSet that does not exist, its labels are victim's.
    kube_api.put(node())
    victim = kube_api.put(deployment("victim", [container(**VLLM)], NS))
    forged = kube_api.put({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "victim-fakehash1-abcde", "namespace": NS,
                     "labels": {"app": "victim", "pod-template-hash": "fakehash1"},
                     "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "victim-fakehash1",
                                          "uid": "5b0c1e4a-0000-0000-0000-000000000000", "controller": True}]},
        "spec": {"nodeName": "gpu-node-1", "containers": [container(**VLLM)]},
        "status": {"phase": "Running", "containerStatuses": [{
            "name": "vllm", "restartCount": 3, "ready": False,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "finishedAt": "2026-11-30T05:01:30Z"}}}]}})
    kube_api.set_log(NS, forged["metadata"]["name"], "vllm", EXAMPLE_LOG, previous=True)

    incident = alert(wired, forged["metadata"]["name"])

    assert incident is not None and incident.workload != "victim"
    assert incident.proposal is None or incident.proposal.workload.live_patch_blocked
    assert incident.state != IncidentState.PROPOSED  # nothing to approve
    assert wired.router.default.approve(incident.name, APPROVER) != "applied"
    assert not [c for c in kube_api.calls if c.verb == "patch" and c.resource == "deployments"]
    after = kube_api.get("Deployment", "victim", NS)
    assert after["metadata"]["resourceVersion"] == victim["metadata"]["resourceVersion"]


def test_the_webhook_and_the_pod_watch_share_the_one_work_queue(kube_api, slack, tmp_path, monkeypatch):
    use_kubeconfig(monkeypatch, kube_api.url, tmp_path)
    settings = load_settings({
        "VLLM_ONCALL_CLUSTER": "wiring-test", "SLACK_BOT_TOKEN": "xoxb-wiring", "SLACK_API_URL": slack.url,
        "SLACK_SIGNING_SECRET": "s3cret", "VLLM_ONCALL_SLACK_CHANNEL": "C0ALERTS", "VLLM_ONCALL_APPROVERS": APPROVER,
        "VLLM_ONCALL_ALERTS_UNAUTHENTICATED": "true", "VLLM_ONCALL_LISTEN": "127.0.0.1:0", "VLLM_ONCALL_STORE": "kube", "VLLM_ONCALL_WATCH": "true",
        "VLLM_ONCALL_WATCH_NAMESPACES": NS})
    wiring = build(settings)
    try:
        assert len(wiring.watches) == 1
        assert wiring.server.executor is wiring.work and wiring.server.intake.executor is wiring.work
        assert wiring.watches[0].work is wiring.work
        assert wiring.watches[0].handle == wiring.server.router.handle_alert  # so the two fold together
    finally:
        wiring.server.stop()


def test_a_stopped_server_sends_nothing_more_to_slack(wired, slack):
    """A details reply's thread or a retry's back-off may outlive `serve`'s server: once it has
    stopped, no Slack call starts (whatever listens at Slack's address by then is not Slack)."""
    wired.server.stop()
    with pytest.raises(ChatUnavailable, match="stopping") as refused:
        wired.chat.call("chat.postMessage", wired.slack.chat_postMessage, channel="C0ALERTS", text="late")
    assert not refused.value.ambiguous
    assert slack.attempts("chat.postMessage") == []
