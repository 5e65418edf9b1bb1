"""The seams between the application and the outside world.

The application (bot/app/) talks to a cluster through `ClusterPort` (live Kubernetes in
bot/kube/, or manifest files and bundles on disk in bot/local/), keeps incidents in an
`IncidentStore` and talks to people through `ChatPort` (Slack in bot/slack/, or the
terminal). Adapters implement these protocols; the application imports none of them, so either
side can be swapped.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from bot.app.records import ApplyResult, Incident, MessageRef, Note, Verification
from bot.app.verdict import Diagnoser
from bot.app.workload_ops import ChangeToUndo
from bot.diagnosis.models import DiagnosisResult, Evidence
from bot.remedy.impact import Histogram
from bot.remedy.models import Proposal, WorkloadRef


class PodNotFound(LookupError):
    def __init__(self, namespace: str, name: str, close_matches: list[str] | None = None):
        self.namespace, self.name, self.close_matches = namespace, name, close_matches or []
        hint = f" Close matches: {', '.join(self.close_matches)}." if self.close_matches else ""
        super().__init__(f"pod {namespace}/{name} not found.{hint}")


class IncidentExists(Exception):
    """Creating an incident whose name is taken: another replica or alert got there first."""


class IncidentConflict(Exception):
    """An update lost a race: reload and decide again."""


class ChatUnavailable(Exception):
    """The chat could not be reached after retries; the incident stays in the store unposted.

    channel_refused: the chat answered but will never accept a post to that channel (not a
    member, archived, no such channel), so retrying the same channel is pointless.
    ambiguous: the chat may have done it anyway (a timeout, a 5xx, a connection dropped after the
    request was sent): a post may exist. False when it certainly did not (connection refused, a
    4xx answer such as channel_not_found, 429 after the retries)."""

    def __init__(self, message: str, channel_refused: bool = False, ambiguous: bool = False):
        super().__init__(message)
        self.channel_refused = channel_refused
        self.ambiguous = ambiguous


class ClusterPort(Protocol):
    """What the bot needs from a cluster. Implemented by bot.kube (live) and a local one (files)."""

    name: str  # the cluster's configured name, shown in every message

    def resolve_pod(self, namespace: str, name: str) -> str:
        """A pod name for `name`: the pod itself, or the newest crashing pod of a Deployment
        or StatefulSet of that name. Raises PodNotFound with close matches."""

    def collect(self, namespace: str, pod: str, container: str | None = None) -> Evidence:
        """Previous container log (head and tail), pod, node, events."""

    def read_pod(self, namespace: str, pod: str) -> dict[str, Any]:
        """The pod alone (one read), to tell a repeat alert from a new crash. Raises PodNotFound."""

    def workload_for(self, evidence: Evidence) -> WorkloadRef:
        """The owning workload of the evidence's pod, with GitOps/Helm detection."""

    # propose, apply, was_applied and rollback are bot.app.workload_ops over the adapter's
    # WorkloadIO: the adapters only do the I/O, the decisions are written once.
    def propose(self, diagnosis: DiagnosisResult, evidence: Evidence, workload: WorkloadRef) -> Proposal | None:
        """A proposal for `workload` (as `workload_for` resolved it: its owners are not read
        again), bound to that state, dry-run checked; None if the diagnosis has no change."""

    def apply(self, proposal: Proposal, actor: str) -> ApplyResult:
        """Conditional patch (test ops + resourceVersion), audit annotation and Event. Idempotent:
        a proposal whose audit record the workload already carries is not patched again, and an
        ambiguous answer (5xx, timeout) is read back before it is reported."""

    def was_applied(self, proposal: Proposal) -> ApplyResult | None:
        """The result of an earlier apply of this proposal, if the workload carries its audit
        record (whatever the API answered then); None if it does not."""

    def rollback(self, namespace: str, workload_kind: str, workload_name: str, actor: str,
                 change: ChangeToUndo | None = None) -> ApplyResult:
        """Undo `change` (the proposal an incident applied, found by its id and digest in the
        workload's own audit record), else the last applied change; refused when a later change
        or an edit touched the same fields."""

    def verify(self, workload: WorkloadRef, timeout_seconds: float, diagnose: Diagnoser) -> Verification:
        """Follow the rollout until a new pod is Ready or crashes again (diagnosed by `diagnose`)."""


