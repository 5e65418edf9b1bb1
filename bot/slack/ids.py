"""Slack's ID syntax, in one place: U/W users, S user groups, C/G channels, and the approver
scopes written with them (`ns-glob=U1,S2,@C3;other-*=U4`). The application only ever sees the
parsed `ApproverScope`s (bot.app.policy); it does not know what a Slack ID looks like."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from bot.app.policy import ApproverScope

USER_PREFIXES = ("U", "W")  # W: an Enterprise Grid user
GROUP_PREFIX = "S"
CHANNEL_PREFIXES = ("C", "G")  # G: a private channel (older workspaces)


def is_user(value: str) -> bool:
    return value[:1] in USER_PREFIXES


def is_group(value: str) -> bool:
    return value.startswith(GROUP_PREFIX)


def is_channel(value: str) -> bool:
    """A channel ID (C0123ABCDEF), not a #name."""
    return value[:1] in CHANNEL_PREFIXES and value[1:].isalnum() and value == value.upper() and len(value) >= 3


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
    users = {m for m in members if is_user(m)}
    groups = {m for m in members if is_group(m)}
    channels = {m[1:] for m in members if m.startswith("@") and m[1:2] in CHANNEL_PREFIXES}
    bad = [m for m in members if m not in users | groups and m[1:] not in channels]
    if bad:
        raise ValueError(f"{glob}: {', '.join(bad)} is not a user (U/W), user group (S) or channel (@C)")
    if not users and not groups:
        raise ValueError(f"{glob}: names no approver (U/W user or S user group)")
    return ApproverScope(glob, frozenset(users), frozenset(groups), frozenset(channels))
