"""A mark on an object, by identity: what is known about that very object (not about its
content), dropped with the object, so a later object at the same address never inherits it.

Used where a fact holds for an object the bot made or checked itself and would cost a pass over
its content to establish again: bot.app.redaction (made by this redactor), bot.app.seal (its
seal known to hold). A revised record is a new object, so it starts unmarked."""

from __future__ import annotations

import weakref
from typing import Any, Generic, TypeVar

V = TypeVar("V")


class ObjectMarks(Generic[V]):
    """id(object) -> a value, each entry removed when its object is collected. Thread-safe for
    the one-key operations used here (dict get/set/pop hold the GIL)."""

    def __init__(self) -> None:
        self._marks: dict[int, V] = {}

    def put(self, obj: Any, value: V) -> None:
        key = id(obj)
        if key not in self._marks:
            weakref.finalize(obj, self._marks.pop, key, None)  # before the id can be reused
        self._marks[key] = value

    def get(self, obj: Any) -> V | None:
        return self._marks.get(id(obj))
