"""The service's configuration (who may approve, how long a proposal lives, ...) and its clock."""

from __future__ import annotations

import socket
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from fnmatch import fnmatchcase
from typing import Literal

from bot.diagnosis.redact import DEFAULT as DEFAULT_REDACTOR
from bot.diagnosis.redact import Redactor


@dataclass(frozen=True)
class ApproverScope:
    """Approvers of the namespaces matching `namespaces` (a glob, e.g. `ml-*`); when `channels`
    is not empty a click counts only in one of those channels."""

    namespaces: str
    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    channels: frozenset[str] = frozenset()

    def covers(self, namespace: str, channel: str | None) -> bool:
        if not fnmatchcase(namespace, self.namespaces):
            return False
        return not self.channels or channel in self.channels


def parse_scopes(value: str | Mapping[str, Iterable[str] | str]) -> tuple[ApproverScope, ...]:
    """`ns-glob=U1,S2,@C3;other-*=U4` (or the same as a mapping glob -> list): U/W users, S
    user groups, @C channels where a click counts. Raises ValueError naming the bad part."""
    if isinstance(value, str):
        pairs: list[tuple[str, list[str]]] = []
        for part in (p.strip() for p in value.split(";")):
            if not part:
                continue
            glob, eq, members = part.partition("=")
            if not eq:
                raise ValueError(f"{part!r}: expected NAMESPACE-GLOB=U1,S2,@C3")
            pairs.append((glob.strip(), [m.strip() for m in members.split(",") if m.strip()]))
    elif isinstance(value, Mapping):
        pairs = [(str(g).strip(), [m.strip() for m in ([ms] if isinstance(ms, str) else list(ms or []))])
                 for g, ms in value.items()]
    else:
        raise ValueError("expected NAMESPACE-GLOB=U1,S2,@C3;... or a mapping of globs to lists")
    return tuple(_scope(glob, members) for glob, members in pairs)


def _scope(glob: str, members: list[str]) -> ApproverScope:
    if not glob:
        raise ValueError("a scope needs a namespace or namespace glob before =")
    users = {m for m in members if m[:1] in ("U", "W")}
    groups = {m for m in members if m.startswith("S")}
    channels = {m[1:] for m in members if m.startswith("@") and m[1:2] in ("C", "G")}
    bad = [m for m in members if m not in users | groups and m[1:] not in channels]
    if bad:
        raise ValueError(f"{glob}: {', '.join(bad)} is not a user (U/W), user group (S) or channel (@C)")
    if not users and not groups:
        raise ValueError(f"{glob}: names no approver (U/W user or S user group)")
    return ApproverScope(glob, frozenset(users), frozenset(groups), frozenset(channels))


DEFAULT_POST_LEASE = timedelta(seconds=60)
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


PROPOSALS_ONLY = ("proposals-only mode: this is the change the bot would make; nothing will be applied. "
                  "An admin turns approvals on with VLLM_ONCALL_MODE=approve.")


def utcnow() -> datetime:
    return datetime.now(UTC)
