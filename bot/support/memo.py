"""Answers kept for short texts: a bounded cache in front of a pure function of one string.

A diagnosis asks the same few questions about the same short texts again and again (a flag's
canonical spelling, a version's key, a model name's catalogue entry), so their answers are kept,
at most `maxsize` of them, least recently used first out. A text longer than `max_chars` is
answered each time and never kept: such a text comes only from a forged manifest or log, and
keeping it would let input, not the bot, decide how much memory the cache holds."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

R = TypeVar("R")


def kept_for_short_texts(max_chars: int, maxsize: int) -> Callable[[Callable[[str], R]], Callable[[str], R]]:
    def wrap(answer: Callable[[str], R]) -> Callable[[str], R]:
        kept = functools.lru_cache(maxsize=maxsize)(answer)

        @functools.wraps(answer)
        def ask(text: str) -> R:
            return kept(text) if len(text) <= max_chars else answer(text)

        return ask

    return wrap