class IncidentStore(Protocol):
    def create(self, incident: Incident) -> Incident:
        """Raises IncidentExists if the name is taken."""

    def get(self, name: str) -> Incident | None: ...

    def update(self, incident: Incident) -> Incident:
        """Compare-and-swap on incident.version; raises IncidentConflict on a lost race."""

    def list(self, state_not: str | None = None, **labels: str) -> list[Incident]:
        """The incidents with these labels (bot.app.incidents.incident_labels), and with
        `state_not`: those not in that state (a resolved alert lists the unresolved only, not
        every incident the namespace ever had)."""


class ChatPort(Protocol):
    def post_incident(self, incident: Incident, channel: str | None = None,
                      thread: MessageRef | None = None) -> MessageRef:
        """Post the incident's message (to its default channel when channel is None; in the thread
        of `thread` when given: its group's), carrying `incident.post_key` so `find_posted` can
        recognise it later. Its details follow in the same thread."""

    def post_group(self, incidents: list[Incident], channel: str | None = None) -> MessageRef:
        """One grouped message naming `incidents` (at most bot.app.grouping.GROUP_LINES), a line
        each: the workload, the cause, the proposed change. Nothing to click: each incident's own
        message follows in its thread."""

    def find_posted(self, channel: str | None, post_key: str, since: datetime,
                    thread: MessageRef | None = None) -> MessageRef | None:
        """The message carrying `post_key` in `channel` (the default channel when None), top-level
        or in the thread of `thread` when given, posted no earlier than `since` (less a margin for
        clock skew); None if there is none. Raises ChatUnavailable when it cannot tell (the chat is
        down, or the history is too long to read within its bounds): never None unless it really looked."""

    def update_incident(self, incident: Incident, message: MessageRef) -> None:
        """Re-render a posted message in place from the incident's current state."""

    def post_details(self, incident: Incident, message: MessageRef) -> None:
        """The incident's details (memory picture, budget, command lines, evidence) as a reply in
        the thread of `message`, marked so `find_details` recognises it. Never raises: the message
        stands without it."""

    def find_details(self, message: MessageRef, incident_name: str) -> bool:
        """Whether the bot's own details reply for `incident_name` is in the thread of `message`.
        Raises ChatUnavailable when it cannot tell."""

    def reply(self, thread: MessageRef, note: Note) -> None:
        """A reply in the thread of `thread`; a note with a key carries it (see find_reply)."""

    def find_reply(self, thread: MessageRef, key: str) -> bool:
        """Whether the bot's own reply with `key` is in the thread of `thread`. Raises
        ChatUnavailable when it cannot tell."""

    def tell_user(self, channel: str, user: str, note: Note) -> None:
        """A message only that user sees (Slack: ephemeral)."""

    def permalink(self, message: MessageRef) -> str | None:
        """A link to `message` (and its thread) people can open; None when the chat has no links.
        Raises ChatUnavailable when the chat could not be asked."""

    def group_members(self, group_id: str) -> set[str]: ...

    def actor(self, user: str) -> str:
        """Who `user` is, for the audit annotation and Event on the workload: a name and the
        chat's id for them. Never raises: without a name (the chat is down), the id alone."""


class TrafficHistory(Protocol):
    """The workload's own request histograms over a window (bot.kube.prometheus.PrometheusTraffic):
    what a new limit would have refused. Raises on an unreachable or refusing source; the
    caller says then that the impact cannot be known."""

    def histograms(self, namespace: str, workload: str, metrics: list[str], hours: float) -> dict[str, Histogram | None]:
        """Per metric, its cumulative buckets summed over the workload's pods, or None: no series."""

    def share_above(self, namespace: str, workload: str, gauge: str, threshold: float, hours: float) -> float | None:
        """The share of the window's minutes in which the busiest pod's `gauge` was above
        `threshold`; None: no series."""
