"""After an applied change: follow its rollout (verify) and undo it on request (roll back).

Both read the incident's typed `applied` record: rolling back is offered and allowed only for
an incident that applied a change, and the rollout's outcome is recorded on that change.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from bot.app.approvers import Approvers
from bot.app.cas import IncidentCas, moved
from bot.app.messages import Messages
from bot.app.metrics import Metrics
from bot.app.policy import Policy
from bot.app.ports import ClusterPort, IncidentStore
from bot.app.records import ApplyResult, Incident, MessageRef, Note, RolloutOutcome, Verification
from bot.app.state import ROLLBACK_FROM, IncidentState, can_move

log = logging.getLogger(__name__)
S = IncidentState


class Rollout:
    def __init__(self, cluster: ClusterPort, store: IncidentStore, cas: IncidentCas, approvers: Approvers,
                 messages: Messages, metrics: Metrics, policy: Policy, clock: Callable[[], datetime]):
        self.cluster, self.store, self.cas, self.approvers = cluster, store, cas, approvers
        self.messages, self.metrics, self.policy, self.clock = messages, metrics, policy, clock

    def verify(self, name: str, clicked: MessageRef | None = None) -> Incident | None:
        """Follow the rollout and report it in the thread."""
        incident = self.store.get(name)
        if incident is None or incident.proposal is None:
            return None
        rollback = name if incident.applied is not None else None  # a Roll back button only for a change made
        try:
            result = self.cluster.verify(incident.proposal.workload, self.policy.verify_timeout_seconds)
        except Exception as exc:
            log.exception("verification of %s failed", name)
            self.messages.reply(incident, clicked, Note(text=f"Could not follow the rollout: {exc}",
                                                        rollback_incident=rollback))
            return incident
        if result.outcome == "ready":
            incident = self._record(name, result, S.VERIFIED, f"verified: {result.message}")
            lines = [f":white_check_mark: New pod {result.pod or ''} is Ready. {result.message}".rstrip()]
            lines += [f"vLLM: {line}" for line in (result.kv_cache_line, result.concurrency_line) if line]
            self.messages.reply(incident, clicked, Note(text="\n".join(lines)))
        elif result.outcome == "crashed":
            incident = self._record(name, result, S.FAILED, f"new pod crashed: {result.message}")
            self.messages.reply(incident, clicked, Note(text=f":x: The new pod {result.pod or ''} crashed again: "
                                                             f"{result.message}", diagnosis=result.diagnosis,
                                                        rollback_incident=rollback))
        else:  # the state stays: nothing new to show on the message itself
            incident = self._record(name, result, None, "")
            self.messages.reply(incident, clicked, Note(text=f":hourglass: Rollout not confirmed ({result.outcome}): "
                                                             f"{result.message}", rollback_incident=rollback))
            return incident
        self.messages.refresh(incident, clicked)
        return incident

    def _record(self, name: str, result: Verification, to: IncidentState | None, note: str) -> Incident:
        """Record the rollout's outcome on the applied change and move to `to`, unless the
        incident has moved on meanwhile (rolled back, re-diagnosed): then the result is stale
        and only reported."""
        def change(inc: Incident) -> Incident | None:
            now = self.clock()
            fields = {}
            if inc.applied is not None:
                outcome = RolloutOutcome(outcome=result.outcome, pod=result.pod, message=result.message, at=now)
                fields["applied"] = inc.applied.model_copy(update={"rollout": outcome})
            if to is not None and can_move(inc.state, to):
                return moved(inc, to, now, note, **fields)
            if to is not None:
                log.warning("incident %s is %s now: not moving it to %s on a stale rollout result",
                            name, inc.state, to)
            return inc.model_copy(update=fields) if fields else None

        incident = self.cas.mutate(name, change)
        assert incident is not None, f"incident {name} vanished"
        return incident

    def roll_back(self, name: str, user: str, clicked: MessageRef | None = None) -> str:
        channel = clicked.channel if clicked else None
        if not self.approvers.is_approver(user):
            return self.messages.refuse("not_allowed", channel, user,
                                        f"You are not allowed to roll back changes in cluster {self.cluster.name}.")
        incident = self.store.get(name)
        if incident is None or incident.proposal is None or incident.applied is None or \
                incident.state not in ROLLBACK_FROM:
            state = incident.state if incident else "gone"
            return self.messages.refuse("nothing_to_roll_back", channel, user,
                                        f"Nothing to roll back (the incident is {state}).")
        # Claim the rollback by CAS, so a double click rolls back once.
        claimed = self.cas.claim(name, ROLLBACK_FROM, S.ROLLED_BACK, f"rollback by {user}")
        if claimed is None:
            return self.messages.someone_else_first(self.store.get(name), clicked, user)
        assert claimed.proposal is not None
        workload = claimed.proposal.workload
        try:
            result = self.cluster.rollback(workload.namespace, workload.kind, workload.name,
                                           self.messages.actor(user))
        except Exception as exc:
            result = ApplyResult(ok=False, message=f"{type(exc).__name__}: {exc}")
        if result.ok:
            self.metrics.rollbacks.inc()
            self.messages.refresh(claimed, clicked)
            self.messages.reply(claimed, clicked, Note(text=f":leftwards_arrow_with_hook: Rolled back by <@{user}>: "
                                                            f"{result.message}"))
            return "rolled-back"
        incident = self.cas.move(name, S.FAILED, f"rollback failed: {result.message}")
        self.messages.refresh(incident, clicked)
        self.messages.reply(incident, clicked, Note(text=f":x: Rollback failed: {result.message}",
                                                    rollback_incident=name))
        return "failed"
