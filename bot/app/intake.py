"""Alerts in: a firing alert opens the incident of (workload, cause) or folds into it, a
resolved one marks it resolved.

The incident's name is derived from its key, so creating it is the dedup step: whoever creates
it first posts it (holding the post lease); every later alert only updates its counters.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from datetime import datetime
from typing import Any

from bot.app import evidence_cache
from bot.app.cas import IncidentCas, iso, moved
from bot.app.incidents import incident_name
from bot.app.messages import Messages
from bot.app.metrics import Metrics
from bot.app.ports import ClusterPort, IncidentExists, IncidentStore, PodNotFound
from bot.app.posting import NewPost, Poster
from bot.app.proposals import Proposer, open_state
from bot.app.records import AlertTarget, Incident, Note, NoteKind
from bot.app.state import IncidentState, can_move, check_opening
from bot.diagnosis.evidence import pick_container
from bot.diagnosis.models import DiagnosisResult, Evidence
from bot.remedy.models import Proposal, WorkloadRef

log = logging.getLogger(__name__)

POD_LIMIT = 20  # pod names kept per incident: crash-looping pods get replaced over days
REMEMBERED = 4096  # pods and incident names this process remembers (bounded: an LRU)
# Incidents this process remembers as it last wrote them, so a repeat writes its count without
# reading first. Fewer: each may carry up to 112 KB of kept evidence.
LATEST = 128


def crash_mark(pod: dict[str, Any], container: str | None) -> Hashable:
    """What tells the container's last crash from the next one: the pod's uid, the container's
    restart count and its last termination. The same mark again is the same crash: Alertmanager
    repeating itself, or an HA pair's second copy."""
    chosen = pick_container(pod, container) or {}
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    status = next((s for s in statuses if s.get("name") == chosen.get("name")), None) or {}
    last = (status.get("lastState") or {}).get("terminated") or {}
    return ((pod.get("metadata") or {}).get("uid"), chosen.get("name"), status.get("restartCount"),
            last.get("containerID"), last.get("finishedAt"), last.get("exitCode"))


class Remembered:
    """A bounded, thread-safe map (least recently used first out)."""

    def __init__(self, size: int = REMEMBERED):
        self.size = size
        self._items: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        with self._lock:
            if key not in self._items:
                return None
            self._items.move_to_end(key)
            return self._items[key]

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._items.pop(key, None)


