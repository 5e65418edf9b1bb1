"""Remove secrets from log text before it leaves the bot (chat message, LLM prompt, ticket)."""

from __future__ import annotations

import re

_PATTERNS = [
    (re.compile(r"\bhf_[A-Za-z0-9]{20,}"), "hf_***"),
    (re.compile(r"\b(sk-(?:proj-)?[A-Za-z0-9_-]{16,})"), "sk-***"),
    (re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}"), "xox*-***"),
    (re.compile(r"\bgh[pousr]_[A-Za-z0-9]{20,}"), "gh*_***"),
    (re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]{8,}"), r"\1***"),
    (re.compile(r"(?i)\b([A-Z0-9_]*(?:TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|ACCESS_KEY)[A-Z0-9_]*)(\s*[=:]\s*)(['\"]?)[^\s'\",}]+"),
     r"\1\2\3***"),
    (re.compile(r"(?i)(https?://[^\s:/@]+:)[^\s@/]+@"), r"\1***@"),
]


def redact(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text
