"""An approver's decision on a proposal: approve (apply the patch once), reject, or let it expire.

Approval is single-use because it is a claim: the compare-and-swap proposed -> applying. Only
the click that made that move applies the patch; every other click is told who was first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from bot.app.approvers import Approvers
from bot.app.cas import IncidentCas, moved
from bot.app.errors import ClusterUnavailable
from bot.app.incidents import incident_name
from bot.app.intake import Intake
from bot.app.messages import Messages, applied_note, reported
from bot.app.metrics import Metrics
from bot.app.policy import PROPOSALS_ONLY
from bot.app.ports import ClusterPort, IncidentStore
from bot.app.proposals import Proposer, offers_button, open_state
from bot.app.records import AlertTarget, AppliedChange, ApplyResult, Incident, MessageRef, Note, NoteKind
from bot.app.state import IncidentState, Outcome, VerificationStep
from bot.diagnosis.models import revised
from bot.diagnosis.redact import redact
from bot.remedy import changes as ch

log = logging.getLogger(__name__)
S = IncidentState


class Decisions:
    def __init__(self, cluster: ClusterPort, store: IncidentStore, cas: IncidentCas, approvers: Approvers,
                 messages: Messages, proposer: Proposer, intake: Intake, metrics: Metrics,
                 follow_rollout: Callable[[str, MessageRef | None], None], clock: Callable[[], datetime]):
        self.cluster, self.store, self.cas, self.approvers = cluster, store, cas, approvers
        self.messages, self.proposer, self.intake, self.metrics = messages, proposer, intake, metrics
        self.follow_rollout = follow_rollout  # after a successful apply: verify, maybe later
        self.clock = clock

    def approve(self, name: str, user: str, clicked: MessageRef | None = None, digest: str | None = None
                ) -> Outcome:
        """Returns what happened: applied | failed | conflict | refused | replaced | not_allowed | ...

        `digest`: the digest of the proposal the approver saw (the button carries it); None only
        for callers that show no message (the terminal, the demo): then the current proposal."""
        incident, refusal = self._decidable(name, user, clicked, "approve", digest)
        if incident is None or incident.proposal is None:
            return refusal or Outcome.REFUSED
        # The one step that makes approval single-use: proposed -> applying, by CAS, and only
        # while the proposal is still the one decided on.
        seen = incident.proposal.digest
        claimed = self.cas.claim(name, {S.PROPOSED}, S.APPLYING, f"approved by {user} (proposal {seen[:12]})",
                                 approver=user, digest=seen)
        if claimed is None:
            return self._lost(name, clicked, user, seen)
        self.metrics.approvals.inc()
        self.messages.refresh(claimed, clicked)
        return self.apply_claimed(claimed, user, clicked)

    def apply_claimed(self, claimed: Incident, user: str, clicked: MessageRef | None) -> Outcome:
        """Apply the proposal of an incident this call holds in `applying`, after re-deriving it."""
        name, stored = claimed.name, claimed.proposal
        assert stored is not None
        try:  # an earlier attempt (a lost answer, a killed replica) may have applied it already
            done = self.cluster.was_applied(stored)
        except Exception as exc:
            log.warning("incident %s: cannot tell whether it was applied yet: %s", name, exc)
            return self._unknown(claimed, clicked, f"{type(exc).__name__}: {exc}")
        if done is not None:
            return self._applied(name, user, done, clicked)
        check = self.proposer.recheck(name, stored)
        if check.conflict and check.fresh is not None:
            fields = ch.changed_fields(stored.container_before, check.fresh.container_before)
            result = ApplyResult(ok=False, conflict=True, workload=stored.workload, changed_fields=fields,
                                 message=check.reason)
            return self._conflicted(name, result, clicked)
        if not check.ok:
            return self._refused_to_apply(claimed, check.refused or "re-derivation failed", clicked)
        if self._too_late_to_patch(claimed):
            self.messages.reply(claimed, clicked, Note(kind=NoteKind.TOO_LATE))
            return Outcome.LATE
        result = self._apply(claimed, user)
        if result.ok:
            return self._applied(name, user, result, clicked)
        if result.unknown:
            return self._unknown(claimed, clicked, result.message)
        if result.conflict:
            return self._conflicted(name, result, clicked)
        return self._report_failure(name, clicked, "error", f"patch failed: {result.message}",
                                    Note(kind=NoteKind.PATCH_FAILED, message=result.message), Outcome.FAILED)

    def _unknown(self, incident: Incident, clicked: MessageRef | None, why: str) -> Outcome:
        """Whether the patch landed is unknown: the incident stays `applying`; resume_applying
        (the sweep) reads the workload again and finishes or reports it."""
        self.messages.reply(incident, clicked, Note(kind=NoteKind.ANSWER_LOST, message=why))
        return Outcome.UNKNOWN

    def _too_late_to_patch(self, claimed: Incident) -> bool:
        """Whether a patch started now might still be in flight when the apply grace (from this
        claim) runs out and the sweep takes the incident over: then it is not started; the sweep
        resumes the incident after the grace with a fresh claim (and reads the audit record first)."""
        policy = self.proposer.policy
        if policy.patch_seconds is None or claimed.decided_at is None:
            return False
        late = self.clock() + timedelta(seconds=policy.patch_seconds) >= claimed.decided_at + policy.apply_grace
        if late:
            log.warning("incident %s: not patching, a patch could outlast the apply grace (%gs) since its claim",
                        claimed.name, policy.apply_grace.total_seconds())
        return late

    def resume_applying(self, cluster_name: str, grace: timedelta | None = None) -> list[Outcome]:
        """Sweep step: finish or report incidents left in `applying` (a restart, a lost answer,
        a killed replica) for longer than `grace` (default: Policy.apply_grace). Each is taken over
        by a CAS first, so one replica resumes it; the apply is idempotent (the audit record says
        whether it landed)."""
        grace = self.proposer.policy.apply_grace if grace is None else grace
        outcomes = []
        for incident in self.store.list(cluster=cluster_name, state=S.APPLYING.value):
            if incident.decided_at is None or incident.decided_at > self.clock() - grace:
                continue
            taken = self.cas.claim(incident.name, {S.APPLYING}, S.APPLYING, "resuming the apply after a lost answer",
                                   approver=incident.approver or "unknown",
                                   decided_before=self.clock() - grace)
            if taken is None:
                continue
            try:
                outcomes.append(self.apply_claimed(taken, taken.approver or "unknown", None))
            except Exception:  # one bad incident must not stop the others
                log.exception("resuming the apply of %s failed", incident.name)
        return outcomes

    def _conflicted(self, name: str, result: ApplyResult, clicked: MessageRef | None) -> Outcome:
        self.metrics.patches_failed.labels(Outcome.CONFLICT).inc()
        self._after_conflict(name, result, clicked)
        return Outcome.CONFLICT

    def _refused_to_apply(self, claimed: Incident, why: str, clicked: MessageRef | None) -> Outcome:
        """The stored proposal is not what re-deriving it gives now: nothing is applied."""
        log.warning("incident %s: apply refused: %s", claimed.name, why)
        where = f"{claimed.namespace}/{claimed.workload}"
        return self._report_failure(claimed.name, clicked, Outcome.REFUSED, f"apply refused: {why}",
                                    Note(kind=NoteKind.NOT_APPLIED, message=why, workload=where), Outcome.REFUSED)

    def _report_failure(self, name: str, clicked: MessageRef | None, reason: str, note: str, reply: Note,
                        outcome: Outcome) -> Outcome:
        """Move an incident this call holds out of `applying` to failed, count it under `reason`,
        re-render its message and say why in the thread; "already_decided" if a replica did first."""
        incident = self._finish(name, S.FAILED, note)
        if incident is None:
            return Outcome.ALREADY_DECIDED
        self.metrics.patches_failed.labels(reason).inc()
        self.messages.refresh(incident, clicked)
        self.messages.reply(incident, clicked, reply)
        return outcome

    def _lost(self, name: str, clicked: MessageRef | None, user: str, seen: str) -> Outcome:
        """The claim did not happen: another decision came first, or the proposal was replaced."""
        current = self.store.get(name)
        if current is not None and current.state == S.PROPOSED and current.proposal is not None \
                and current.proposal.digest != seen:
            return self._replaced(clicked, user)
        return self.messages.someone_else_first(current, clicked, user)

    def _replaced(self, clicked: MessageRef | None, user: str) -> Outcome:
        return self.messages.refuse(Outcome.REPLACED, clicked.channel if clicked else None, user,
                                    "Nothing was changed: this proposal was replaced; see the newest message.")

    def _finish(self, name: str, to: IncidentState, note: str, **fields: object) -> Incident | None:
        """Move out of `applying`, unless someone (a replica resuming it) already did: None then."""
        def change(inc: Incident) -> Incident | None:
            return moved(inc, to, self.clock(), note, **fields) if inc.state == S.APPLYING else None

        incident = self.cas.mutate(name, change)
        # The store keeps history redacted: our own line may come back with its secrets masked.
        ours = (note, self.proposer.policy.redactor.text(note))
        return incident if incident is not None and incident.state == to and incident.history[-1:] and \
            incident.history[-1].endswith(ours) else None

    def _apply(self, incident: Incident, user: str) -> ApplyResult:
        assert incident.proposal is not None
        try:
            return self.cluster.apply(incident.proposal, self.messages.actor(user))
        except ClusterUnavailable as exc:  # it may have committed: the sweep reads it back later
            log.warning("apply of %s: the cluster did not answer: %s", incident.name, exc)
            return ApplyResult(ok=False, unknown=True, message=f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a cluster error must not leave the incident stuck in "applying"
            log.exception("apply of %s failed", incident.name)
            return ApplyResult(ok=False, message=f"{type(exc).__name__}: {exc}")

    def _applied(self, name: str, user: str, result: ApplyResult, clicked: MessageRef | None) -> Outcome:
        change = AppliedChange(by=user, at=self.clock(), message=result.message)
        # With the move, the mark "not reported yet": killed before the reply, a restart sends it.
        incident = self._finish(name, S.APPLIED, f"patch applied by {user}: {result.message}", applied=change,
                                verification_step=VerificationStep.REPORT)
        if incident is None:
            return Outcome.ALREADY_DECIDED  # another replica resumed and reported it
        self.metrics.patches_applied.inc()
        self.messages.refresh(incident, clicked)
        assert incident.proposal is not None
        self.messages.reply(incident, clicked, applied_note(user, result.message, incident.proposal.digest))
        self.cas.mutate(name, reported)
        self.follow_rollout(name, clicked)
        return Outcome.APPLIED

    def reject(self, name: str, user: str, clicked: MessageRef | None = None, digest: str | None = None
               ) -> Outcome:
        incident, refusal = self._decidable(name, user, clicked, "reject", digest)
        if incident is None or incident.proposal is None:
            return refusal or Outcome.REFUSED
        seen = incident.proposal.digest
        claimed = self.cas.claim(name, {S.PROPOSED}, S.REJECTED, f"rejected by {user}", approver=user, digest=seen)
        if claimed is None:
            return self._lost(name, clicked, user, seen)
        self.metrics.rejections.inc()
        self.messages.refresh(claimed, clicked)
        return Outcome.REJECTED

    def expire(self, cluster_name: str) -> list[Incident]:
        """Mark proposals whose time-to-live ran out expired."""
        expired = []
        now = self.clock()
        for incident in self.store.list(cluster=cluster_name, state=S.PROPOSED.value):
            if incident.proposal and incident.proposal.expires_at <= now:
                done = self.expire_one(incident.name)
                if done:
                    expired.append(done)
        return expired

    def expire_one(self, name: str) -> Incident | None:
        def mark(inc: Incident) -> Incident | None:
            if inc.state != S.PROPOSED:
                return None
            return moved(inc, S.EXPIRED, self.clock(), "proposal expired unused")

        incident = self.cas.mutate(name, mark)
        if incident is not None and incident.state == S.EXPIRED:
            self.metrics.expired.inc()
            self.messages.refresh(incident)
        return incident

    def _decidable(self, name: str, user: str, clicked: MessageRef | None, verb: str, digest: str | None
                   ) -> tuple[Incident | None, Outcome | None]:
        """The incident if `user` may decide on its proposal now; else (None, refusal reason)."""
        channel = clicked.channel if clicked else None
        refuse = self.messages.refuse
        if not self.approvers.is_approver(user):
            return None, refuse(Outcome.NOT_ALLOWED, channel, user,
                                f"You are not allowed to {verb} changes in cluster {self.cluster.name}. "
                                "Nothing was changed; ask one of the configured approvers.")
        incident = self.store.get(name)
        if incident is None or incident.proposal is None:
            return None, refuse(Outcome.NO_SUCH_PROPOSAL, channel, user, "This proposal no longer exists. Nothing was changed.")
        if clicked is not None and not incident.shown_on(clicked):
            # Another incident's button value on this message (a forged or replayed payload).
            return None, refuse(Outcome.WRONG_MESSAGE, channel, user,
                                "Nothing was changed: this button does not belong to the message it was clicked on.")
        channel = channel or incident.chat_channel
        if not self.approvers.is_approver(user, incident.namespace, channel):
            return None, refuse(Outcome.NOT_ALLOWED, channel, user,
                                f"You are not allowed to {verb} changes in namespace {incident.namespace} "
                                f"from this channel. Nothing was changed; ask one of its approvers.")
        if digest is not None and digest != incident.proposal.digest:
            return None, self._replaced(clicked, user)
        if incident.proposal.approvals_off or self.proposer.policy.proposals_only:
            return None, refuse(Outcome.PROPOSALS_ONLY, channel, user,
                                f"Nothing was changed: this bot runs in {PROPOSALS_ONLY}")
        if incident.state != S.PROPOSED:
            return None, refuse(Outcome.ALREADY_DECIDED, channel, user,
                                Note(kind=NoteKind.ALREADY_DECIDED, state=incident.state, actor=incident.approver))
        if incident.proposal.expires_at <= self.clock():
            self.expire_one(name)
            return None, refuse(Outcome.EXPIRED, channel, user,
                                "This proposal has expired. Nothing was changed. Run "
                                f"`/vllm why {incident.namespace}/{incident.workload}` for a fresh one.")
        return incident, None

    def _after_conflict(self, name: str, result: ApplyResult, clicked: MessageRef | None) -> None:
        """The workload was edited since the proposal: refuse, say what changed, re-diagnose."""
        incident = self.store.get(name)
        assert incident is not None and incident.proposal is not None

        edited = Note(kind=NoteKind.EDITED_NOT_REDIAGNOSED, workload=f"{incident.proposal.workload.kind} "
                      f"{incident.namespace}/{incident.workload}", changed=result.changed_fields,
                      message=result.message)
        changed = ", ".join(result.changed_fields) or "its spec"
        try:
            pod = self.cluster.resolve_pod(incident.namespace, incident.workload)
            evidence = self.cluster.collect(incident.namespace, pod, incident.proposal.workload.container)
            diagnosis = self.proposer.diagnose(evidence)
            workload = self.cluster.workload_for(evidence)
        except Exception as exc:
            self._refused(name, f"apply refused (conflict), re-diagnosis failed: {redact(str(exc))}", clicked,
                          revised(edited, detail=str(exc)))
            return
        if incident_name(self.cluster.name, workload.namespace, workload.name, diagnosis.cause) != name:
            self._refused(name, f"apply refused (conflict); cause is now {diagnosis.cause}", clicked,
                          revised(edited, kind=NoteKind.EDITED_NEW_CAUSE, detail=diagnosis.title))
            self.intake.open_or_update(AlertTarget(namespace=incident.namespace, pod=pod), evidence, None,
                                       diagnosis, workload)
            return
        proposal = self.proposer.propose(diagnosis, evidence, workload)
        incident = self.cas.move(name, open_state(proposal), f"apply refused (conflict: {changed}); re-diagnosed "
                                 "with a new proposal", proposal=proposal, diagnosis=diagnosis, approver=None,
                                 decided_at=None)
        if offers_button(proposal):
            self.metrics.proposals.inc()
        self.messages.refresh(incident, clicked)
        self.messages.reply(incident, clicked, revised(edited, kind=NoteKind.EDITED_REPROPOSED,
                                                                diagnosis=diagnosis))

    def _refused(self, name: str, note: str, clicked: MessageRef | None, reply: Note) -> None:
        """A conflicting apply that cannot be re-proposed on this incident: it failed."""
        incident = self.cas.move(name, S.FAILED, note)
        self.messages.refresh(incident, clicked)
        self.messages.reply(incident, clicked, reply)
