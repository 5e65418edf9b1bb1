"""Posting an incident exactly once, and eventually.

Whoever creates an incident also takes its post lease, so no other replica or thread posts it
meanwhile. With the lease (in the same write) the incident gets its message's identity, a
`post_key` ("<name>/<random>"), before anything is sent; the chat carries the key in the
message's metadata.

A post that certainly failed (connection refused, the chat said no) releases the lease and
leaves the incident unposted in the store; the next repeat alert or the periodic sweep posts it.
A post whose answer is ambiguous (a timeout, a 5xx, a connection dropped after sending: the
message may exist) keeps the lease, so nobody posts again before it runs out; a holder that died
mid-post leaves it the same way. After the post lease (Policy.post_lease) anyone may take the lease, and whoever takes it
over an incident that already has a key first looks for that key in the channel's history:
found, its message id is recorded (posted once, counted once); the look-up failed, nothing is posted
until a later sweep can look; not found, it is posted with the same key.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from bot.app.cas import IncidentCas, noted
from bot.app.grouping import Gathering
from bot.app.links import LinkTemplates, incident_links
from bot.app.messages import Messages
from bot.app.metrics import Metrics
from bot.app.policy import Policy
from bot.app.ports import ChatPort, ChatUnavailable, IncidentConflict, IncidentStore
from bot.app.records import Incident, Lease, MessageRef
from bot.app.redaction import carried_over
from bot.diagnosis.redact import DEFAULT, Redactor

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NewPost:
    """What a creator writes with the incident (one write) before its first post attempt."""

    lease: Lease
    key: str  # the message's identity, sent in its metadata
    since: datetime  # no message with this key can be older


def with_links(incident: Incident, templates: LinkTemplates, redactor: Redactor = DEFAULT) -> Incident:
    """The incident as posted: with the operator's runbook and dashboard links for its cluster and
    the `kubectl` commands that show its evidence (derived now, never stored). Redacted as much as
    `incident` is: the links are no text redaction rewrites, so the message does not redact it again."""
    d, p = incident.diagnosis, incident.proposal
    pod = (d.pod if d else None) or (incident.pods[-1] if incident.pods else None)
    container = (d.container if d else None) or (p.workload.container if p else None)
    return carried_over(incident, incident.revised(links=incident_links(
        incident.cluster, incident.namespace, incident.workload, p.workload.kind if p else None, pod, container,
        templates)), redactor)


class Poster:
    def __init__(self, cluster_name: str, store: IncidentStore, chat: ChatPort, cas: IncidentCas,
                 messages: Messages, metrics: Metrics, policy: Policy, clock: Callable[[], datetime]):
        self.cluster_name = cluster_name  # the sweep posts only this cluster's incidents
        self.store, self.chat, self.cas, self.messages = store, chat, cas, messages
        self.metrics, self.policy, self.clock = metrics, policy, clock
        self.gathering = Gathering(clock)  # storms: a channel's backlog as grouped messages

    def new_lease(self) -> Lease:
        """A lease per posting attempt (not per replica: threads of one replica race too)."""
        return Lease(holder=f"{self.policy.replica}/{uuid.uuid4().hex[:8]}", until=self.clock() + self.policy.post_lease)

    def new_post(self, name: str) -> NewPost:
        """A lease and a new message identity, for an incident whose next message is a new one."""
        return NewPost(lease=self.new_lease(), key=f"{name}/{uuid.uuid4().hex[:12]}", since=self.clock())

    def lease_holder(self, incident: Incident) -> str | None:
        """The posting attempt currently allowed to post this incident, if its lease is still running."""
        lease = incident.post_lease
        return lease.holder if lease is not None and lease.until > self.clock() else None

    def ensure_posted(self, name: str, received_at: float | None = None, lease: Lease | None = None,
                      known: Incident | None = None) -> Incident | None:
        """Post the incident unless it is posted or someone else holds the post lease.

        `lease`: the lease the caller wrote together with a new post_key (`new_post`): this is
        that key's first attempt, nothing to look for. `known`: the incident as the caller just
        wrote it (created, or updated by CAS). It saves a read; it is safe because every later
        write here is a CAS on its version, so a stale `known` only costs a conflict and a re-read."""
        incident = known if known is not None else self.store.get(name)
        if incident is None or incident.message_id:
            return incident
        if incident.group is not None and self.gathering.busy(incident.chat_channel or ""):
            return incident  # named in a group already: the channel's turns go to the storm's groups first
        holder = self.lease_holder(incident)
        if holder is not None and (lease is None or holder != lease.holder):
            return incident  # another thread or replica is posting it right now
        # Taking the lease here (it ran out, or was released): a key already on the incident is
        # an earlier attempt's, which may have posted (ambiguous answer, or killed mid-post).
        earlier = holder is None and incident.post_key is not None
        if holder is None or incident.post_key is None:
            try:
                incident = self.cas.update(incident, incident.revised(**self._attempt(incident, holder is None)))
            except IncidentConflict:
                return self.store.get(name)  # someone else moved first; they (or the sweeper) post it
        if earlier:
            try:
                found = self.chat.find_posted(incident.chat_channel, incident.post_key or "",
                                              incident.post_since or incident.first_seen, thread=incident.group)
            except ChatUnavailable as exc:
                return self._lookup_failed(incident, exc)
            if found is not None:
                return self._posted(incident, found, received_at, recovered=True)
        if not self.messages.shown_as_sealed(incident):
            return incident  # edited since the bot wrote it: never posted as the bot's own words
        if incident.group is None and self.policy.group_storms:
            return self._gather(incident, received_at)
        return self._post_one(incident, received_at)  # its own message, in its group's thread

    def _post_one(self, incident: Incident, received_at: float | None) -> Incident | None:
        """Post the incident's own message: top-level, or in its group's thread."""
        try:
            channel = incident.group.channel if incident.group is not None else incident.chat_channel
            message = self.chat.post_incident(with_links(incident, self.policy.links, self.policy.redactor), channel,
                                              thread=incident.group)
        except ChatUnavailable as exc:
            return self._post_failed(incident, exc, received_at)
        return self._posted(incident, message, received_at)

    def _gather(self, incident: Incident, received_at: float | None) -> Incident | None:
        """Wait for the channel's turn with the others waiting (bot/app/grouping.py). The first to
        wait posts for all, turn by turn, until none are left; the others return at once, their
        post lease kept (the leader posts them within it; past it the sweep takes over)."""
        channel = incident.chat_channel or ""
        if not self.gathering.join(channel, incident):
            return incident
        mine: Incident | None = incident
        try:
            while (batch := self.gathering.next_batch(channel)) is not None:
                # The caller's own incident is as it just wrote or read it (a stale one only costs a
                # CAS conflict later); the others waited, and are read again.
                waiting = [i for i in (w if w.name == incident.name else self._still_waiting(w)
                                       for w in batch.incidents) if i is not None]
                if not waiting:
                    continue
                if batch.grouped:
                    self._post_group(waiting)
                    continue
                one = waiting[0]
                try:
                    posted = self._post_one(one, received_at if one.name == incident.name else None)
                except Exception:  # one incident's failure must not leave the others waiting
                    log.exception("posting incident %s failed", one.name)
                    continue
                if one.name == incident.name:
                    mine = posted
        except BaseException:
            self.gathering.abandon(channel)
            raise
        return mine if mine is not None and mine.message_id else self.store.get(incident.name)

    @staticmethod
    def _release(lease: Lease | None) -> Callable[[Incident], Incident | None]:
        """Ends `lease` on the incident, unless someone else holds it by now."""
        return lambda incident: incident.revised(post_lease=None) if incident.post_lease == lease else None

    def _still_waiting(self, waited: Incident) -> Incident | None:
        """The incident as it is now, if it still waits for this post: not posted or grouped
        meanwhile, its lease still the one it waited with (else someone else took it over)."""
        current = self.store.get(waited.name)
        if current is None or current.message_id or current.group is not None \
                or current.post_lease != waited.post_lease:
            return None
        return current

    def _post_group(self, incidents: list[Incident]) -> None:
        """One grouped message for `incidents`; each then records it as its top-level post."""
        try:
            group = self.chat.post_group(incidents, incidents[0].chat_channel)
        except ChatUnavailable as exc:
            log.warning("could not post the grouped message of %d incidents (%s); each is posted later",
                        len(incidents), exc)
            if not exc.ambiguous:  # certainly not posted: the sweep may post them at once
                for inc in incidents:
                    self.cas.mutate(inc.name, self._release(inc.post_lease))
            return
        log.info("posted %d incidents as one grouped message", len(incidents))
        for inc in incidents:
            try:
                self.cas.mutate(inc.name, lambda cur: None if cur.message_id or cur.group else cur.grouped_in(
                    group, noted(cur, self.clock(), f"named in a grouped message in {group.channel}; "
                                 "its own message follows in that thread")))
            except Exception:
                log.exception("recording the grouped message on %s failed", inc.name)

    def post_pending(self) -> None:
        """Post the incidents whose post failed (the chat was down) or may not have happened."""
        for incident in self.store.list(cluster=self.cluster_name, posted="false"):
            try:
                self.ensure_posted(incident.name)
            except Exception:  # one bad incident must not stop the others
                log.exception("retrying the post of %s failed", incident.name)

    def _attempt(self, incident: Incident, take_lease: bool) -> dict[str, object]:
        """The fields one CAS writes before an attempt: a new lease, and a key if there is none yet
        (an existing key is kept: it is how an earlier attempt's message is recognised)."""
        fields: dict[str, object] = {"post_lease": self.new_lease()} if take_lease else {}
        if incident.post_key is None:
            new = self.new_post(incident.name)
            fields.update(post_key=new.key, post_since=new.since)
        return fields

    def _post_failed(self, incident: Incident, exc: ChatUnavailable, received_at: float | None
                     ) -> Incident | None:
        name = incident.name
        if exc.ambiguous:
            # It may be in the channel: keep the lease, so nobody posts again before it runs out;
            # whoever takes it then looks for the key first.
            log.warning("posting incident %s may or may not have worked (%s); will look for it before "
                        "posting again", name, exc)
            self.cas.mutate(name, lambda inc: inc.with_history(noted(
                inc, self.clock(), f"post answer unclear ({str(exc)[:120]}): it may be in the channel; "
                "looking for it there before any new post")))
            return self.store.get(name)
        log.warning("could not post incident %s, will retry: %s", name, exc)
        # A channel that refuses the bot (e.g. `/vllm why` typed where it is not a member)
        # never will accept it: fall back to the alert channel instead of retrying forever.
        fallback = {"chat_channel": None} if exc.channel_refused and incident.chat_channel else {}
        note = f"post failed: {str(exc)[:120]}" + ("; using the alert channel" if fallback else "")
        self.cas.mutate(name, lambda inc: inc.revised(**fallback, post_lease=None,
                                                      history=noted(inc, self.clock(), note)))
        return self.ensure_posted(name, received_at) if fallback else self.store.get(name)

    def _lookup_failed(self, incident: Incident, exc: ChatUnavailable) -> Incident | None:
        """Could not tell whether an earlier attempt posted: post nothing, let a later sweep look."""
        log.warning("could not check whether incident %s was posted already (%s): not posting it now", incident.name,
                    exc)
        mine = incident.post_lease

        def release(inc: Incident) -> Incident:
            return inc.revised(
                post_lease=None if inc.post_lease == mine else inc.post_lease,
                history=noted(inc, self.clock(), f"could not check the channel for an earlier post "
                              f"({str(exc)[:120]}): not posting until it can"))

        return self.cas.mutate(incident.name, release)

    def _posted(self, incident: Incident, message: MessageRef, received_at: float | None,
                recovered: bool = False) -> Incident | None:
        first = True  # this call stored the incident's message id (not someone who overran our lease)

        def record_post(inc: Incident) -> Incident | None:
            nonlocal first
            first = not inc.message_id
            if not first:
                return None
            how = "found in the history of" if recovered else "posted to"
            return inc.posted_as(message, noted(inc, self.clock(), f"{how} {message.channel}"))

        # Usually nobody wrote since the incident we hold (we held the post lease): a CAS on it
        # stores the message id without reading again. Someone did (a repeat alert's counters): re-read.
        try:
            update = record_post(incident)
            posted: Incident | None = self.cas.update(incident, update) if update is not None else incident
        except IncidentConflict:
            posted = self.cas.mutate(incident.name, record_post)
        if first:
            self.metrics.incidents_posted.inc()  # each incident's message once, however it was learnt
            if recovered:
                self.metrics.posts_recovered.inc()
            if received_at is not None:
                self.metrics.alert_to_post.observe(time.monotonic() - received_at)
        else:
            log.error("incident %s already had message %s when %s arrived: a duplicate", incident.name,
                      posted.message_id if posted else None, message.message_id)
        # Repeats arrived while posting, or the message found was rendered by an earlier attempt:
        # show the incident as it is now.
        if posted is not None and first and (recovered or (posted.alert_count, posted.pods) != (
                incident.alert_count, incident.pods)):
            self.messages.refresh(posted)
        if posted is not None and first and recovered:
            self._ensure_details(posted, message)
        return posted

    def _ensure_details(self, incident: Incident, message: MessageRef) -> None:
        """A message found in the history may lack its details reply: the earlier attempt posts it
        right after the message, so an answer lost or a kill between the two leaves it out. Post it
        unless it is there; when the thread cannot be read, post nothing (a missing details reply
        costs less than a second one)."""
        thread = incident.thread_of(message) or message  # a grouped incident's details sit beside it
        try:
            if self.chat.find_details(thread, incident.name):
                return
        except ChatUnavailable as exc:
            log.warning("could not check the thread of %s for its details (%s): not posting them", incident.name, exc)
            return
        self.chat.post_details(incident, thread)
