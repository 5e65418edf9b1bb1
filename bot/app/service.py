"""The application's use cases behind one facade: alert, `/vllm why`, approve, reject, roll back,
verify, sweep, expire.

Talks only to three ports: ClusterPort (evidence, proposals, patches), IncidentStore (state that
survives restarts and is shared by replicas) and ChatPort (Slack, or the terminal). Every
decision that must happen once goes through a compare-and-swap on the incident (bot.app.cas),
never through process memory, so a double click, two approvers, two replicas or a restart in
between cannot apply a change twice or post an incident twice.

The work is done by one module per job; this class only wires them and keeps the public
methods the adapters (bot.slack, bot.http, bot.cli) call:
  intake     alerts open, update and resolve incidents     why        `/vllm why`
  posting    the exactly-once post, re-posting, the sweep  decisions  approve, reject, expire
  rollout    verify, roll back                              approvers  who may decide
  cas        every store write, every state change          messages   refresh, reply, refuse
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from bot.app.approvers import Approvers
from bot.app.cas import IncidentCas
from bot.app.decisions import Decisions
from bot.app.intake import Intake
from bot.app.messages import Messages
from bot.app.metrics import Metrics
from bot.app.policy import Policy, utcnow
from bot.app.ports import ChatPort, ClusterPort, IncidentStore, TrafficHistory
from bot.app.posting import Poster
from bot.app.proposals import Proposer
from bot.app.records import AlertTarget, Incident, MessageRef
from bot.app.rollout import Rollout, VerifySteps
from bot.app.seal import KeptRedacted, Sealer
from bot.app.state import Outcome
from bot.app.why import Why
from bot.diagnosis.diagnose import diagnose as default_diagnose
from bot.diagnosis.models import DiagnosisResult, Evidence

__all__ = ["OncallService", "Policy", "utcnow"]


class OncallService:
    def __init__(self, cluster: ClusterPort, store: IncidentStore, chat: ChatPort, policy: Policy | None = None,
                 metrics: Metrics | None = None,
                 diagnose: Callable[[Evidence], DiagnosisResult] = default_diagnose,
                 run_later: Callable[[Callable[[], object]], object] | None = None,
                 clock: Callable[[], datetime] = utcnow, verify_steps: VerifySteps | None = None,
                 traffic: TrafficHistory | None = None):
        self.cluster, self.store, self.chat = cluster, store, chat
        self.policy = policy or Policy()
        self.metrics = metrics or Metrics()
        self.diagnose = diagnose
        # Slow follow-ups (rollout verification) go here; inline when no executor is given. The
        # HTTP server replaces it with its executor after construction, so it is read per use.
        self.run_later = run_later or (lambda fn: fn())
        self.clock = clock
        # With a seal key the bot's own text is sealed and checked before it is rendered (bot.app.seal).
        sealer = Sealer(self.policy.seal_key, self.policy.redactor) if self.policy.seal_key else None
        cas = IncidentCas(store, clock, sealer or KeptRedacted(self.policy.redactor))
        messages = Messages(chat, self.metrics, sealer.intact if sealer else None)
        self.approvers = Approvers(self.policy, chat)
        proposer = Proposer(cluster, diagnose, self.policy, clock, traffic)
        self.posting = Poster(cluster.name, store, chat, cas, messages, self.metrics, self.policy, clock)
        self.intake = Intake(cluster, store, cas, proposer, self.posting, messages, self.metrics, clock)
        self.why = Why(cluster, store, chat, cas, self.intake, proposer, self.posting, self.metrics, self.policy,
                       clock, self.approvers)
        self.rollout = Rollout(cluster, store, cas, self.approvers, messages, self.metrics, self.policy, clock,
                               verify_steps, diagnose)
        self.decisions = Decisions(cluster, store, cas, self.approvers, messages, proposer, self.intake,
                                   self.metrics, self._follow_rollout, clock)

    def _follow_rollout(self, name: str, clicked: MessageRef | None) -> None:
        self.run_later(lambda: self.verify(name, clicked))

    def handle_alert(self, target: AlertTarget) -> Incident | None:
        """A firing alert opens or updates the incident of (workload, cause); a resolved one
        marks it resolved. Returns the incident, or None when there is nothing to act on."""
        return self.intake.handle_alert(target)

    def answer_why(self, query: str, channel: str, user: str) -> Incident | None:
        """`why POD`, `why NS/POD` or `why DEPLOYMENT`: post the diagnosis in `channel`."""
        return self.why.answer_why(query, channel, user)

    def is_approver(self, user: str, namespace: str | None = None, channel: str | None = None) -> bool:
        return self.approvers.is_approver(user, namespace, channel)

    def approve(self, name: str, user: str, clicked: MessageRef | None = None, digest: str | None = None
                ) -> Outcome:
        """Returns what happened: applied | failed | conflict | refused | replaced | not_allowed | ...
        `digest`: the proposal the approver saw (the chat adapters always pass the button's)."""
        return self.decisions.approve(name, user, clicked, digest)

    def reject(self, name: str, user: str, clicked: MessageRef | None = None, digest: str | None = None
               ) -> Outcome:
        return self.decisions.reject(name, user, clicked, digest)

    def verify(self, name: str, clicked: MessageRef | None = None) -> Incident | None:
        """Follow the rollout and report it in the thread."""
        return self.rollout.verify(name, clicked)

    def roll_back(self, name: str, user: str, clicked: MessageRef | None = None) -> Outcome:
        return self.rollout.roll_back(name, user, clicked)

    def sweep(self) -> None:
        """Periodic: post incidents whose post failed (the chat was down), finish or report applies
        left in `applying` (a lost answer, a killed replica), resume verifications whose run is
        gone, expire old proposals."""
        self.posting.post_pending()
        self.decisions.resume_applying(self.cluster.name)
        self.rollout.resume_interrupted(self.run_later)  # renews this process's verifications, resumes orphans
        self.expire()

    def expire(self) -> list[Incident]:
        return self.decisions.expire(self.cluster.name)
