"""The flag table the bot reads (data/vllm_flag_history.json) is the reviewed YAML, exactly.

The JSON is the form parsed on every start (issue 20: 0.5 ms against 20-25 ms for the YAML);
tests/tools/vllm_flags_table.py writes both. A hand edit of one of them fails here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from bot.diagnosis import vllm_versions

TOOLS = Path(__file__).resolve().parents[1] / "tools"


def test_the_json_table_holds_the_yaml_document_exactly() -> None:
    from_yaml = yaml.safe_load(vllm_versions.TABLE_FILE.read_text(encoding="utf-8"))
    from_json = json.loads(vllm_versions.TABLE_JSON.read_text(encoding="utf-8"))

    assert from_json == from_yaml, ("bot/diagnosis/data/vllm_flag_history.json differs from the YAML: regenerate "
                                    "both with tests/tools/vllm_flags_table.py")
    assert list(from_json["flags"]) == list(from_yaml["flags"])  # the same order too (== on dicts ignores it)


def test_the_table_read_is_the_yaml_table() -> None:
    table = vllm_versions.TABLE()
    doc = yaml.safe_load(vllm_versions.TABLE_FILE.read_text(encoding="utf-8"))

    assert table.releases == tuple(doc["releases"])
    assert set(table.flags) == set(doc["flags"])
    assert table.flags["--max-model-len"].ranges == tuple(vllm_versions._range(r) for r in doc["flags"]["--max-model-len"]["in"])


def test_the_generator_writes_json_that_reads_back_as_the_document(tmp_path: Path) -> None:
    sys.path.insert(0, str(TOOLS))
    try:
        import vllm_flags_table
    finally:
        sys.path.remove(str(TOOLS))
    doc = {"releases": ["0.6.0", "0.33.0"], "flags": {"--b": {"in": ["0.6.0..0.33.0"], "boolean": True},
                                                      "--a": {"in": ["0.33.0"], "aliases": ["-a"]}}}
    out = tmp_path / "table.json"

    vllm_flags_table.write_json(doc, out)

    back = json.loads(out.read_text(encoding="utf-8"))
    assert back == doc and list(back["flags"]) == ["--b", "--a"]
