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

    def is_approver(self, user: str) -> bool:
        if user in self.policy.approver_users:
            return True
        return any(user in self._members(group) for group in self.policy.approver_groups)

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