class Intake:
    def __init__(self, cluster: ClusterPort, store: IncidentStore, cas: IncidentCas, proposer: Proposer,
                 poster: Poster, messages: Messages, metrics: Metrics, clock: Callable[[], datetime]):
        self.cluster, self.store, self.cas, self.proposer = cluster, store, cas, proposer
        self.poster, self.messages, self.metrics, self.clock = poster, messages, metrics, clock
        # Optional (bot.app.commentary.Commentary): called once a new incident is posted, returns
        # at once; a repeat alert never calls it.
        self.commentary: Callable[[Incident | None, Evidence | None], object] | None = None
        # What this process saw, so a repeat costs what it must: the last crash handled per alerted
        # pod (-> its incident), and the incident names known to exist. Only shortcuts: a pod or
        # incident not remembered (another replica, a restart) takes the full path.
        self._crashes = Remembered()
        self._names = Remembered()
        # name -> the incident as this process last wrote or read it: a CAS starts from it (a
        # stale one costs a conflict and a re-read, never a lost count).
        self._latest = Remembered(LATEST)

    def handle_alert(self, target: AlertTarget) -> Incident | None:
        """A firing alert opens or updates the incident of (workload, cause); a resolved one
        marks it resolved. Returns the incident, or None when there is nothing to act on."""
        self.metrics.alerts_received.labels("firing" if target.firing else "resolved").inc()
        if not target.firing:
            return self._resolve(target)
        try:
            repeat = self._same_crash_again(target)
            if repeat is not None:
                return repeat
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
        incident = self.open_or_update(target, evidence, channel=None)
        if incident is not None and evidence.pod:
            self._crashes.put(self._alert_key(target), (crash_mark(evidence.pod, evidence.container), incident.name))
            self._latest.put(incident.name, incident)
        return incident

    def _alert_key(self, target: AlertTarget) -> Hashable:
        return target.namespace, target.pod, target.container or ""

    def _same_crash_again(self, target: AlertTarget) -> Incident | None:
        """A repeat of an alert this process handled, for the crash it handled (the pod read
        alone says so: bot.app.intake.crash_mark): counted on its incident, and nothing else:
        no log read, no diagnosis, no owner reads. None: not such a repeat (a new crash, an
        incident resolved or gone meanwhile), handle it in full."""
        seen = self._crashes.get(self._alert_key(target))
        if seen is None:
            return None
        mark, name = seen
        pod = self.cluster.read_pod(target.namespace, target.pod)
        if crash_mark(pod, target.container) != mark:
            return None

        def count(incident: Incident) -> Incident | None:
            if incident.state == IncidentState.RESOLVED:
                return None  # crashing again after it was resolved: the full path reopens it
            return incident.revised(last_seen=self.clock(), alert_count=incident.alert_count + 1)

        incident = self.cas.mutate(name, count, known=self._latest.get(name))
        if incident is None or incident.state == IncidentState.RESOLVED:
            self._crashes.forget(self._alert_key(target))
            self._latest.forget(name)
            return None
        self.metrics.repeats.inc()
        if not incident.message_id:
            posted = self.poster.ensure_posted(name, known=incident)  # a post that failed earlier: try again now
            if posted is not None:
                self._latest.put(name, posted)
            return posted
        self._latest.put(name, incident)
        # Only the count changed: folded with the other repeats' updates (one thread sends them, one
        # chat.update per incident per turn; the others return at once). Measured in serve with 10
        # concurrent senders, this costs less CPU than each repeat updating its own message, though
        # the flusher reads each folded incident again.
        self.messages.refresh_folded(name, lambda: self.store.get(name), incident)
        return incident

    def open_or_update(self, target: AlertTarget, evidence: Evidence, channel: str | None,
                       diagnosis: DiagnosisResult | None = None, workload: WorkloadRef | None = None
                       ) -> Incident | None:
        """Create and post the incident this evidence belongs to, or fold the alert into it. An
        incident this process knows exists is folded into straight away; any other is created,
        and the create is the check (it fails when another alert or replica got there first)."""
        diagnosis = diagnosis or self.proposer.diagnose(evidence)
        workload = workload or self.cluster.workload_for(evidence)
        name = incident_name(self.cluster.name, workload.namespace, workload.name, diagnosis.cause)
        if self._names.get(name):
            incident = self._record_repeat(name, target.pod, diagnosis, evidence, workload)
            if incident is not None:
                return incident
            self._names.forget(name)  # deleted meanwhile: open it again
        posted = self._open(name, target, evidence, diagnosis, workload, channel)
        self._names.put(name, True)
        if posted is not None:
            return posted
        return self._record_repeat(name, target.pod, diagnosis, evidence, workload)

    def _open(self, name: str, target: AlertTarget, evidence: Evidence, diagnosis: DiagnosisResult,
              workload: WorkloadRef, channel: str | None) -> Incident | None:
        """Create and post the incident; None when it exists already."""
        new = self.poster.new_post(name)
        incident = self._new_incident(name, target, evidence, diagnosis, workload, channel, new)
        try:
            created = self.cas.create(incident)
        except IncidentExists:
            return None  # another alert or replica got there first: fold this one into it
        self.metrics.diagnoses.labels(diagnosis.cause or "unknown").inc()
        if created.state == IncidentState.PROPOSED:
            self.metrics.proposals.inc()
        log.info("incident %s created (%s)", name, diagnosis.cause or "no known cause")
        posted = self.poster.ensure_posted(name, received_at=target.received_at, lease=new.lease, known=created)
        if self.commentary is not None:
            self.commentary(posted, evidence)
        return posted

    def _new_incident(self, name: str, target: AlertTarget, evidence: Evidence, diagnosis: DiagnosisResult,
                      workload: WorkloadRef, channel: str | None, new: NewPost) -> Incident:
        now = self.clock()
        proposal = self.proposer.propose(diagnosis, evidence, workload)
        return Incident(
            name=name, cluster=self.cluster.name, namespace=workload.namespace, workload=workload.name,
            cause=diagnosis.cause, state=check_opening(name, open_state(proposal)),
            pods=[target.pod], restarts=diagnosis.restarts, first_seen=now, last_seen=now,
            chat_channel=channel, proposal=proposal, diagnosis=diagnosis,
            # the creator posts it: no other replica does meanwhile; its message's identity is stored first
            post_lease=new.lease, post_key=new.key, post_since=new.since,
            # for /vllm why once the previous log is gone
            evidence=evidence_cache.keep(evidence, now, self.proposer.policy.redactor),
            log_cut=evidence.log.truncated_middle,
            history=[f"{iso(now)} created from pod {target.pod}"],
        )

    def _record_repeat(self, name: str, pod: str, diagnosis: DiagnosisResult, evidence: Evidence,
                       workload: WorkloadRef) -> Incident | None:
        """A repeat of an open incident's alert: count it; a resolved one is crashing again."""
        self.metrics.repeats.inc()
        current = self.store.get(name)
        fresh: Proposal | None = None
        if current is not None and current.state == IncidentState.RESOLVED and not self._live(current.proposal):
            fresh = self.proposer.propose(diagnosis, evidence, workload)  # crashing again, the old proposal is stale
        reopened = False

        def fold(incident: Incident) -> Incident:
            nonlocal reopened
            now = self.clock()
            counters = {"last_seen": now, "alert_count": incident.alert_count + 1,
                        "pods": (incident.pods + ([pod] if pod not in incident.pods else []))[-POD_LIMIT:],
                        "restarts": max(incident.restarts or 0, diagnosis.restarts or 0),
                        "evidence": evidence_cache.keep(evidence, now, self.proposer.policy.redactor)
                        or incident.evidence, "log_cut": evidence.log.truncated_middle}
            reopened = incident.state == IncidentState.RESOLVED
            if not reopened:
                return incident.revised(**counters)
            proposal = incident.proposal if self._live(incident.proposal) else fresh
            return moved(incident, open_state(proposal), now, f"firing again (pod {pod})", **counters,
                         proposal=proposal, diagnosis=diagnosis if proposal is fresh else incident.diagnosis,
                         approver=None, decided_at=None)

        incident = self.cas.mutate(name, fold, known=current)
        if incident is None:
            return None
        if not incident.message_id:
            return self.poster.ensure_posted(name, known=incident)  # a post that failed earlier: try again now
        if reopened:  # a state change: shown at once
            self.messages.refresh(incident)
        else:
            self.messages.refresh_folded(name, lambda: self.store.get(name), incident)
        if reopened:
            self.messages.reply(incident, None, Note(kind=NoteKind.CRASHING_AGAIN, pod=pod))
        return incident

    def _live(self, proposal: Proposal | None) -> bool:
        return proposal is not None and proposal.expires_at > self.clock()

    def _resolve(self, target: AlertTarget) -> Incident | None:
        """Alertmanager says the pod stopped crash-looping: mark its incidents resolved (all but
        those mid-apply, which the table does not let move to resolved). Only the unresolved are
        listed: the resolved ones, never deleted, would otherwise make every resolved alert read
        every incident the namespace ever had."""
        resolved = None
        for incident in self.store.list(state_not=IncidentState.RESOLVED, cluster=self.cluster.name,
                                        namespace=target.namespace):
            if target.pod not in incident.pods or not can_move(incident.state, IncidentState.RESOLVED):
                continue

            def mark(inc: Incident) -> Incident | None:
                if not can_move(inc.state, IncidentState.RESOLVED):
                    return None
                now = self.clock()
                return moved(inc, IncidentState.RESOLVED, now,
                             f"resolved (alert for pod {target.pod} resolved; was {inc.state})", last_seen=now)

            updated = self.cas.mutate(incident.name, mark, known=incident)  # as just listed: no second read
            if updated is not None and updated.state == IncidentState.RESOLVED:
                resolved = updated
                if updated.message_id:
                    self.messages.refresh(updated)
        if resolved is None:
            self.metrics.alerts_skipped.labels("resolved_without_incident").inc()
        return resolved
