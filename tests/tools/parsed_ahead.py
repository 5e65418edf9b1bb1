"""Rewrite bot/support/parsed_ahead.jsonl: the shipped YAML files the bot reads on every
diagnose, parsed ahead of time (issue 20; bot.support.yamlload reads the table).

One line per file: the SHA-256 of its text, the file (for a reader of the diff) and its
document as JSON, tab-separated. A document JSON cannot hold exactly (a key that is not a
string, a date) is refused, so a hit always gives what PyYAML would have.

    python tests/tools/parsed_ahead.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
TABLE = ROOT / "bot" / "support" / "parsed_ahead.jsonl"


def sources() -> list[Path]:
    """The YAML files read through bot.support.yamlload at run time (a bundle's files are not ours)."""
    return [*sorted((ROOT / "playbooks").glob("*.yaml")), ROOT / "bot" / "diagnosis" / "data" / "models.yaml",
            ROOT / "bot" / "diagnosis" / "data" / "accelerators.yaml", ROOT / "bot" / "diagnosis" / "vllm_flags.yaml"]


def line_for(path: Path) -> str:
    from bot.support.yamlload import text_key

    text = path.read_text(encoding="utf-8")
    doc = yaml.safe_load(text)
    as_json = json.dumps(doc, separators=(",", ":"))  # ASCII: no character splits a line
    if repr(json.loads(as_json)) != repr(doc):
        raise SystemExit(f"{path}: its document does not survive JSON exactly; leave it out of the table")
    return f"{text_key(text)}\t{path.relative_to(ROOT)}\t{as_json}\n"


def write(out: Path = TABLE) -> None:
    out.write_text("".join(line_for(p) for p in sources()), encoding="utf-8")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    write()
