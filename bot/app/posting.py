"""Posting an incident exactly once, and eventually.

Whoever creates an incident also takes its post lease, so no other replica or thread posts it
meanwhile. A post that fails (the chat is down) releases the lease and leaves the incident
unposted in the store; the next repeat alert or the periodic sweep posts it. A lease whose
holder died runs out after POST_LEASE, and then anyone may post.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta

from bot.app.cas import IncidentCas, noted
from bot.app.messages import Messages
from bot.app.metrics import Metrics
from bot.app.policy import Policy
from bot.app.ports import ChatPort, ChatUnavailable, IncidentConflict, IncidentStore
from bot.app.records import Incident, MessageRef, PostLease

log = logging.getLogger(__name__)

POST_LEASE = timedelta(seconds=60)  # how long one attempt may hold the right to post an incident


class Poster:
    def __init__(self, cluster_name: str, store: IncidentStore, chat: ChatPort, cas: IncidentCas,
                 messages: Messages, metrics: Metrics, policy: Policy, clock: Callable[[], datetime]):
        self.cluster_name = cluster_name  # the sweep posts only this cluster's incidents
        self.store, self.chat, self.cas, self.messages = store, chat, cas, messages
        self.metrics, self.policy, self.clock = metrics, policy, clock

    def new_lease(self) -> PostLease:
        """A lease per posting attempt (not per replica: threads of one replica race too)."""
        return PostLease(holder=f"{self.policy.replica}/{uuid.uuid4().hex[:8]}", until=self.clock() + POST_LEASE)

    def lease_holder(self, incident: Incident) -> str | None:
        """The posting attempt currently allowed to post this incident, if its lease is still running."""
        lease = incident.post_lease
        return lease.holder if lease is not None and lease.until > self.clock() else None

    def ensure_posted(self, name: str, received_at: float | None = None, lease: PostLease | None = None,
                      known: Incident | None = None) -> Incident | None:
        """Post the incident unless it is posted or someone else holds the post lease.

        `known`: the incident as the caller just wrote it (created, or updated by CAS). It saves
        a read; it is safe because every later write here is a CAS on its version, so a stale
        `known` only costs a conflict and a re-read."""
        incident = known if known is not None else self.store.get(name)
        if incident is None or incident.slack_ts:
            return incident
        holder = self.lease_holder(incident)
        if holder is not None and (lease is None or holder != lease.holder):
            return incident  # another thread or replica is posting it right now
        if holder is None:
            try:
                incident = self.store.update(incident.model_copy(update={"post_lease": self.new_lease()}))
            except IncidentConflict:
                return self.store.get(name)  # someone else moved first; they (or the sweeper) post it
        try:
            message = self.chat.post_incident(incident, incident.slack_channel)
        except ChatUnavailable as exc:
            return self._post_failed(incident, exc, received_at)
        return self._posted(incident, message, received_at)

    def post_pending(self) -> None:
        """Post the incidents whose post failed (the chat was down)."""
        for incident in self.store.list(cluster=self.cluster_name, posted="false"):
            try:
                self.ensure_posted(incident.name)
            except Exception:  # one bad incident must not stop the others
                log.exception("retrying the post of %s failed", incident.name)

    def _post_failed(self, incident: Incident, exc: ChatUnavailable, received_at: float | None
                     ) -> Incident | None:
        name = incident.name
        log.warning("could not post incident %s, will retry: %s", name, exc)
        # A channel that refuses the bot (e.g. `/vllm why` typed where it is not a member)
        # never will accept it: fall back to the alert channel instead of retrying forever.
        fallback = {"slack_channel": None} if exc.channel_refused and incident.slack_channel else {}
        note = f"post failed: {str(exc)[:120]}" + ("; using the alert channel" if fallback else "")
        self.cas.mutate(name, lambda inc: inc.model_copy(update={
            **fallback, "post_lease": None, "history": noted(inc, self.clock(), note)}))
        return self.ensure_posted(name, received_at) if fallback else self.store.get(name)

    def _posted(self, incident: Incident, message: MessageRef, received_at: float | None) -> Incident | None:
        if received_at is not None:
            self.metrics.alert_to_post.observe(time.monotonic() - received_at)
        self.metrics.incidents_posted.inc()

        def record_post(inc: Incident) -> Incident:
            return inc.model_copy(update={
                "slack_channel": message.channel, "slack_ts": message.ts, "post_lease": None,
                "history": noted(inc, self.clock(), f"posted to {message.channel}")})

        # Usually nobody wrote since the incident we hold (we held the post lease): a CAS on it
        # stores the ts without reading again. Someone did (a repeat alert's counters): re-read.
        try:
            posted: Incident | None = self.store.update(record_post(incident))
        except IncidentConflict:
            posted = self.cas.mutate(incident.name, record_post)
        if posted is not None and (posted.alert_count, posted.pods) != (incident.alert_count, incident.pods):
            self.messages.refresh(posted)  # repeats arrived while posting: show their counters
        return posted
