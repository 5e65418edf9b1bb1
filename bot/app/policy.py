"""The service's configuration (who may approve, how long a proposal lives, ...) and its clock."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from fnmatch import fnmatchcase
from typing import Literal

from bot.app.links import LinkTemplates
from bot.diagnosis.redact import DEFAULT as DEFAULT_REDACTOR
from bot.diagnosis.redact import Redactor


@dataclass(frozen=True)
class ApproverScope:
    """Approvers of the namespaces matching `namespaces` (a glob, e.g. `ml-*`); when `channels`
    is not empty a click counts only in one of those channels. The chat side parses them from
    its own ID syntax (bot.slack.ids.parse_scopes)."""

    namespaces: str
    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    channels: frozenset[str] = frozenset()

    def covers(self, namespace: str, channel: str | None) -> bool:
        if not fnmatchcase(namespace, self.namespaces):
            return False
        return not self.channels or channel in self.channels


DEFAULT_POST_LEASE = timedelta(seconds=60)
# How long an incident may sit in `applying` before the sweep assumes its applier died or lost the
# answer, and resumes it. An applier starts its patch only while the patch (Policy.patch_seconds,
# with its retries) can end inside the grace.
DEFAULT_APPLY_GRACE = timedelta(minutes=2)


@dataclass
class Policy:
    approver_users: frozenset[str] = frozenset()
    approver_groups: frozenset[str] = frozenset()
    proposal_ttl: timedelta = timedelta(hours=1)
    verify_timeout_seconds: float = 900
    default_namespace: str = "default"
    replica: str = field(default_factory=socket.gethostname)
    group_cache_seconds: float = 60
    # Approvers of some namespaces only (approver_users/approver_groups approve every namespace).
    approver_scopes: tuple[ApproverScope, ...] = ()
    # `/vllm why` for namespace N: "channel" answers only in the alert channel or to N's approvers;
    # "open" answers anyone anywhere. The settings default to "channel"; the dataclass keeps "open".
    why_scope: Literal["channel", "open"] = "open"
    alert_channel: str | None = None  # where incidents are posted (the chat's default channel)
    # Proposals-only mode: diagnose and show the exact change, never offer or accept Approve.
    proposals_only: bool = False
    # The redaction the incident store and the chat apply (built-in rules + configured patterns):
    # a proposal is sealed in the form it is stored and shown, so its digest survives the store.
    redactor: Redactor = field(default=DEFAULT_REDACTOR)
    # How long one posting attempt holds the right to post an incident (bot/app/posting.py). The
    # chat's retries of a post must end inside it, or another replica may post too (build_server
    # derives the Slack post budget from it; Settings checks the Slack timeout leaves room).
    post_lease: timedelta = DEFAULT_POST_LEASE
    # How long an incident may sit in `applying` before the sweep assumes its applier died or lost
    # the answer, and takes it over (bot/app/decisions.py resume_applying).
    apply_grace: timedelta = DEFAULT_APPLY_GRACE
    # The longest one patch of a workload may take with its retries (None: not bounded, e.g. a
    # local cluster). An applier starts the patch only if it can end inside apply_grace from its
    # claim, so the sweep never takes over an apply whose patch may still be in flight.
    patch_seconds: float | None = None
    # The operator's runbook and dashboard URL templates, per cluster (shown in an incident's details).
    links: LinkTemplates = field(default_factory=LinkTemplates)
    # The per-install key sealing the bot's own incident text (bot/app/seal.py); None: not sealed.
    seal_key: bytes | None = None
    # Storms as grouped messages (bot/app/grouping.py): only worth it where posts wait for the
    # channel's turn. Unpaced (a Slack-compatible endpoint without Slack's rate), each incident
    # gets its own message at once, however many crash together.
    group_storms: bool = True


PROPOSALS_ONLY = ("proposals-only mode: this is the change the bot would make; nothing will be applied. "
                  "An admin turns approvals on with VLLM_ONCALL_MODE=approve.")


def utcnow() -> datetime:
    return datetime.now(UTC)
