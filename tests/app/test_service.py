"""The use cases, against the ports: a fake cluster, the folder store, and a recording chat."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fakes import FakeCluster, RecordingChat, kv_diagnosis

from bot.app.records import AlertTarget, ApplyResult, Lease, MessageRef, Verification
from bot.app.service import OncallService, Policy
from bot.app.state import IncidentState
from bot.diagnosis.models import DiagnosisResult
from bot.kube.incidents import from_custom_object
from bot.local.store import FolderIncidentStore
from bot.slack.notes import note_text

NS, DEPLOY = "inference", "vllm-llama3-8b"
POD_A, POD_B = "vllm-llama3-8b-7d9f8c6b5-x2k4p", "vllm-llama3-8b-7d9f8c6b5-q9z7w"
APPROVER, STRANGER = "U0APPROVER", "U0STRANGER"


@pytest.fixture
def cluster():
    c = FakeCluster()
    c.add_pod(NS, POD_A, DEPLOY)
    c.add_pod(NS, POD_B, DEPLOY)
    return c


@pytest.fixture
def chat():
    return RecordingChat()


def make_service(cluster, chat, folder, diagnose=kv_diagnosis, **policy) -> OncallService:
    policy.setdefault("approver_users", frozenset({APPROVER}))
    return OncallService(cluster, FolderIncidentStore(folder), chat, Policy(**policy), diagnose=diagnose)


@pytest.fixture
def service(cluster, chat, tmp_path):
    return make_service(cluster, chat, tmp_path)


def alert(pod=POD_A, firing=True):
    return AlertTarget(namespace=NS, pod=pod, container="vllm", firing=firing)


def test_one_incident_per_workload_and_cause(service, chat):
    first = service.handle_alert(alert())
    assert first.state == "proposed" and first.message_id
    service.handle_alert(alert())  # Alertmanager's repeat_interval
    service.handle_alert(alert(POD_B))  # a second pod of the same Deployment
    assert len(chat.posts) == 1
    incident = service.store.get(first.name)
    assert incident.alert_count == 3 and incident.pods == [POD_A, POD_B]
    assert incident.diagnosis.gpu == "NVIDIA-L4, 22 GiB" and incident.diagnosis.node == "gpu-l4-node-3"
    assert [u[0] for u in chat.updates] == [first.name, first.name]  # the same message, updated in place


def test_a_different_cause_is_a_different_incident(cluster, chat, tmp_path):
    causes = iter(["kv-cache-max-model-len", "shm-too-small"])
    svc = make_service(cluster, chat, tmp_path,
                       diagnose=lambda ev: kv_diagnosis().model_copy(update={"cause": next(causes)}))
    # (a second pod: the same pod's same crash again is a repeat, not diagnosed again)
    a, b = svc.handle_alert(alert()), svc.handle_alert(alert(POD_B))
    assert a.name != b.name and len(chat.posts) == 2


def test_resolved_alert_marks_the_message_resolved(service, chat):
    incident = service.handle_alert(alert())
    resolved = service.handle_alert(alert(firing=False))
    assert resolved.state == "resolved"
    assert chat.updates[-1][:2] == (incident.name, "resolved")
    again = service.handle_alert(alert())  # crash-looping again: same message, reopened
    assert again.state == "proposed" and len(chat.posts) == 1


def test_approve_applies_once_and_reports_the_rollout(service, chat, cluster):
    incident = service.handle_alert(alert())
    assert service.approve(incident.name, APPROVER) == "applied"
    assert service.approve(incident.name, APPROVER) == "already_decided"  # double click
    assert len(cluster.applied) == 1
    stored = service.store.get(incident.name)
    assert stored.state == "verified" and stored.approver == APPROVER
    assert "applying" in [u[1] for u in chat.updates] and chat.updates[-1][1] == "verified"
    texts = [note_text(n) for _, n in chat.replies]
    assert any("Applied by <@U0APPROVER>" in t for t in texts)
    assert any("GPU KV cache size: 18,432 tokens" in t for t in texts)


def test_concurrent_approvals_apply_exactly_once(cluster, chat, tmp_path):
    """Two approvers on two replicas (two services over the same store) click together."""
    replicas = [make_service(cluster, chat, tmp_path, approver_users=frozenset({"U1", "U2"}), replica=r)
                for r in ("a", "b")]
    incident = replicas[0].handle_alert(alert())
    outcomes: list[str] = []
    threads = [threading.Thread(target=lambda s=s, u=u: outcomes.append(s.approve(incident.name, u)))
               for s, u in zip(replicas * 4, ["U1", "U2"] * 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("applied") == 1 and len(cluster.applied) == 1


def test_not_allowed_user_changes_nothing(service, chat, cluster):
    incident = service.handle_alert(alert())
    assert service.approve(incident.name, STRANGER, MessageRef(channel="C0ALERTS", message_id="1.0001")) == "not_allowed"
    assert service.reject(incident.name, STRANGER, MessageRef(channel="C0ALERTS", message_id="1.0001")) == "not_allowed"
    assert cluster.applied == [] and service.store.get(incident.name).state == "proposed"
    assert chat.told and chat.told[0][0] == STRANGER and "not allowed" in chat.told[0][1]


def test_user_group_approver(cluster, chat, tmp_path):
    chat.groups["S0ONCALL"] = {"U0GROUPIE"}
    svc = make_service(cluster, chat, tmp_path, approver_users=frozenset(), approver_groups=frozenset({"S0ONCALL"}))
    incident = svc.handle_alert(alert())
    assert svc.approve(incident.name, STRANGER) == "not_allowed"
    assert svc.approve(incident.name, "U0GROUPIE") == "applied"


def test_expired_proposal_is_refused(cluster, chat, tmp_path):
    svc = make_service(cluster, chat, tmp_path, proposal_ttl=timedelta(seconds=-1))
    incident = svc.handle_alert(alert())
    assert svc.approve(incident.name, APPROVER) == "expired"
    assert cluster.applied == [] and svc.store.get(incident.name).state == "expired"
    assert "expired" in chat.told[-1][1]


def test_sweep_expires_old_proposals(cluster, chat, tmp_path):
    svc = make_service(cluster, chat, tmp_path, proposal_ttl=timedelta(seconds=-1))
    incident = svc.handle_alert(alert())
    svc.sweep()
    assert svc.store.get(incident.name).state == "expired" and chat.updates[-1][1] == "expired"


def test_reject_records_who(service, chat, cluster):
    incident = service.handle_alert(alert())
    assert service.reject(incident.name, APPROVER) == "rejected"
    stored = service.store.get(incident.name)
    assert stored.state == "rejected" and stored.approver == APPROVER and cluster.applied == []
    assert service.approve(incident.name, APPROVER) == "already_decided"


def test_conflict_refuses_and_re_diagnoses(cluster, chat, tmp_path):
    cluster.apply_results = [ApplyResult(ok=False, conflict=True, message="resourceVersion 100 is now 101",
                                         changed_fields=["spec.template.spec.containers[vllm].args"])]
    # diagnosed: 18432; re-derived at Approve: still 18432, so the patch is sent and the cluster
    # answers "edited since"; re-diagnosed after the conflict: 16384; re-derived at the next Approve: 16384.
    values = iter(["18432", "18432", "16384", "16384"])
    svc = make_service(cluster, chat, tmp_path, diagnose=lambda ev: kv_diagnosis(max_model_len=next(values)))
    incident = svc.handle_alert(alert())
    assert svc.approve(incident.name, APPROVER) == "conflict"
    stored = svc.store.get(incident.name)
    assert stored.state == "proposed" and stored.proposal.changes[0].after == "16384"
    assert "edited since the proposal" in note_text(chat.replies[-1][1])
    assert "containers[vllm].args" in note_text(chat.replies[-1][1])
    assert svc.approve(incident.name, APPROVER) == "applied"  # the new proposal works


def test_crash_after_apply_offers_rollback_once(service, chat, cluster):
    cluster.verification = Verification(outcome="crashed", pod="new-pod", message="CrashLoopBackOff again",
                                        diagnosis=kv_diagnosis())
    incident = service.handle_alert(alert())
    service.approve(incident.name, APPROVER)
    assert service.store.get(incident.name).state == "failed"
    assert chat.replies[-1][1].rollback_incident == incident.name
    assert service.roll_back(incident.name, STRANGER) == "not_allowed"
    assert service.roll_back(incident.name, APPROVER) == "rolled-back"
    assert service.roll_back(incident.name, APPROVER) == "nothing_to_roll_back"
    assert len(cluster.rolled_back) == 1


def test_failed_patch_keeps_nothing_stuck(service, chat, cluster):
    cluster.apply_results = [ApplyResult(ok=False, message="deployments.apps is forbidden: cannot patch")]
    incident = service.handle_alert(alert())
    assert service.approve(incident.name, APPROVER) == "failed"
    assert service.store.get(incident.name).state == "failed"
    assert service.roll_back(incident.name, APPROVER) == "nothing_to_roll_back"


def test_slack_outage_loses_nothing_and_posts_once(service, chat):
    chat.down = True
    incident = service.handle_alert(alert())
    assert incident.message_id is None and chat.posts == []
    service.handle_alert(alert())  # still down: still kept
    chat.down = False
    service.sweep()
    service.sweep()
    assert len(chat.posts) == 1
    assert service.store.get(incident.name).message_id is not None


def test_two_replicas_post_once(cluster, chat, tmp_path):
    """HA Alertmanagers deliver the same alert to two bot replicas at once."""
    replicas = [make_service(cluster, chat, tmp_path, replica=r) for r in ("a", "b", "c")]
    threads = [threading.Thread(target=r.handle_alert, args=(alert(),)) for r in replicas * 3]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for r in replicas:
        r.sweep()
    assert len(chat.posts) == 1
    assert replicas[0].store.list()[0].alert_count == 9


def test_restart_between_post_and_click(cluster, chat, tmp_path):
    before = make_service(cluster, chat, tmp_path)
    incident = before.handle_alert(alert())
    after = make_service(cluster, RecordingChat(), tmp_path)  # a new process: nothing in memory
    assert after.approve(incident.name, APPROVER) == "applied"


def test_gitops_workload_gets_no_button(cluster, chat, tmp_path):
    cluster.blocked = "managed by Argo CD (self-heal would revert a live patch)"
    svc = make_service(cluster, chat, tmp_path)
    incident = svc.handle_alert(alert())
    assert incident.state == "diagnosed"
    assert svc.approve(incident.name, APPROVER) == "already_decided" and cluster.applied == []


def test_unknown_cause_gets_no_button(cluster, chat, tmp_path):
    svc = make_service(cluster, chat, tmp_path, diagnose=lambda ev: DiagnosisResult(
        cause=None, title="No known cause", explanation="nothing matched"))
    incident = svc.handle_alert(alert())
    assert incident.state == "diagnosed" and incident.proposal is None and len(chat.posts) == 1


def test_why_unknown_pod_lists_close_matches(service, chat):
    assert service.answer_why("inference/vllm-llama3-8", "C0HERE", "U0ASKER") is None
    user, text = chat.told[-1]
    assert user == "U0ASKER" and DEPLOY in text


def test_why_deployment_posts_in_the_asking_channel(service, chat):
    incident = service.answer_why(f"{NS}/{DEPLOY}", "C0HERE", "U0ASKER")
    assert incident.state == "proposed" and chat.posts == [(incident.name, "C0HERE")]
    service.handle_alert(alert())  # the alert for the same incident then updates, never re-posts
    assert len(chat.posts) == 1


def test_why_after_rejection_offers_a_fresh_proposal_only_to_an_approver(service, chat):
    incident = service.handle_alert(alert())
    service.reject(incident.name, APPROVER)
    # issue 17: someone who may not approve cannot revive the rejected proposal
    shown = service.answer_why(f"{NS}/{POD_A}", "C0HERE", "U0ASKER")
    assert shown.state == "rejected" and service.store.get(incident.name).state == "rejected"
    assert chat.told[-1][0] == "U0ASKER" and "only an approver" in chat.told[-1][1]
    again = service.answer_why(f"{NS}/{POD_A}", "C0HERE", APPROVER)
    assert again.name == incident.name and again.state == "proposed"
    assert chat.posts[-1] == (incident.name, "C0HERE")
    assert service.approve(incident.name, APPROVER) == "applied"


def test_alert_for_a_vanished_pod_is_skipped(service, chat):
    assert service.handle_alert(AlertTarget(namespace=NS, pod="gone-pod")) is None
    assert chat.posts == []


class InterferingStore(FolderIncidentStore):
    """A repeat alert's counter update lands between the click's read and its CAS."""

    interfere = False

    def update(self, incident):
        if self.interfere and incident.state == "applying":
            self.interfere = False
            current = self.get(incident.name)
            super().update(current.model_copy(update={"alert_count": current.alert_count + 1}))
        return super().update(incident)


def test_an_unrelated_write_does_not_refuse_the_click(cluster, chat, tmp_path):
    store = InterferingStore(tmp_path)
    svc = OncallService(cluster, store, chat, Policy(approver_users=frozenset({APPROVER})), diagnose=kv_diagnosis)
    incident = svc.handle_alert(alert())
    store.interfere = True
    assert svc.approve(incident.name, APPROVER) == "applied"
    assert store.get(incident.name).alert_count == 2 and len(cluster.applied) == 1


def test_why_on_an_open_incident_shows_the_same_proposal_and_a_click_updates_both(service, chat):
    incident = service.handle_alert(alert())
    service.answer_why(f"{NS}/{POD_A}", "C0HERE", "U0ASKER")
    assert chat.posts == [(incident.name, "C0ALERTS"), (incident.name, "C0HERE")]
    copy = MessageRef(channel="C0HERE", message_id="2.0001")
    assert service.approve(incident.name, APPROVER, copy) == "applied"
    assert {u[2].channel for u in chat.updates if u[1] == "applied"} == {"C0ALERTS", "C0HERE"}
    assert all(thread == copy for thread, _ in chat.replies)  # the thread of the message clicked


def test_collect_errors_are_counted_not_raised(service, cluster):
    def forbidden(*args, **kwargs):
        raise PermissionError("pods/log is forbidden for the bot's service account")

    cluster.collect = forbidden
    assert service.handle_alert(alert()) is None
    assert service.metrics.alerts_skipped.labels("collect_failed")._value.get() == 1


def test_crashing_again_after_resolved_with_an_expired_proposal_gets_a_fresh_one(cluster, chat, tmp_path):
    svc = make_service(cluster, chat, tmp_path, proposal_ttl=timedelta(seconds=-1))
    incident = svc.handle_alert(alert())
    svc.handle_alert(alert(firing=False))
    svc.policy.proposal_ttl = timedelta(hours=1)  # the operator raised the TTL meanwhile
    again = svc.handle_alert(alert())
    assert again.state == "proposed" and again.proposal.expires_at > incident.proposal.expires_at
    assert len(chat.posts) == 1 and "Crash-looping again" in note_text(chat.replies[-1][1])


# ---- typed state, post lease and applied change ---------------------------------------------

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "incidents"
T0 = datetime(2026, 11, 30, 5, 0, tzinfo=UTC)


def test_a_post_lease_keeps_other_posters_out_until_it_runs_out(cluster, chat, tmp_path):
    now = [T0]
    svc = OncallService(cluster, FolderIncidentStore(tmp_path), chat, Policy(approver_users=frozenset({APPROVER})),
                        diagnose=kv_diagnosis, clock=lambda: now[0])
    chat.down = True
    incident = svc.handle_alert(alert())
    stored = svc.store.get(incident.name)
    assert stored.message_id is None and stored.post_lease is None  # the failed post released it
    # Another replica takes the lease, then dies before posting.
    svc.store.update(stored.model_copy(update={"post_lease": Lease(holder="replica-b/0000",
                                                                        until=T0 + timedelta(seconds=60))}))
    chat.down = False
    svc.sweep()
    assert chat.posts == []
    now[0] = T0 + timedelta(seconds=61)
    svc.sweep()
    assert chat.posts == [(incident.name, "C0ALERTS")]
    posted = svc.store.get(incident.name)
    assert posted.message_id == "1.0001" and posted.post_lease is None


def test_approve_records_the_applied_change_and_its_rollout(service, cluster):
    incident = service.handle_alert(alert())
    assert incident.applied is None
    service.approve(incident.name, APPROVER)
    applied = service.store.get(incident.name).applied
    assert applied.by == APPROVER and applied.message == "Deployment inference/x patched (generation 4)"
    assert applied.rollout.outcome == "ready" and applied.rollout.pod == "new-pod"


def test_an_unconfirmed_rollout_keeps_the_state_and_offers_rollback(service, chat, cluster):
    cluster.verification = Verification(outcome="timeout", message="no new pod Ready after 900 s")
    incident = service.handle_alert(alert())
    service.approve(incident.name, APPROVER)
    stored = service.store.get(incident.name)
    assert stored.state == "applied" and stored.applied.rollout.outcome == "timeout"
    assert chat.replies[-1][1].rollback_incident == incident.name
    assert service.roll_back(incident.name, APPROVER) == "rolled-back" and len(cluster.rolled_back) == 1


def test_rollback_needs_an_applied_change_not_words_in_the_history(service, chat, cluster):
    cluster.apply_results = [ApplyResult(ok=False, message="deployments.apps is forbidden: cannot patch")]
    cluster.verification = Verification(outcome="timeout", message="no new pod yet")
    incident = service.handle_alert(alert())
    assert service.approve(incident.name, APPROVER) == "failed"
    stored = service.store.get(incident.name)
    service.store.update(stored.model_copy(update={
        "history": stored.history + ["2026-11-30T05:00:00Z patch-applied by U0APPROVER: it says so here"]}))
    assert service.roll_back(incident.name, APPROVER) == "nothing_to_roll_back" and cluster.rolled_back == []
    service.verify(incident.name)  # nothing was applied: the rollout reply offers no Roll back
    assert chat.replies[-1][1].rollback_incident is None


def test_a_late_rollout_result_does_not_undo_a_rollback(cluster, chat, tmp_path):
    later: list = []
    svc = OncallService(cluster, FolderIncidentStore(tmp_path), chat, Policy(approver_users=frozenset({APPROVER})),
                        diagnose=kv_diagnosis, run_later=later.append)
    cluster.verification = Verification(outcome="crashed", pod="new-pod", message="CrashLoopBackOff again")
    incident = svc.handle_alert(alert())
    svc.approve(incident.name, APPROVER)
    svc.verify(incident.name)  # crashed: failed, with a Roll back button
    assert svc.roll_back(incident.name, APPROVER) == "rolled-back"
    cluster.verification = Verification(outcome="ready", pod="new-pod", message="Ready")
    later[0]()  # the follow-up queued by approve runs only now
    assert svc.store.get(incident.name).state == "rolled-back"
    assert "is Ready" in note_text(chat.replies[-1][1])  # still reported in the thread


def test_a_resolved_alert_leaves_an_incident_mid_apply_alone(service):
    incident = service.handle_alert(alert())
    stored = service.store.get(incident.name)
    service.store.update(stored.model_copy(update={"state": IncidentState.APPLYING}))
    assert service.handle_alert(alert(firing=False)) is None
    assert service.store.get(incident.name).state == "applying"


def test_why_shows_a_legacy_approved_incident_as_it_is(service, chat):
    incident = service.handle_alert(alert())
    stored = service.store.get(incident.name)
    service.store.update(stored.model_copy(update={"state": IncidentState.APPROVED}))
    assert service.answer_why(f"{NS}/{POD_A}", "C0HERE", "U0ASKER").state == "approved"
    assert chat.posts == [(incident.name, "C0ALERTS"), (incident.name, "C0HERE")]
    assert service.store.get(incident.name).state == "approved"


def test_a_record_written_before_the_typed_fields_loads_and_can_be_approved(chat, tmp_path):
    """The demo's incident as the previous version stored it: lease and posting only in history."""
    old = FIXTURES / "proposed-before-typed-fields.json"
    record = json.loads(old.read_text())
    assert "post_lease" not in record and "applied" not in record
    (tmp_path / f"{record['name']}.json").write_text(old.read_text())
    store = FolderIncidentStore(tmp_path)
    loaded = store.get(record["name"])
    assert loaded.state == "proposed" and loaded.post_lease is None and loaded.applied is None
    spec = {"record": json.dumps({k: v for k, v in record.items() if k not in ("name", "version")})}
    assert from_custom_object({"metadata": {"name": record["name"]}, "spec": spec}).model_dump(
        exclude={"version"}) == loaded.model_dump(exclude={"version"})
    cluster = FakeCluster(name=record["cluster"])
    # Approve re-derives the proposal from the live pod: this cluster is still as the record was derived from
    cluster.add_pod(loaded.namespace, loaded.pods[0], loaded.workload)
    cluster.propose = lambda diagnosis, evidence, workload: loaded.proposal
    svc = OncallService(cluster, store, chat, Policy(approver_users=frozenset({APPROVER})), diagnose=kv_diagnosis,
                        clock=lambda: loaded.first_seen + timedelta(minutes=5))
    assert svc.approve(loaded.name, APPROVER) == "applied"
    assert store.get(loaded.name).applied.by == APPROVER and len(cluster.applied) == 1


def test_proposals_only_mode_shows_the_change_and_never_applies_it(cluster, chat, tmp_path):
    svc = make_service(cluster, chat, tmp_path, proposals_only=True)
    incident = svc.handle_alert(alert())
    # The exact change is computed and shown, but the incident offers no decision.
    assert incident.proposal is not None and incident.proposal.changes
    assert incident.state == "diagnosed" and "proposals-only mode" in (incident.proposal.approvals_off or "")
    assert len(chat.posts) == 1
    # A click forged or left over from an earlier approve-mode message is refused: nothing applied.
    assert svc.approve(incident.name, APPROVER) == "proposals_only"
    assert cluster.applied == [] and svc.store.get(incident.name).state == "diagnosed"
    assert any("proposals-only mode" in text for _, text in chat.told)


def test_switching_to_proposals_only_refuses_clicks_on_older_proposals(cluster, chat, tmp_path):
    incident = make_service(cluster, chat, tmp_path).handle_alert(alert())
    assert incident.state == "proposed"
    restarted = make_service(cluster, chat, tmp_path, proposals_only=True)
    assert restarted.approve(incident.name, APPROVER) == "proposals_only" and cluster.applied == []
