"""YAML parsed by libyaml when PyYAML has it: the same objects as `yaml.safe_load`, several
times faster (issue 20: the playbooks and the flag-history table are parsed by every diagnose).

A document libyaml refuses is parsed again by the pure-Python loader, so the error a user sees
(problem and line) is the one PyYAML has always given.

The YAML files shipped with the package (the playbooks, the model catalogue, the accelerator
table, vLLM's names) are parsed ahead of time: parsed_ahead.jsonl holds each one's document as
JSON, keyed by the SHA-256 of its text. Reading one is then a JSON parse, and a command that
reads no other YAML never imports PyYAML: 0.4 ms for all of them against ~25 ms to import
PyYAML and parse them (issue 20). A text the table does not hold (an edited playbook, a bundle's
pod.yaml) is parsed as YAML, so a stale table is slower, never wrong; `python
tests/tools/parsed_ahead.py` rewrites it and tests/diagnosis/test_parsed_ahead.py fails while
it is stale."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from yaml import YAMLError as YAMLError  # PyYAML's own class, re-exported
else:

    def __getattr__(name: str) -> Any:
        """`yamlload.YAMLError` is PyYAML's error class, imported when asked for. An except clause
        names it only while an exception is being matched, so the import waits for a failure."""
        if name == "YAMLError":
            import yaml

            return yaml.YAMLError
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


PARSED_AHEAD = Path(__file__).with_name("parsed_ahead.jsonl")  # lines: sha256 <TAB> source file <TAB> JSON


def text_key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@lru_cache(maxsize=1)
def _parsed_ahead() -> dict[str, str]:
    """Each shipped text's key -> its document as JSON text (parsed on each read, so every caller
    gets its own objects to change)."""
    try:
        lines = PARSED_AHEAD.read_text(encoding="utf-8").split("\n")
    except OSError:  # pragma: no cover - a package built without the table: everything is parsed as YAML
        return {}
    table = {}
    for line in filter(None, lines):
        key, _source, doc = line.split("\t", 2)
        table[key] = doc
    return table


def safe_load(text: str) -> Any:
    ahead = _parsed_ahead().get(text_key(text))
    if ahead is not None:
        return json.loads(ahead)
    return _parse(text)


def _parse(text: str) -> Any:
    """The text parsed as YAML, never looked up in the table."""
    import yaml

    fast: Any = getattr(yaml, "CSafeLoader", None)
    if fast is None:  # pragma: no cover - PyYAML built without libyaml
        return yaml.safe_load(text)
    try:
        return yaml.load(text, Loader=fast)
    except yaml.YAMLError:
        return yaml.safe_load(text)  # raises with the pure loader's message
