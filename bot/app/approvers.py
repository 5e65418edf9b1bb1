"""Who may approve, reject and roll back: configured users, and members of configured chat
user groups (read through the chat, cached briefly, and refused when unreadable)."""

from __future__ import annotations

import logging
import threading
import time

from bot.app.policy import Policy
from bot.app.ports import ChatPort, ChatUnavailable

log = logging.getLogger(__name__)


class Approvers:
    def __init__(self, policy: Policy, chat: ChatPort):
        # The policy is read at every check, so a change to it applies at once.
        self.policy, self.chat = policy, chat
        self._group_cache: dict[str, tuple[float, set[str]]] = {}
        self._group_lock = threading.Lock()

    def is_approver(self, user: str, namespace: str | None = None, channel: str | None = None) -> bool:
        """`user` may decide in `namespace` (clicking in `channel`): a flat approver (every
        namespace, any channel), or one of a scope that covers the namespace and the channel.
        `namespace` None: an approver of any namespace at all (a first check before reading)."""
        if self._member(user, self.policy.approver_users, self.policy.approver_groups):
            return True
        return any(self._member(user, scope.users, scope.groups) for scope in self.policy.approver_scopes
                   if namespace is None or scope.covers(namespace, channel))

    def _member(self, user: str, users: frozenset[str], groups: frozenset[str]) -> bool:
        return user in users or any(user in self._members(group) for group in groups)

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
