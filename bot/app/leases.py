"""Who follows an applied change's rollout: one verification run per incident, across replicas
and restarts.

A run holds the incident's verify lease: holder = this process, until = now + the apply grace.
The lease is renewed at every step and by every sweep of the process that runs it, so a
verification that waits longer than the grace (a slow rollout, the soak) keeps it. A process
that dies stops renewing; once its lease has run out, any replica's sweep takes the lease over
by compare-and-swap and resumes the verification from the stored step: exactly one replica
resumes it, whether the dead one is restarted or another replica is already running.

An incident moved to `applied` carries no lease until its verification starts (the applier
replies first); until the grace has passed since the change was applied it counts as held.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable
from datetime import datetime

from bot.app.cas import IncidentCas
from bot.app.policy import Policy
from bot.app.records import Incident, Lease
from bot.app.state import VerificationStep

log = logging.getLogger(__name__)


class LeaseLost(Exception):
    """Another live replica holds this incident's verification: this run stops."""


class VerifyLeases:
    def __init__(self, cas: IncidentCas, policy: Policy, clock: Callable[[], datetime]):
        self.cas, self.policy, self.clock = cas, policy, clock
        self.holder = f"{policy.replica}/{uuid.uuid4().hex[:8]}"  # this process
        self._running: set[str] = set()
        self._lock = threading.Lock()

    def begin(self, name: str) -> bool:
        """Mark a run of `name` as under way in this process; False if one already is."""
        with self._lock:
            if name in self._running:
                return False
            self._running.add(name)
            return True

    def end(self, name: str) -> None:
        with self._lock:
            self._running.discard(name)

    def running(self, name: str) -> bool:
        with self._lock:
            return name in self._running

    def _lease(self) -> Lease:
        return Lease(holder=self.holder, until=self.clock() + self.policy.apply_grace)

    def _held_by_other(self, incident: Incident) -> bool:
        lease = incident.verify_lease
        return lease is not None and lease.holder != self.holder and lease.until > self.clock()

    def step(self, name: str, step: VerificationStep | None) -> Incident:
        """Store the verification step (None: the verification ended) with this run's lease, so a
        restarted bot resumes it. Raises LeaseLost if another live replica holds it."""
        lost = False

        def mark(inc: Incident) -> Incident | None:
            nonlocal lost
            lost = step is not None and self._held_by_other(inc)  # per attempt: a CAS retry asks again
            if lost:
                return None
            return inc.at_step(step, self._lease() if step is not None else None)

        incident = self.cas.mutate(name, mark)
        if lost:
            raise LeaseLost(name)
        assert incident is not None, f"incident {name} vanished"
        return incident

    def renew(self) -> None:
        """Sweep: extend the lease of every verification this process is running."""
        with self._lock:
            names = sorted(self._running)
        for name in names:
            def extend(inc: Incident) -> Incident | None:
                lease = inc.verify_lease
                return inc.with_verify_lease(self._lease()) \
                    if lease is not None and lease.holder == self.holder else None
            try:
                self.cas.mutate(name, extend)
            except Exception as exc:  # the next sweep renews again, well inside the grace
                log.warning("could not renew the verify lease of %s: %s", name, exc)

    def abandoned(self, incident: Incident) -> bool:
        """Its verification's run is gone: the lease ran out, or there never was one and the
        change was applied longer than the grace ago."""
        if self.running(incident.name):
            return False
        lease = incident.verify_lease
        if lease is not None:
            return lease.until <= self.clock()
        since = incident.applied.at if incident.applied else incident.decided_at
        return since is None or since <= self.clock() - self.policy.apply_grace

    def take_over(self, name: str) -> Incident | None:
        """Take an abandoned verification's lease by CAS; None if it is not abandoned (any more)."""
        taken = False

        def take(inc: Incident) -> Incident | None:
            nonlocal taken
            taken = inc.verification_step is not None and self.abandoned(inc)  # per attempt, as above
            if not taken:
                return None
            return inc.with_verify_lease(self._lease())

        incident = self.cas.mutate(name, take)
        return incident if taken else None
