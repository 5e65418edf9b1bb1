"""After an applied change: follow its rollout (verify) and undo it on request (roll back).

Both read the incident's typed `applied` record: rolling back is offered and allowed only for
an incident that applied a change, and the rollout's outcome is recorded on that change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from bot.app import verdict
from bot.app.approvers import Approvers
from bot.app.cas import IncidentCas, moved
from bot.app.incidents import incident_name
from bot.app.leases import LeaseLost, VerifyLeases
from bot.app.messages import Messages, applied_note, reported
from bot.app.metrics import Metrics
from bot.app.policy import PROPOSALS_ONLY, Policy
from bot.app.ports import ClusterPort, IncidentStore
from bot.app.records import (
    ApplyResult,
    CompletionCheck,
    Incident,
    MemoryReading,
    MessageRef,
    Note,
    NoteKind,
    RolloutOutcome,
    Verification,
)
from bot.app.state import (
    ROLLBACK_FROM,
    IncidentState,
    MemoryTrend,
    Outcome,
    VerificationStep,
    VerifyOutcome,
    can_move,
)
from bot.app.verdict import Diagnoser
from bot.app.workload_ops import ChangeToUndo
from bot.diagnosis.diagnose import diagnose as core_diagnose
from bot.remedy.models import WorkloadRef

log = logging.getLogger(__name__)
S = IncidentState
Step = VerificationStep


class ServingProbe(Protocol):
    """Steps 3 and 4 on a cluster whose pods can be reached (bot.kube.verify.ServingChecks)."""

    def ask(self, workload: WorkloadRef, pod_name: str, timeout_seconds: float,
            diagnose: Diagnoser | None = None) -> CompletionCheck:
        """A real completion request to the pod: latency, tokens; a failure re-diagnosed by `diagnose`."""

    def soak(self, workload: WorkloadRef, pod_name: str, seconds: float, diagnose: Diagnoser) -> Verification:
        """Ready when the pod neither restarted nor crashed for `seconds`, else crashed (diagnosed)."""

    def gpu_memory(self, workload: WorkloadRef, pod_name: str, start: datetime, end: datetime) -> MemoryReading:
        """The pod's GPU memory over [start, end] (start, peak, end, slope; its trend), or why it is absent."""


@dataclass(frozen=True)
class VerifySteps:
    probe: ServingProbe | None = None  # None (a local cluster): verified at Ready + KV-cache line
    request_timeout_seconds: float = 60.0
    soak_seconds: float = 600.0  # the seeds' "keep an eye on it": ten minutes without a restart


