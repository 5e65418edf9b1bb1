"""Orchestration: one method per use case (alert, why, approve, reject, roll back, expire).

Talks only to three ports: ClusterPort (evidence, proposals, patches), IncidentStore (state that
survives restarts and is shared by replicas) and ChatPort (Slack, or the terminal). Every
decision that must happen once goes through a compare-and-swap on the incident, never through
process memory, so a double click, two approvers, two replicas or a restart in between cannot
apply a change twice or post an incident twice.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Callable

from bot.app.incidents import incident_name
from bot.app.metrics import Metrics
from bot.app.ports import (ChatPort, ChatUnavailable, ClusterPort, IncidentConflict, IncidentExists, IncidentStore,
                           PodNotFound)
from bot.app.records import AlertTarget, ApplyResult, Incident, MessageRef, Note
from bot.diagnosis.diagnose import diagnose as default_diagnose
from bot.diagnosis.evidence import gpu_summary, node_view, pod_view
from bot.diagnosis.models import DiagnosisResult, Evidence
from bot.remedy.models import Proposal, WorkloadRef

log = logging.getLogger(__name__)

POST_LEASE = timedelta(seconds=60)  # how long one replica may hold the right to post an incident
HISTORY_LIMIT = 60  # entries kept on the incident object (bounded object size)
ROLLBACK_FROM = ("applied", "verified", "failed")  # states whose change can be rolled back
POD_LIMIT = 20  # pod names kept per incident: crash-looping pods get replaced over days


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def iso(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- the service --------------------------------------------------------------------------


@dataclass
class Policy:
    approver_users: frozenset[str] = frozenset()
    approver_groups: frozenset[str] = frozenset()
    proposal_ttl: timedelta = timedelta(hours=1)
    verify_timeout_seconds: float = 900
    default_namespace: str = "default"
    replica: str = field(default_factory=socket.gethostname)
    group_cache_seconds: float = 60


class OncallService:
    def __init__(self, cluster: ClusterPort, store: IncidentStore, chat: ChatPort, policy: Policy | None = None,
                 metrics: Metrics | None = None,
                 diagnose: Callable[[Evidence], DiagnosisResult] = default_diagnose,
                 run_later: Callable[[Callable[[], None]], object] | None = None,
                 clock: Callable[[], datetime] = utcnow):
        self.cluster, self.store, self.chat = cluster, store, chat
        self.policy = policy or Policy()
        self.metrics = metrics or Metrics()
        self.diagnose = diagnose
        # Slow follow-ups (rollout verification) go here; inline when no executor is given.
        self.run_later = run_later or (lambda fn: fn())
        self.clock = clock
        self._group_cache: dict[str, tuple[float, set[str]]] = {}
        self._group_lock = threading.Lock()

    # ---- alerts ------------------------------------------------------------------------

    def handle_alert(self, target: AlertTarget) -> Incident | None:
        """A firing alert opens or updates the incident of (workload, cause); a resolved one
        marks it resolved. Returns the incident, or None when there is nothing to act on."""
        self.metrics.alerts_received.labels("firing" if target.firing else "resolved").inc()
        if not target.firing:
            return self._resolve(target)
        try:
            evidence = self.cluster.collect(target.namespace, target.pod, target.container)
        except PodNotFound as exc:
            log.warning("alert for a pod that is gone: %s", exc)
            self.metrics.alerts_skipped.labels("pod_not_found").inc()
            return None
        except Exception:
            # e.g. a 403 (the bot's RBAC) or the API still failing after retries: say so, count
            # it; Alertmanager's next repeat tries again.
            log.exception("could not collect evidence for %s/%s", target.namespace, target.pod)
            self.metrics.alerts_skipped.labels("collect_failed").inc()
            return None
        return self._open_or_update(target, evidence, channel=None)

    def _open_or_update(self, target: AlertTarget, evidence: Evidence, channel: str | None,
                        diagnosis: DiagnosisResult | None = None, workload: WorkloadRef | None = None
                        ) -> Incident | None:
        diagnosis = diagnosis or self._diagnose(evidence)
        workload = workload or self.cluster.workload_for(evidence)
        name = incident_name(self.cluster.name, workload.namespace, workload.name, diagnosis.cause)
        if self.store.get(name) is None:
            lease = self._new_lease()
            incident = self._new_incident(name, target, evidence, diagnosis, workload, channel, lease)
            try:
                created = self.store.create(incident)
            except IncidentExists:
                pass  # another alert or replica got there first: fold this one into it
            else:
                self.metrics.diagnoses.labels(diagnosis.cause or "unknown").inc()
                if created.state == "proposed":
                    self.metrics.proposals.inc()
                log.info("incident %s created (%s)", name, diagnosis.cause or "no known cause")
                return self._ensure_posted(name, received_at=target.received_at, lease=lease)
        return self._record_repeat(name, target.pod, diagnosis, evidence, workload)

    def _new_incident(self, name: str, target: AlertTarget, evidence: Evidence, diagnosis: DiagnosisResult,
                      workload: WorkloadRef, channel: str | None, lease: str) -> Incident:
        now = self.clock()
        proposal = self._propose(diagnosis, evidence, workload)
        return Incident(
            name=name, cluster=self.cluster.name, namespace=workload.namespace, workload=workload.name,
            cause=diagnosis.cause, state="proposed" if _offers_button(proposal) else "diagnosed",
            pods=[target.pod], restarts=diagnosis.restarts, first_seen=now, last_seen=now,
            slack_channel=channel, proposal=proposal, diagnosis=diagnosis,
            # The creator holds the post lease, so no other replica posts it meanwhile.
            history=[f"{iso(now)} created from pod {target.pod}", self._lease_entry(now, lease)],
        )

    def _propose(self, diagnosis: DiagnosisResult, evidence: Evidence, workload: WorkloadRef) -> Proposal | None:
        if not diagnosis.cause or not diagnosis.changes:
            return None
        proposal = self.cluster.propose(diagnosis, evidence, workload)
        if proposal is None:
            return None
        # The configured time-to-live wins over whatever the cluster side suggested.
        created = self.clock()
        return proposal.model_copy(update={"created_at": created, "expires_at": created + self.policy.proposal_ttl})

    def _diagnose(self, evidence: Evidence) -> DiagnosisResult:
        """The core's diagnosis, with the header facts (node, GPU, restarts) filled from the
        evidence where the core left them empty."""
        diagnosis = self.diagnose(evidence)
        pod, node = pod_view(evidence), node_view(evidence)
        return diagnosis.model_copy(update={
            "namespace": diagnosis.namespace or pod.namespace or None,
            "pod": diagnosis.pod or pod.name or None,
            "container": diagnosis.container or (pod.container.name if pod.container else None),
            "node": diagnosis.node or pod.node_name or node.name,
            "gpu": diagnosis.gpu or gpu_summary(node),
            "restarts": diagnosis.restarts if diagnosis.restarts is not None else (
                pod.container.restart_count if pod.container else None),
        })

    def _record_repeat(self, name: str, pod: str, diagnosis: DiagnosisResult, evidence: Evidence,
                       workload: WorkloadRef) -> Incident | None:
        self.metrics.repeats.inc()
        reopened = False
        current = self.store.get(name)
        fresh: Proposal | None = None
        if current is not None and current.state == "resolved" and not (
                current.proposal and current.proposal.expires_at > self.clock()):
            fresh = self._propose(diagnosis, evidence, workload)  # crashing again, the old proposal is stale

        def fold(incident: Incident) -> Incident:
            nonlocal reopened
            now = self.clock()
            update: dict = {"last_seen": now, "alert_count": incident.alert_count + 1,
                            "pods": (incident.pods + ([pod] if pod not in incident.pods else []))[-POD_LIMIT:],
                            "restarts": max(incident.restarts or 0, diagnosis.restarts or 0)}
            reopened = incident.state == "resolved"
            if reopened:
                proposal = incident.proposal
                if not (proposal and proposal.expires_at > now):
                    proposal = fresh
                update["proposal"] = proposal
                update["diagnosis"] = diagnosis if proposal is fresh else incident.diagnosis
                update["state"] = "proposed" if _offers_button(proposal) else "diagnosed"
                update["approver"], update["decided_at"] = None, None
                update["history"] = _bounded(incident.history + [f"{iso(now)} firing again (pod {pod})"])
            return incident.model_copy(update=update)

        incident = self._mutate(name, fold)
        if incident is None:
            return None
        if not incident.slack_ts:
            return self._ensure_posted(name)  # a post that failed earlier: try again now
        self._refresh(incident)
        if reopened:
            self._reply(incident, None, Note(text=f"Crash-looping again (pod {pod}) after being resolved."))
        return incident

    def _resolve(self, target: AlertTarget) -> Incident | None:
        """Alertmanager says the pod stopped crash-looping: mark its incidents resolved."""
        resolved = None
        for incident in self.store.list(cluster=self.cluster.name, namespace=target.namespace):
            if target.pod not in incident.pods or incident.state in ("resolved", "applying", "approved"):
                continue

            def mark(inc: Incident) -> Incident | None:
                if inc.state in ("resolved", "applying", "approved"):
                    return None
                now = self.clock()
                return inc.model_copy(update={"state": "resolved", "last_seen": now, "history": _bounded(
                    inc.history + [f"{iso(now)} resolved (alert for pod {target.pod} resolved; was {inc.state})"])})

            updated = self._mutate(incident.name, mark)
            if updated is not None and updated.state == "resolved":
                resolved = updated
                if updated.slack_ts:
                    self._refresh(updated)
        if resolved is None:
            self.metrics.alerts_skipped.labels("resolved_without_incident").inc()
        return resolved

    # ---- posting: exactly once, and eventually ---------------------------------------------

    def _new_lease(self) -> str:
        """A lease token per posting attempt (not per replica: threads of one replica race too)."""
        return f"{self.policy.replica}/{uuid.uuid4().hex[:8]}"

    def _lease_entry(self, now: datetime, lease: str) -> str:
        return f"{iso(now)} post-lease {lease} until {iso(now + POST_LEASE)}"

    def _lease_holder(self, incident: Incident) -> str | None:
        """The posting attempt currently allowed to post this incident, if its lease is still running."""
        for entry in reversed(incident.history):
            parts = entry.split()
            if len(parts) >= 2 and parts[1] == "post-lease":
                if parts[2] == "released":
                    return None
                until = datetime.fromisoformat(parts[4].replace("Z", "+00:00"))
                return parts[2] if until > self.clock() else None
        return None

    def _ensure_posted(self, name: str, received_at: float | None = None, lease: str | None = None
                       ) -> Incident | None:
        """Post the incident unless it is posted or someone else holds the post lease."""
        incident = self.store.get(name)
        if incident is None or incident.slack_ts:
            return incident
        holder = self._lease_holder(incident)
        if holder and holder != lease:
            return incident  # another thread or replica is posting it right now
        if holder is None:
            lease = self._new_lease()
            try:
                incident = self.store.update(incident.model_copy(update={
                    "history": _bounded(incident.history + [self._lease_entry(self.clock(), lease)])}))
            except IncidentConflict:
                return self.store.get(name)  # someone else moved first; they (or the sweeper) post it
        try:
            message = self.chat.post_incident(incident, incident.slack_channel)
        except ChatUnavailable as exc:
            log.warning("could not post incident %s, will retry: %s", name, exc)
            # A channel that refuses the bot (e.g. `/vllm why` typed where it is not a member)
            # never will accept it: fall back to the alert channel instead of retrying forever.
            fallback = {"slack_channel": None} if exc.channel_refused and incident.slack_channel else {}
            reason = str(exc)[:120]
            self._mutate(name, lambda inc: inc.model_copy(update={**fallback, "history": _bounded(
                inc.history + [f"{iso(self.clock())} post failed: {reason}"
                               + ("; using the alert channel" if fallback else ""),
                               f"{iso(self.clock())} post-lease released"])}))
            return self._ensure_posted(name, received_at) if fallback else self.store.get(name)
        if received_at is not None:
            self.metrics.alert_to_post.observe(time.monotonic() - received_at)
        self.metrics.incidents_posted.inc()
        posted = self._mutate(name, lambda inc: inc.model_copy(update={
            "slack_channel": message.channel, "slack_ts": message.ts,
            "history": _bounded(inc.history + [f"{iso(self.clock())} posted to {message.channel}"])}))
        if posted is not None and (posted.alert_count, posted.pods) != (incident.alert_count, incident.pods):
            self._refresh(posted)  # repeats arrived while posting: show their counters
        return posted

    def sweep(self) -> None:
        """Periodic: post incidents whose post failed (Slack was down), expire old proposals."""
        for incident in self.store.list(cluster=self.cluster.name, posted="false"):
            try:
                self._ensure_posted(incident.name)
            except Exception:  # one bad incident must not stop the others
                log.exception("retrying the post of %s failed", incident.name)
        self.expire()

    def expire(self) -> list[Incident]:
        expired = []
        now = self.clock()
        for incident in self.store.list(cluster=self.cluster.name, state="proposed"):
            if incident.proposal and incident.proposal.expires_at <= now:
                done = self._expire_one(incident.name)
                if done:
                    expired.append(done)
        return expired

    def _expire_one(self, name: str) -> Incident | None:
        def mark(inc: Incident) -> Incident | None:
            if inc.state != "proposed":
                return None
            return inc.model_copy(update={"state": "expired", "history": _bounded(
                inc.history + [f"{iso(self.clock())} proposal expired unused"])})

        incident = self._mutate(name, mark)
        if incident is not None and incident.state == "expired":
            self.metrics.expired.inc()
            self._refresh(incident)
        return incident

    # ---- /vllm why ---------------------------------------------------------------------

    def answer_why(self, query: str, channel: str, user: str) -> Incident | None:
        """`why POD`, `why NS/POD` or `why DEPLOYMENT`: post the diagnosis in `channel` with
        the same buttons an alert would get."""
        namespace, _, name = query.strip().rpartition("/")
        namespace = namespace or self.policy.default_namespace
        try:
            pod = self.cluster.resolve_pod(namespace, name)
            evidence = self.cluster.collect(namespace, pod)
        except PodNotFound as exc:
            close = f" Did you mean: {', '.join(exc.close_matches[:8])}?" if exc.close_matches else ""
            self.chat.tell_user(channel, user, f"No pod, Deployment or StatefulSet named {namespace}/{name} "
                                               f"in cluster {self.cluster.name}.{close}")
            return None
        except Exception as exc:  # a 403 names the missing permission: worth showing as is
            log.exception("/vllm why %s failed", query)
            self.chat.tell_user(channel, user, f"Could not read {namespace}/{name} in cluster "
                                               f"{self.cluster.name}: {exc}")
            return None
        diagnosis = self._diagnose(evidence)
        workload = self.cluster.workload_for(evidence)
        key = incident_name(self.cluster.name, workload.namespace, workload.name, diagnosis.cause)
        existing = self.store.get(key)
        target = AlertTarget(namespace=namespace, pod=pod)
        if existing is None:
            return self._open_or_update(target, evidence, channel, diagnosis, workload)
        live = (existing.state == "proposed" and existing.proposal is not None
                and existing.proposal.expires_at > self.clock())
        if live or existing.state in ("applying", "approved"):
            # Same incident, same proposal: show it here too; a click on either message acts once.
            try:
                self.chat.post_incident(existing, channel)
            except ChatUnavailable as exc:
                log.warning("could not answer /vllm why in %s: %s", channel, exc)
            return existing
        proposal = self._propose(diagnosis, evidence, workload)

        lease = self._new_lease()

        def refresh(inc: Incident) -> Incident:
            now = self.clock()
            return inc.model_copy(update={
                "state": "proposed" if _offers_button(proposal) else "diagnosed", "proposal": proposal,
                "diagnosis": diagnosis, "approver": None, "decided_at": None, "last_seen": now,
                "pods": inc.pods + ([pod] if pod not in inc.pods else []),
                "slack_channel": channel, "slack_ts": None,  # the new message becomes the incident's
                "history": _bounded(inc.history + [f"{iso(now)} re-diagnosed on /vllm why by {user} "
                                                   f"(was {inc.state})", self._lease_entry(now, lease)])})

        if self._mutate(key, refresh) is None:
            return None
        if _offers_button(proposal):
            self.metrics.proposals.inc()
        return self._ensure_posted(key, lease=lease)

    # ---- approval ----------------------------------------------------------------------

    def is_approver(self, user: str) -> bool:
        if user in self.policy.approver_users:
            return True
        for group in self.policy.approver_groups:
            if user in self._members(group):
                return True
        return False

    def _members(self, group: str) -> set[str]:
        with self._group_lock:
            cached = self._group_cache.get(group)
            if cached and time.monotonic() - cached[0] < self.policy.group_cache_seconds:
                return cached[1]
        try:
            members = self.chat.group_members(group)
        except ChatUnavailable:
            log.warning("cannot read members of user group %s: refusing approval (fail closed)", group)
            return set()
        with self._group_lock:
            self._group_cache[group] = (time.monotonic(), members)
        return members

    def _actor(self, user: str) -> str:
        """Who, for the audit annotation and Event on the workload: a name and the Slack id."""
        try:
            name = self.chat.user_name(user)
        except ChatUnavailable:
            name = None
        return f"{name} (slack:{user})" if name else f"slack:{user}"

    def _refuse(self, reason: str, channel: str | None, user: str, text: str) -> str:
        self.metrics.refused_clicks.labels(reason).inc()
        if channel:
            try:
                self.chat.tell_user(channel, user, text)
            except ChatUnavailable:
                log.warning("could not tell %s: %s", user, text)
        return reason

    def _decidable(self, name: str, user: str, clicked: MessageRef | None, verb: str
                   ) -> tuple[Incident | None, str | None]:
        """The incident if `user` may decide on its proposal now; else (None, refusal reason)."""
        channel = clicked.channel if clicked else None
        if not self.is_approver(user):
            return None, self._refuse("not_allowed", channel, user,
                                      f"You are not allowed to {verb} changes in cluster {self.cluster.name}. "
                                      "Nothing was changed; ask one of the configured approvers.")
        incident = self.store.get(name)
        if incident is None or incident.proposal is None:
            return None, self._refuse("unknown", channel, user, "This proposal no longer exists. Nothing was changed.")
        channel = channel or incident.slack_channel
        if incident.state != "proposed":
            by = f" by <@{incident.approver}>" if incident.approver else ""
            return None, self._refuse("already_decided", channel, user,
                                      f"This proposal is already {incident.state}{by}. Nothing was changed.")
        if incident.proposal.expires_at <= self.clock():
            self._expire_one(name)
            return None, self._refuse("expired", channel, user,
                                      "This proposal has expired. Nothing was changed. Run "
                                      f"`/vllm why {incident.namespace}/{incident.workload}` for a fresh one.")
        return incident, None

    def approve(self, name: str, user: str, clicked: MessageRef | None = None) -> str:
        """Returns what happened: applied | failed | conflict | not_allowed | expired | ..."""
        incident, refusal = self._decidable(name, user, clicked, "approve")
        if incident is None:
            return refusal or "refused"
        # The one step that makes approval single-use: proposed -> applying, by CAS.
        claimed = self._claim(name, ("proposed",), lambda inc, now: {
            "state": "applying", "approver": user, "decided_at": now,
            "history": _bounded(inc.history + [f"{iso(now)} approved by {user}"])})
        if claimed is None:
            return self._someone_else_first(name, clicked, user)
        incident = claimed
        self.metrics.approvals.inc()
        self._refresh(incident, clicked)
        assert incident.proposal is not None
        try:
            result = self.cluster.apply(incident.proposal, self._actor(user))
        except Exception as exc:  # a cluster error must not leave the incident stuck in "applying"
            log.exception("apply of %s failed", name)
            result = ApplyResult(ok=False, message=f"{type(exc).__name__}: {exc}")
        if result.ok:
            self.metrics.patches_applied.inc()
            incident = self._transition(name, "applied", f"patch-applied by {user}: {result.message}")
            self._refresh(incident, clicked)
            self._reply(incident, clicked, Note(text=f":white_check_mark: Applied by <@{user}>. {result.message}\n"
                                                     "Following the rollout…"))
            self.run_later(lambda: self.verify(name, clicked))
            return "applied"
        if result.conflict:
            self.metrics.patches_failed.labels("conflict").inc()
            self._after_conflict(name, result, clicked)
            return "conflict"
        self.metrics.patches_failed.labels("error").inc()
        incident = self._transition(name, "failed", f"patch failed: {result.message}")
        self._refresh(incident, clicked)
        self._reply(incident, clicked, Note(text=f":x: The patch failed, nothing was changed: {result.message}"))
        return "failed"

    def _after_conflict(self, name: str, result: ApplyResult, clicked: MessageRef | None) -> None:
        """The workload was edited since the proposal: refuse, say what changed, re-diagnose."""
        incident = self.store.get(name)
        assert incident is not None and incident.proposal is not None
        changed = ", ".join(result.changed_fields) or "its spec"
        refusal = (f":warning: Not applied: {incident.proposal.workload.kind} {incident.namespace}/"
                   f"{incident.workload} was edited since the proposal ({changed}). {result.message}")
        try:
            pod = self.cluster.resolve_pod(incident.namespace, incident.workload)
            evidence = self.cluster.collect(incident.namespace, pod, incident.proposal.workload.container)
            diagnosis = self._diagnose(evidence)
            workload = self.cluster.workload_for(evidence)
        except Exception as exc:
            incident = self._transition(name, "failed", f"apply refused (conflict), re-diagnosis failed: {exc}")
            self._refresh(incident, clicked)
            self._reply(incident, clicked, Note(text=f"{refusal}\nCould not re-diagnose: {exc}"))
            return
        new_name = incident_name(self.cluster.name, workload.namespace, workload.name, diagnosis.cause)
        if new_name != name:
            incident = self._transition(name, "failed", f"apply refused (conflict); cause is now {diagnosis.cause}")
            self._refresh(incident, clicked)
            self._reply(incident, clicked, Note(text=f"{refusal}\nRe-diagnosed: the cause is now "
                                                     f"{diagnosis.title}; posted as a new incident."))
            self._open_or_update(AlertTarget(namespace=incident.namespace, pod=pod), evidence, None,
                                 diagnosis, workload)
            return
        proposal = self._propose(diagnosis, evidence, workload)

        def reopen(inc: Incident) -> Incident:
            now = self.clock()
            return inc.model_copy(update={
                "state": "proposed" if _offers_button(proposal) else "diagnosed", "proposal": proposal,
                "diagnosis": diagnosis, "approver": None, "decided_at": None,
                "history": _bounded(inc.history + [f"{iso(now)} apply refused (conflict: {changed}); "
                                                   "re-diagnosed with a new proposal"])})

        incident = self._mutate(name, reopen)
        assert incident is not None
        if _offers_button(proposal):
            self.metrics.proposals.inc()
        self._refresh(incident, clicked)
        self._reply(incident, clicked, Note(text=f"{refusal}\nRe-diagnosed against the current spec: the message "
                                                 "above now shows the new proposal.", diagnosis=diagnosis))

    def verify(self, name: str, clicked: MessageRef | None = None) -> Incident | None:
        """Follow the rollout and report it in the thread."""
        incident = self.store.get(name)
        if incident is None or incident.proposal is None:
            return None
        try:
            result = self.cluster.verify(incident.proposal.workload, self.policy.verify_timeout_seconds)
        except Exception as exc:
            log.exception("verification of %s failed", name)
            self._reply(incident, clicked, Note(text=f"Could not follow the rollout: {exc}", rollback_incident=name))
            return incident
        if result.outcome == "ready":
            incident = self._transition(name, "verified", f"verified: {result.message}")
            lines = [f":white_check_mark: New pod {result.pod or ''} is Ready. {result.message}".rstrip()]
            lines += [f"vLLM: {line}" for line in (result.kv_cache_line, result.concurrency_line) if line]
            self._reply(incident, clicked, Note(text="\n".join(lines)))
        elif result.outcome == "crashed":
            incident = self._transition(name, "failed", f"new pod crashed: {result.message}")
            self._reply(incident, clicked, Note(text=f":x: The new pod {result.pod or ''} crashed again: "
                                                     f"{result.message}", diagnosis=result.diagnosis,
                                                rollback_incident=name))
        else:  # state stays "applied": nothing new to show on the message itself
            self._reply(incident, clicked, Note(text=f":hourglass: Rollout not confirmed ({result.outcome}): "
                                                     f"{result.message}", rollback_incident=name))
            return incident
        self._refresh(incident, clicked)
        return incident

    def reject(self, name: str, user: str, clicked: MessageRef | None = None) -> str:
        incident, refusal = self._decidable(name, user, clicked, "reject")
        if incident is None:
            return refusal or "refused"
        claimed = self._claim(name, ("proposed",), lambda inc, now: {
            "state": "rejected", "approver": user, "decided_at": now,
            "history": _bounded(inc.history + [f"{iso(now)} rejected by {user}"])})
        if claimed is None:
            return self._someone_else_first(name, clicked, user)
        incident = claimed
        self.metrics.rejections.inc()
        self._refresh(incident, clicked)
        return "rejected"

    def roll_back(self, name: str, user: str, clicked: MessageRef | None = None) -> str:
        channel = clicked.channel if clicked else None
        if not self.is_approver(user):
            return self._refuse("not_allowed", channel, user,
                                f"You are not allowed to roll back changes in cluster {self.cluster.name}.")
        incident = self.store.get(name)
        if incident is None or incident.proposal is None or not _was_applied(incident) or \
                incident.state not in ROLLBACK_FROM:
            state = incident.state if incident else "gone"
            return self._refuse("nothing_to_roll_back", channel, user,
                                f"Nothing to roll back (the incident is {state}).")
        # Claim the rollback by CAS, so a double click rolls back once.
        claimed = self._claim(name, ROLLBACK_FROM, lambda inc, now: {
            "state": "rolled-back", "history": _bounded(inc.history + [f"{iso(now)} rollback by {user}"])})
        if claimed is None:
            return self._someone_else_first(name, clicked, user)
        incident = claimed
        assert incident.proposal is not None
        workload = incident.proposal.workload
        try:
            result = self.cluster.rollback(workload.namespace, workload.kind, workload.name, self._actor(user))
        except Exception as exc:
            result = ApplyResult(ok=False, message=f"{type(exc).__name__}: {exc}")
        if result.ok:
            self.metrics.rollbacks.inc()
            self._refresh(incident, clicked)
            self._reply(incident, clicked, Note(text=f":leftwards_arrow_with_hook: Rolled back by <@{user}>: "
                                                     f"{result.message}"))
            return "rolled-back"
        incident = self._transition(name, "failed", f"rollback failed: {result.message}")
        self._refresh(incident, clicked)
        self._reply(incident, clicked, Note(text=f":x: Rollback failed: {result.message}", rollback_incident=name))
        return "failed"

    # ---- helpers -----------------------------------------------------------------------

    def _mutate(self, name: str, change: Callable[[Incident], Incident | None], attempts: int = 8
                ) -> Incident | None:
        """Read-modify-write with compare-and-swap; `change` returning None means: leave it."""
        for _ in range(attempts):
            incident = self.store.get(name)
            if incident is None:
                return None
            updated = change(incident)
            if updated is None:
                return incident
            try:
                return self.store.update(updated)
            except IncidentConflict:
                continue
        raise IncidentConflict(f"{name}: gave up after {attempts} lost races")

    def _claim(self, name: str, from_states: tuple[str, ...], update: Callable[[Incident, datetime], dict],
               attempts: int = 8) -> Incident | None:
        """Move the incident out of `from_states` by CAS. Returns it if this call made the move,
        None if it was no longer in those states. A lost race against an unrelated write (a
        repeat alert's counters) is retried; a lost race against another decision is not."""
        for _ in range(attempts):
            incident = self.store.get(name)
            if incident is None or incident.state not in from_states:
                return None
            try:
                return self.store.update(incident.model_copy(update=update(incident, self.clock())))
            except IncidentConflict:
                continue
        return None

    def _someone_else_first(self, name: str, clicked: MessageRef | None, user: str) -> str:
        current = self.store.get(name)
        state = current.state if current else "gone"
        by = f" by <@{current.approver}>" if current and current.approver else ""
        return self._refuse("already_decided", clicked.channel if clicked else None, user,
                            f"Someone else acted on this first (it is now {state}{by}). Nothing was changed.")

    def _transition(self, name: str, state: str, note: str) -> Incident:
        incident = self._mutate(name, lambda inc: inc.model_copy(update={
            "state": state, "history": _bounded(inc.history + [f"{iso(self.clock())} {note}"])}))
        assert incident is not None
        return incident

    def _refresh(self, incident: Incident, clicked: MessageRef | None = None) -> None:
        """Re-render the incident's message, and the clicked copy if it is a different one."""
        targets = []
        if incident.slack_ts and incident.slack_channel:
            targets.append(MessageRef(channel=incident.slack_channel, ts=incident.slack_ts))
        if clicked and clicked not in targets:
            targets.append(clicked)
        for message in targets:
            try:
                self.chat.update_incident(incident, message)
            except ChatUnavailable as exc:
                log.warning("could not update the message of %s: %s", incident.name, exc)

    def _reply(self, incident: Incident, clicked: MessageRef | None, note: Note) -> None:
        thread = clicked or (MessageRef(channel=incident.slack_channel, ts=incident.slack_ts)
                             if incident.slack_ts and incident.slack_channel else None)
        if thread is None:
            log.info("incident %s has no message yet; not replying: %s", incident.name, note.text)
            return
        try:
            self.chat.reply(thread, note)
        except ChatUnavailable as exc:
            log.warning("could not reply in the thread of %s: %s", incident.name, exc)


def _offers_button(proposal: Proposal | None) -> bool:
    """A live patch can be approved: there is one, nothing blocks it, and its dry run passed."""
    return (proposal is not None and not proposal.workload.live_patch_blocked and proposal.dry_run_ok is not False
            and bool(proposal.json_patch or proposal.changes))


def _was_applied(incident: Incident) -> bool:
    return any(" patch-applied by " in entry for entry in incident.history)


def _bounded(history: list[str]) -> list[str]:
    return history[-HISTORY_LIMIT:]
