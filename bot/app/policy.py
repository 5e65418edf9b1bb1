"""The service's configuration (who may approve, how long a proposal lives, ...) and its clock."""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from bot.diagnosis.redact import DEFAULT as DEFAULT_REDACTOR
from bot.diagnosis.redact import Redactor


@dataclass
class Policy:
    approver_users: frozenset[str] = frozenset()
    approver_groups: frozenset[str] = frozenset()
    proposal_ttl: timedelta = timedelta(hours=1)
    verify_timeout_seconds: float = 900
    default_namespace: str = "default"
    replica: str = field(default_factory=socket.gethostname)
    group_cache_seconds: float = 60
    # Proposals-only mode: diagnose and show the exact change, never offer or accept Approve.
    proposals_only: bool = False
    # The redaction the incident store and the chat apply (built-in rules + configured patterns):
    # a proposal is sealed in the form it is stored and shown, so its digest survives the store.
    redactor: Redactor = field(default=DEFAULT_REDACTOR)


PROPOSALS_ONLY = ("proposals-only mode: this is the change the bot would make; nothing will be applied. "
                  "An admin turns approvals on with VLLM_ONCALL_MODE=approve.")


def utcnow() -> datetime:
    return datetime.now(UTC)