class Rollout:
    def __init__(self, cluster: ClusterPort, store: IncidentStore, cas: IncidentCas, approvers: Approvers,
                 messages: Messages, metrics: Metrics, policy: Policy, clock: Callable[[], datetime],
                 steps: VerifySteps | None = None, diagnose: Diagnoser = core_diagnose):
        self.cluster, self.store, self.cas, self.approvers = cluster, store, cas, approvers
        self.messages, self.metrics, self.policy, self.clock = messages, metrics, policy, clock
        self.steps = steps or VerifySteps()
        # The one diagnoser of a new pod that crashes (or fails its request, or its soak): the
        # service's, with the operator's playbooks; passed to the cluster and the probe.
        self.diagnose = diagnose
        self.leases = VerifyLeases(cas, policy, clock)

    def verify(self, name: str, clicked: MessageRef | None = None, resume_from: VerificationStep | None = None
               ) -> Incident | None:
        """Follow the rollout, unless this process or another live replica already does."""
        if not self.leases.begin(name):
            return self.store.get(name)
        try:
            return self._verify(name, clicked, resume_from)
        except LeaseLost:
            log.info("incident %s: another replica is following its rollout", name)
            return self.store.get(name)
        finally:
            self.leases.end(name)

    def _verify(self, name: str, clicked: MessageRef | None = None, resume_from: VerificationStep | None = None
                ) -> Incident | None:
        """Follow the rollout and report each step in the thread as it happens: (1) the new pod
        Ready, (2) vLLM's KV-cache line, (3) a real completion request, (4) a soak window. Only all
        four make the incident `verified`. `resume_from`: the step a restarted bot was in."""
        incident = self.store.get(name)
        if incident is None or incident.proposal is None:
            return None
        rollback = name if incident.applied is not None else None  # a Roll back button only for a change made
        self.leases.step(name, Step.READY)
        try:
            result = self.cluster.verify(incident.proposal.workload, self.policy.verify_timeout_seconds,
                                         self.diagnose)
        except Exception as exc:
            log.exception("verification of %s failed", name)
            incident = self.leases.step(name, None)
            self.messages.reply(incident, clicked, Note(kind=NoteKind.NOT_FOLLOWED, message=str(exc),
                                                        rollback_incident=rollback))
            return incident
        if result.ready:
            return self._after_ready(name, result, clicked, rollback, resume_from)
        if result.crashed:
            incident = self._record(name, result, S.FAILED, f"new pod crashed: {result.message}")
            self.messages.reply(incident, clicked, Note(kind=NoteKind.CRASHED_AGAIN, pod=result.pod,
                                                        message=result.message, diagnosis=result.diagnosis,
                                                        rollback_incident=rollback))
        else:  # the state stays: nothing new to show on the message itself
            incident = self._record(name, result, None, "")
            self.messages.reply(incident, clicked, Note(kind=NoteKind.NOT_CONFIRMED, outcome=result.outcome,
                                                        message=result.message, rollback_incident=rollback))
            return incident
        self.messages.refresh(incident, clicked)
        return incident

    def _after_ready(self, name: str, result: Verification, clicked: MessageRef | None, rollback: str | None,
                     resume_from: VerificationStep | None) -> Incident:
        """Steps 2-4 once the new pod is Ready."""
        incident = self.store.get(name)
        assert incident is not None and incident.proposal is not None, f"incident {name} lost its proposal"
        workload = incident.proposal.workload
        if not result.kv_cache_line:
            incident = self._record(name, result, None, "")
            self.messages.reply(incident, clicked, Note(kind=NoteKind.NO_KV_FIGURES, pod=result.pod,
                                                        state=incident.state, rollback_incident=rollback))
            return incident
        vllm_lines = [line for line in (result.kv_cache_line, result.concurrency_line) if line]
        self.messages.reply(incident, clicked, Note(kind=NoteKind.POD_READY, pod=result.pod, message=result.message,
                                                    lines=vllm_lines))
        probe, pod = self.steps.probe, result.pod or ""
        if probe is not None:
            if resume_from != Step.SOAK:
                failed = self._request(name, probe, workload, pod, clicked, rollback)
                if failed is not None:
                    return failed
            if self.steps.soak_seconds > 0:
                soaked, memory = self._soak(name, probe, workload, pod, clicked, rollback)
                if not soaked.ready:
                    return self._record(name, soaked, S.FAILED, f"crashed in the soak: {soaked.message}")
                if memory is not None and memory.trend is MemoryTrend.CLIMBING:
                    return self._climbing(name, pod, memory, clicked, rollback)
        incident = self._record(name, result, S.VERIFIED, f"verified: {result.message}")
        self.messages.refresh(incident, clicked)
        return incident

    def _request(self, name: str, probe: ServingProbe, workload: WorkloadRef, pod: str,
                 clicked: MessageRef | None, rollback: str | None) -> Incident | None:
        """Step 3; the failed incident, or None when the request succeeded."""
        incident = self.leases.step(name, Step.REQUEST)
        check = probe.ask(workload, pod, self.steps.request_timeout_seconds, self.diagnose)
        if check.ok:
            self.messages.reply(incident, clicked, Note(kind=NoteKind.REQUEST_OK, message=check.message))
            return None
        failed = self._record(name, Verification(outcome=VerifyOutcome.CRASHED, pod=pod, message=check.message), S.FAILED,
            f"completion request failed: {check.message}")
        self.messages.reply(failed, clicked, Note(kind=NoteKind.REQUEST_FAILED, pod=pod, message=check.message,
                                                  diagnosis=check.diagnosis, rollback_incident=rollback))
        self.messages.refresh(failed, clicked)
        return failed

    def _climbing(self, name: str, pod: str, memory: MemoryReading, clicked: MessageRef | None,
                  rollback: str | None) -> Incident:
        """Everything held but the memory trend: running, memory climbing; never verified."""
        climbing = verdict.memory_climbing(pod, memory)
        incident = self._record(name, climbing, S.MEMORY_CLIMBING, f"running, memory climbing: {climbing.message}")
        self.messages.reply(incident, clicked, Note(kind=NoteKind.MEMORY_CLIMBING, pod=pod, message=climbing.message,
                                                    rollback_incident=rollback))
        self.messages.refresh(incident, clicked)
        return incident

    def _soak(self, name: str, probe: ServingProbe, workload: WorkloadRef, pod: str,
              clicked: MessageRef | None, rollback: str | None) -> tuple[Verification, MemoryReading | None]:
        """Step 4: no restart and no crash for the soak window; then the GPU memory over it."""
        incident = self.leases.step(name, Step.SOAK)
        self.messages.reply(incident, clicked, Note(kind=NoteKind.SOAK_STARTED, pod=pod,
                                                    seconds=self.steps.soak_seconds))
        started = self.clock()
        soaked = probe.soak(workload, pod, self.steps.soak_seconds, self.diagnose)
        if not soaked.ready:
            self.messages.reply(incident, clicked, Note(kind=NoteKind.SOAK_FAILED, message=soaked.message,
                                                        diagnosis=soaked.diagnosis, rollback_incident=rollback))
            return soaked, None
        self.messages.reply(incident, clicked, Note(kind=NoteKind.SOAK_OK, message=soaked.message))
        try:
            memory = probe.gpu_memory(workload, pod, started, self.clock())
        except Exception as exc:  # unmeasured is said, and is not a climb
            memory = verdict.memory_unmeasured(str(exc))
        self.messages.reply(incident, clicked, Note(kind=NoteKind.GPU_MEMORY, message=memory.text))
        return soaked, memory

    def resume_interrupted(self, run: Callable[[Callable[[], object]], object]) -> list[str]:
        """Every sweep: renew this process's verify leases; resume (each in `run`, with a thread
        reply saying so) the verifications whose run is gone: a restart, or a replica that died.
        Each is taken over by CAS first, so one replica resumes it. Returns their names."""
        self.leases.renew()
        resumed = []
        for incident in self.store.list(cluster=self.cluster.name, state=S.APPLIED.value):
            if incident.verification_step is None or not self.leases.abandoned(incident):
                continue
            taken = self.leases.take_over(incident.name)
            if taken is None or taken.verification_step is None:
                continue  # another replica took it first
            incident, step = taken, taken.verification_step
            resumed.append(incident.name)
            if step == Step.REPORT:  # killed between the move to applied and its report: report it now
                applied = incident.applied
                digest = incident.proposal.digest if incident.proposal else incident.name
                self.messages.reply_once(incident, applied_note(applied.by if applied else "unknown",
                                                                applied.message if applied else "", digest))
                self.cas.mutate(incident.name, reported)
                step = Step.READY
            else:
                self.messages.reply(incident, None, Note(kind=NoteKind.RESUMED, step=step))
            run(self._resumer(incident.name, step))
        return resumed

    def _resumer(self, name: str, step: VerificationStep) -> Callable[[], object]:
        return lambda: self.verify(name, None, resume_from=step)

    def _record(self, name: str, result: Verification, to: IncidentState | None, note: str) -> Incident:
        """Record the rollout's outcome on the applied change and move to `to`, unless the
        incident has moved on meanwhile (rolled back, re-diagnosed): then the result is stale
        and only reported."""
        def change(inc: Incident) -> Incident | None:
            now = self.clock()
            applied = inc.applied.followed(RolloutOutcome(outcome=VerifyOutcome(result.outcome), pod=result.pod,
                                                          message=result.message, at=now)) \
                if inc.applied is not None else None
            # Every result ends the verification: no step, no lease.
            if to is not None and can_move(inc.state, to):
                return moved(inc, to, now, note, verification_step=None, verify_lease=None, applied=applied)
            if to is not None:
                log.warning("incident %s is %s now: not moving it to %s on a stale rollout result",
                            name, inc.state, to)
            return inc.at_step(None, None).revised(applied=applied)

        incident = self.cas.mutate(name, change)
        assert incident is not None, f"incident {name} vanished"
        return incident

    def roll_back(self, name: str, user: str, clicked: MessageRef | None = None) -> Outcome:
        """Undo exactly the change this incident applied: the change its proposal (id and digest)
        left in the audit record of the workload it names, which must be the incident's own
        workload (bound by the incident's name); scoped and refused like Approve."""
        channel = clicked.channel if clicked else None
        if not self.approvers.is_approver(user):
            return self.messages.refuse(Outcome.NOT_ALLOWED, channel, user,
                                        f"You are not allowed to roll back changes in cluster {self.cluster.name}.")
        incident = self.store.get(name)
        if incident is None or incident.proposal is None or incident.applied is None or \
                incident.state not in ROLLBACK_FROM:
            state = incident.state if incident else "gone"
            return self.messages.refuse(Outcome.NOTHING_TO_ROLL_BACK, channel, user,
                                        f"Nothing to roll back (the incident is {state}).")
        target = incident.proposal.workload
        if not self.approvers.is_approver(user, incident.namespace, channel or incident.chat_channel) or \
                not self.approvers.is_approver(user, target.namespace, channel or incident.chat_channel):
            return self.messages.refuse(Outcome.NOT_ALLOWED, channel, user,
                                        f"You are not allowed to roll back changes in namespace "
                                        f"{target.namespace} from this channel.")
        if incident.proposal.approvals_off or self.policy.proposals_only:
            return self.messages.refuse(Outcome.PROPOSALS_ONLY, channel, user,
                                        f"Nothing was changed: this bot runs in {PROPOSALS_ONLY}")
        if not self._own_workload(incident):
            log.warning("incident %s names %s %s/%s, not its own workload: roll back refused", name, target.kind,
                        target.namespace, target.name)
            return self.messages.refuse(Outcome.WRONG_TARGET, channel, user,
                                        "Nothing was changed: this incident's record names another workload than "
                                        "its own (the incident object was edited).")
        # Claim the rollback by CAS, so a double click rolls back once.
        claimed = self.cas.claim(name, ROLLBACK_FROM, S.ROLLED_BACK, f"rollback by {user}")
        if claimed is None:
            return self.messages.someone_else_first(self.store.get(name), clicked, user)
        assert claimed.proposal is not None
        return self._roll_back_claimed(claimed, user, clicked)

    def _own_workload(self, incident: Incident) -> bool:
        """The proposal's workload is the one the incident is about, by the incident's name (derived
        from cluster, namespace, workload and cause; an edit of those fields does not move it)."""
        assert incident.proposal is not None
        target = incident.proposal.workload
        return (target.namespace, target.name) == (incident.namespace, incident.workload) and \
            incident_name(self.cluster.name, target.namespace, target.name, incident.cause) == incident.name

    def _roll_back_claimed(self, claimed: Incident, user: str, clicked: MessageRef | None) -> Outcome:
        assert claimed.proposal is not None
        name, workload = claimed.name, claimed.proposal.workload
        change = ChangeToUndo(proposal_id=claimed.proposal.id, digest=claimed.proposal.digest, uid=workload.uid)
        try:
            result = self.cluster.rollback(workload.namespace, workload.kind, workload.name,
                                           self.messages.actor(user), change)
        except Exception as exc:
            result = ApplyResult(ok=False, message=f"{type(exc).__name__}: {exc}")
        if result.ok:
            self.metrics.rollbacks.inc()
            self.messages.refresh(claimed, clicked)
            self.messages.reply(claimed, clicked, Note(kind=NoteKind.ROLLED_BACK, actor=user, message=result.message))
            return Outcome.ROLLED_BACK
        incident = self.cas.move(name, S.FAILED, f"rollback failed: {result.message}")
        self.messages.refresh(incident, clicked)
        self.messages.reply(incident, clicked, Note(kind=NoteKind.ROLLBACK_FAILED, message=result.message,
                                                    rollback_incident=name))
        return Outcome.FAILED
