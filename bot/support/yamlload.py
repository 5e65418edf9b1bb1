"""YAML parsed by libyaml when PyYAML has it: the same objects as `yaml.safe_load`, several
times faster (issue 20: the playbooks and the flag-history table are parsed by every diagnose).

A document libyaml refuses is parsed again by the pure-Python loader, so the error a user sees
(problem and line) is the one PyYAML has always given."""

from __future__ import annotations

from typing import Any

import yaml

_FAST: Any = getattr(yaml, "CSafeLoader", None)


def safe_load(text: str) -> Any:
    if _FAST is None:  # pragma: no cover - PyYAML built without libyaml
        return yaml.safe_load(text)
    try:
        return yaml.load(text, Loader=_FAST)
    except yaml.YAMLError:
        return yaml.safe_load(text)  # raises with the pure loader's message
