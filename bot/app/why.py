"""`/vllm why POD|NS/POD|DEPLOYMENT`: diagnose on request and post it where it was asked, with
the same buttons an alert would get. An incident with a live proposal (or a change being
applied) is shown as it is; any other is re-diagnosed and gets a fresh proposal, but only when
the caller may approve in its namespace (re-diagnosing changes its state): anyone else is shown
it as it is."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from bot.app import evidence_cache
from bot.app.approvers import Approvers
from bot.app.cas import IncidentCas, moved
from bot.app.incidents import incident_name
from bot.app.intake import Intake
from bot.app.metrics import Metrics
from bot.app.policy import Policy
from bot.app.ports import ChatPort, ChatUnavailable, ClusterPort, IncidentStore, PodNotFound
from bot.app.posting import Poster, with_links
from bot.app.proposals import Proposer, offers_button, open_state
from bot.app.records import AlertTarget, Incident, MessageRef, Note, NoteKind
from bot.app.state import IncidentState, can_move
from bot.diagnosis.models import DiagnosisResult, Evidence
from bot.remedy.models import WorkloadRef

log = logging.getLogger(__name__)


MAX_COPIES = 10  # messages re-rendered per incident (the oldest drop off; their clicks are refused)
# The states an applied change ends in when its rollout was followed and did not fail.
FIX_HELD = frozenset({IncidentState.VERIFIED, IncidentState.MEMORY_CLIMBING})


def with_copy(incident: Incident, message: MessageRef | None) -> list[MessageRef]:
    copies = [c for c in incident.copies if c != message]
    return (copies + [message])[-MAX_COPIES:] if message is not None else copies


def fix_followed(incident: Incident) -> bool:
    """Its change was applied and the rollout followed to an end that is not a failure."""
    return incident.applied is not None and incident.applied.rollout is not None and incident.state in FIX_HELD


class Why:
    def __init__(self, cluster: ClusterPort, store: IncidentStore, chat: ChatPort, cas: IncidentCas,
                 intake: Intake, proposer: Proposer, poster: Poster, metrics: Metrics, policy: Policy,
                 clock: Callable[[], datetime], approvers: Approvers | None = None):
        self.cluster, self.store, self.chat, self.cas = cluster, store, chat, cas
        self.approvers = approvers or Approvers(policy, chat)
        self.intake, self.proposer, self.poster = intake, proposer, poster
        self.metrics, self.policy, self.clock = metrics, policy, clock

    def answer_why(self, query: str, channel: str, user: str) -> Incident | None:
        """`why POD`, `why NS/POD` or `why DEPLOYMENT`: post the diagnosis in `channel` with
        the same buttons an alert would get."""
        namespace, _, name = query.strip().rpartition("/")
        namespace = namespace or self.policy.default_namespace
        if not self._may_ask(namespace, channel, user):
            self._tell(channel, user, f"/vllm why for namespace {namespace} answers only in the channel "
                                               "its incidents are posted to, or to its approvers. Nothing was posted.")
            return None
        try:
            pod = self.cluster.resolve_pod(namespace, name)
            evidence = self.cluster.collect(namespace, pod)
        except PodNotFound as exc:
            close = f" Did you mean: {', '.join(exc.close_matches[:8])}?" if exc.close_matches else ""
            self._tell(channel, user, f"No pod, Deployment or StatefulSet named {namespace}/{name} "
                                               f"in cluster {self.cluster.name}.{close}")
            return None
        except Exception as exc:  # a 403 names the missing permission: worth showing as is
            log.exception("/vllm why %s failed", query)
            self._tell(channel, user, f"Could not read {namespace}/{name} in cluster "
                                               f"{self.cluster.name}: {exc}")
            return None
        workload = self.cluster.workload_for(evidence)
        evidence, kept_note = self._kept_if_log_gone(evidence, workload)
        diagnosis = self.proposer.diagnose(evidence)
        key = incident_name(self.cluster.name, workload.namespace, workload.name, diagnosis.cause)
        existing = self.store.get(key)
        posted: MessageRef | None = None
        if existing is None:
            answer = self.intake.open_or_update(AlertTarget(namespace=namespace, pod=pod), evidence, channel,
                                                diagnosis, workload)
        elif self._show_as_is(existing) or not self._may_reopen(existing, workload, user, channel) \
                or self._fix_in_place(existing, diagnosis, evidence, workload):
            # Asked about the old pod after the fix landed: the incident as it is, and what its
            # verification found, with a link to its thread; never the same change suggested again.
            answer, posted = self._show(existing, channel)
            if fix_followed(existing):
                self._say(posted, self._applied_note(existing))
        else:
            answer = self._rediagnose(key, pod, diagnosis, evidence, workload, channel, user)
        if kept_note and answer is not None:
            self._say(posted or answer.message_ref(), kept_note)
        return answer

    def _show(self, existing: Incident, channel: str) -> tuple[Incident, MessageRef | None]:
        """Same incident, same proposal: show it here too; a click on either message acts once."""
        if not self.poster.messages.shown_as_sealed(existing):
            return existing, None  # edited outside the bot: not shown as the bot's own words
        try:
            posted = self.chat.post_incident(with_links(existing, self.policy.links, self.policy.redactor), channel)
        except ChatUnavailable as exc:
            log.warning("could not answer /vllm why in %s: %s", channel, exc)
            return existing, None
        # a copy of the message: refreshed with it, and its buttons act on the same proposal
        answer = self.cas.mutate(existing.name, lambda inc: inc.with_copies(with_copy(inc, posted))) or existing
        return answer, posted

    def _fix_in_place(self, existing: Incident, diagnosis: DiagnosisResult, evidence: Evidence,
                      workload: WorkloadRef) -> bool:
        """This incident's change was applied and its rollout followed to an end that is not a
        failure, and the live workload needs no change for this cause any more."""
        if not fix_followed(existing):
            return False
        fresh = self.proposer.propose(diagnosis, evidence, workload)
        return fresh is None or not fresh.changes

    def _applied_note(self, incident: Incident) -> Note:
        applied = incident.applied
        assert applied is not None and applied.rollout is not None
        ref, link = incident.message_ref(), None
        if ref is not None:
            try:
                link = self.chat.permalink(ref)
            except ChatUnavailable as exc:  # the answer stands without its link
                log.warning("no link to incident %s's thread: %s", incident.name, exc)
        changes = [f"{c.name} {c.before if c.before is not None else '(unset)'} → "
                   f"{c.after if c.after is not None else '(removed)'}"
                   for c in (incident.proposal.changes if incident.proposal else [])]
        return Note(kind=NoteKind.FIX_APPLIED, actor=applied.by, at=applied.at, state=incident.state,
                    outcome=applied.rollout.outcome, message=applied.rollout.message, lines=changes, detail=link)

    def _tell(self, channel: str, user: str, why: str) -> None:
        self.chat.tell_user(channel, user, Note(kind=NoteKind.REFUSAL, message=why))

    def _may_ask(self, namespace: str, channel: str, user: str) -> bool:
        """VLLM_ONCALL_WHY_SCOPE=channel: only in the alert channel, or by an approver of `namespace`."""
        if self.policy.why_scope == "open" or channel == self.policy.alert_channel:
            return True
        return self.approvers.is_approver(user, namespace, channel)

    def _may_reopen(self, incident: Incident, workload: WorkloadRef, user: str, channel: str) -> bool:
        """Re-diagnosing moves an incident (a verified one back to proposed, a rejected proposal
        revived with Approve/Reject): only someone who may approve in its namespace may do that.
        Anyone else is shown the incident as it is, and told so. The namespace is the live
        workload's, not the incident object's (which the cluster's users can edit)."""
        if self.approvers.is_approver(user, workload.namespace, channel):
            return True
        self._tell(channel, user, f"Incident {incident.name} is {incident.state.value}; only an approver of "
                                  f"namespace {workload.namespace} can re-diagnose it with /vllm why. "
                                  "It is shown as it is.")
        return False

    def _kept_if_log_gone(self, evidence: Evidence, workload: WorkloadRef) -> tuple[Evidence, Note | None]:
        """The evidence kept with the workload's latest incident when the previous log is gone
        (the container restarted since), with a line saying when it was collected."""
        if not evidence_cache.previous_log_gone(evidence):
            return evidence, None
        kept = [inc.evidence for inc in self.store.list(cluster=self.cluster.name, namespace=workload.namespace)
                if inc.workload == workload.name and inc.evidence is not None]
        if not kept:
            return evidence, None
        latest = max(kept, key=lambda e: e.collected_at)
        note = Note(kind=NoteKind.EVIDENCE_KEPT, at=latest.collected_at,
                    detail=evidence_cache.age(latest, self.clock()))
        return evidence_cache.restore(latest), note

    def _say(self, where: MessageRef | None, note: Note) -> None:
        if where is None:
            return
        try:
            self.chat.reply(where, note)
        except ChatUnavailable as exc:
            log.warning("could not say where the evidence came from: %s", exc)

    def _show_as_is(self, incident: Incident) -> bool:
        """A live proposal, or a change in flight (or a state the table lets nothing re-open)."""
        live = (incident.state == IncidentState.PROPOSED and incident.proposal is not None
                and incident.proposal.expires_at > self.clock())
        return live or incident.state == IncidentState.APPLYING or not can_move(incident.state,
                                                                                IncidentState.PROPOSED)

    def _rediagnose(self, key: str, pod: str, diagnosis: DiagnosisResult, evidence: Evidence,
                    workload: WorkloadRef, channel: str, user: str) -> Incident | None:
        """A fresh proposal on the existing incident, posted as a new message in `channel`."""
        proposal = self.proposer.propose(diagnosis, evidence, workload)
        new = self.poster.new_post(key)  # a new message: a new identity (the old one's is in copies)

        def refresh(inc: Incident) -> Incident:
            now = self.clock()
            return moved(inc, open_state(proposal), now, f"re-diagnosed on /vllm why by {user} (was {inc.state})",
                         proposal=proposal, diagnosis=diagnosis, approver=None, decided_at=None, last_seen=now,
                         pods=inc.pods + ([pod] if pod not in inc.pods else []),
                         copies=with_copy(inc, inc.message_ref()),  # the old message is re-rendered too
                         chat_channel=channel, message_id=None,  # the new message becomes the incident's
                         post_lease=new.lease, post_key=new.key, post_since=new.since)

        if self.cas.mutate(key, refresh) is None:
            return None
        if offers_button(proposal):
            self.metrics.proposals.inc()
        return self.poster.ensure_posted(key, lease=new.lease)
