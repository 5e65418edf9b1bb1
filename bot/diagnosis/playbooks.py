"""Playbooks: one YAML file per crash cause, validated at load.

A playbook says when it matches (conditions over log lines, facts and the pod), how specific
it is (priority: the stage where vLLM died beats boilerplate hints), how to explain it, and
which changes it may propose. The values of those changes come from named formulas in
`bot.formulas`; the YAML names them, so a typo is caught at load with the file and field.

Condition grammar (a list means: all must hold):
    - log: 'regex'            a line of the log matches (the regex must hold a literal of 4+
                              characters, or give one with `literal:`, so the one-pass reader
                              knows which lines to keep)
    - signal: name            a derived fact (see bot.signals.SIGNALS) is truthy
      is / in / above / below / at_least / at_most: value   ...or compares so
    - any: [conditions]       at least one holds
    - all: [conditions]       every one holds
    - not: condition          it does not hold
"""

from __future__ import annotations

import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from bot.diagnosis.models import ChangeKind

DEFAULT_DIR = Path(__file__).resolve().parents[2] / "playbooks"


class PlaybookError(Exception):
    """A playbook file that cannot be used; the message names the file and the field."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Condition(Strict):
    log: str | None = None
    literal: str | None = None
    signal: str | None = None
    is_: Any = Field(default=None, alias="is")
    in_: list[Any] | None = Field(default=None, alias="in")
    above: float | None = None
    below: float | None = None
    at_least: float | None = None
    at_most: float | None = None
    any: list["Condition"] | None = None
    all: list["Condition"] | None = None
    not_: "Condition | None" = Field(default=None, alias="not")

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    @model_validator(mode="after")
    def one_kind(self) -> "Condition":
        kinds = [k for k in ("log", "signal", "any", "all", "not_") if getattr(self, k) is not None]
        if len(kinds) != 1:
            raise ValueError("a condition is exactly one of `log`, `signal`, `any`, `all`, `not`")
        if self.log is not None:
            try:
                re.compile(self.log)
            except re.error as exc:
                raise ValueError(f"`log` is not a valid regex: {exc}") from None
            if not self.gate():
                raise ValueError("`log` regex has no literal of 4+ characters: add `literal:`")
        if self.signal is not None:
            from bot.diagnosis.signals import SIGNALS

            if self.signal not in SIGNALS:
                close = _close(self.signal, SIGNALS)
                raise ValueError(f"unknown signal {self.signal!r}{close}")
        return self

    def gate(self) -> str | None:
        """For a `log` condition: the literal a line must hold before its regex is tried."""
        return (self.literal or longest_literal(self.log)) if self.log is not None else None

    def literals(self) -> list[str]:
        out: list[str] = []
        if self.log is not None:
            out.append(self.gate() or "")
        for c in (self.any or []) + (self.all or []):
            out.extend(c.literals())
        if self.not_ is not None:
            out.extend(self.not_.literals())
        return [x for x in out if x]


class ChangeSpec(Strict):
    kind: ChangeKind
    name: str
    value: str  # formula name in bot.formulas
    optional: bool = False  # when the formula has nothing to change, the rest of the fix still stands
    min: float | None = None
    max: float | None = None

    @field_validator("value")
    @classmethod
    def known_formula(cls, v: str) -> str:
        from bot.diagnosis.formulas import FORMULAS

        if v not in FORMULAS:
            raise ValueError(f"unknown formula {v!r}{_close(v, FORMULAS)}")
        return v

    @model_validator(mode="after")
    def flag_spelling(self) -> "ChangeSpec":
        if self.kind == "flag" and not re.fullmatch(r"--[a-z0-9][a-z0-9-]*", self.name):
            raise ValueError(f"flag name {self.name!r} must be in --dash-form")
        if self.kind == "resources" and not re.fullmatch(r"(limits|requests)\.[\w./-]+", self.name):
            raise ValueError(f"resource name {self.name!r} must look like limits.memory")
        return self


class Fix(Strict):
    """One way to fix the cause; the first fix whose values can all be computed is proposed."""

    changes: list[ChangeSpec] = Field(min_length=1)
    note: str | None = None


class Playbook(Strict):
    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    title: str
    summary: str  # one line for `/vllm playbooks`
    priority: int = Field(ge=0, le=1000)
    confidence: Literal["high", "medium", "low"] = "high"
    when: list[Condition] = Field(min_length=1)
    explanation: str
    evidence: list[str] = Field(default_factory=list)  # signals whose source lines to show
    fixes: list[Fix] = Field(default_factory=list)
    source: str = ""  # the file it came from

    def literals(self) -> list[str]:
        return [lit for c in self.when for lit in c.literals()]

    def allowed(self) -> set[tuple[str, str]]:
        """(kind, name) pairs this playbook may change: nothing else is ever applied."""
        return {(c.kind, c.name) for f in self.fixes for c in f.changes}


def _close(name: str, known: Any) -> str:
    import difflib

    match = difflib.get_close_matches(name, list(known), n=1)
    return f" (did you mean {match[0]!r}?)" if match else ""


_META = set(".^$*+?{}[]()|")


def longest_literal(regex: str) -> str | None:
    """The longest run of plain characters every match of `regex` must contain (4+ chars).

    Only top-level text counts (not inside groups or alternations), and a character
    followed by a quantifier that allows zero is dropped, so the run is really required.
    """
    if re.search(r"(?<!\\)\|", _strip_groups(regex)):
        return None
    best, run, depth, i = "", "", 0, 0
    while i < len(regex):
        ch = regex[i]
        if ch == "\\" and i + 1 < len(regex):
            nxt = regex[i + 1]
            if nxt.isalnum():  # \d \s \w \b ...: a class, not a literal
                best, run = max(best, run, key=len), ""
            elif depth == 0:
                run += nxt
            i += 2
            continue
        if ch in "([":
            if depth == 0:
                best, run = max(best, run, key=len), ""
            depth += 1
            if ch == "[":
                close = regex.find("]", i + 2)
                i = close + 1 if close != -1 else len(regex)
                depth -= 1
                continue
        elif ch == ")":
            depth = max(0, depth - 1)
        elif ch in "?*{" and depth == 0:
            run = run[:-1]
            best, run = max(best, run, key=len), ""
        elif ch in _META:
            if depth == 0:
                best, run = max(best, run, key=len), ""
        elif depth == 0:
            run += ch
        i += 1
    best = max(best, run, key=len).strip()
    return best if len(best) >= 4 else None


def _strip_groups(regex: str) -> str:
    out, depth, i = [], 0, 0
    while i < len(regex):
        ch = regex[i]
        if ch == "\\":
            if depth == 0:
                out.append(regex[i : i + 2])
            i += 2
            continue
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
        i += 1
    return "".join(out)


def _format_error(path: Path, exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown field (typo?)"
        lines.append(f"{path}: field `{loc}`: {msg}")
    return "\n".join(lines)


def load_file(path: Path) -> Playbook:
    try:
        doc = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as exc:
        raise PlaybookError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(doc, dict):
        raise PlaybookError(f"{path}: a playbook is a mapping with id, title, when, ...")
    try:
        pb = Playbook.model_validate({**doc, "source": str(path)})
    except ValidationError as exc:
        raise PlaybookError(_format_error(path, exc)) from None
    if pb.id != path.stem:
        raise PlaybookError(f"{path}: field `id`: {pb.id!r} must match the file name {path.stem!r}")
    return pb


def load_dir(folder: Path | str | None = None) -> list[Playbook]:
    folder = Path(folder) if folder else DEFAULT_DIR
    if not folder.is_dir():
        raise PlaybookError(f"{folder}: no playbooks folder")
    books = [load_file(p) for p in sorted(folder.glob("*.yaml"))]
    if not books:
        raise PlaybookError(f"{folder}: no *.yaml playbooks")
    return sorted(books, key=lambda b: -b.priority)


@lru_cache(maxsize=8)
def default_playbooks(folder: str | None = None) -> tuple[Playbook, ...]:
    return tuple(load_dir(folder))
