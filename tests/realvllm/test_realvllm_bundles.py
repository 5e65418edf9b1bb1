"""The logs real vLLM printed in the scenarios (tests/fixtures/realvllm/, kept by `make vllm-fixtures`)
diagnosed as bundles, in every run: no real vLLM needed. Each expected.json names the cause, the
vLLM version that printed the log and, where the log says what fits, the largest --max-model-len."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.diagnosis.diagnose import diagnose
from bot.diagnosis.evidence import load_bundle

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "realvllm"
CASES = sorted(p for p in FIXTURES.glob("*") if (p / "expected.json").is_file())


@pytest.mark.parametrize("case", CASES, ids=[p.name for p in CASES])
def test_real_vllm_log_is_diagnosed(case):
    expected = json.loads((case / "expected.json").read_text())
    result = diagnose(load_bundle(case))
    assert result.cause == expected["cause"], (result.cause, result.title)
    if expected["cause"] is None:
        assert result.changes == []
    for change in expected.get("changes", []):
        assert any(c.name == change["name"] and (change.get("after") is None or c.after == change["after"])
                   for c in result.changes), result.changes
    if "max_model_len_at_most" in expected:
        (mml,) = [c for c in result.changes if c.name == "--max-model-len"]
        assert 0 < int(mml.after) <= expected["max_model_len_at_most"]


def test_every_bundle_names_its_vllm_version_and_holds_no_machine_path():
    for case in CASES:
        expected = json.loads((case / "expected.json").read_text())
        assert expected.get("vllm_version"), case.name
        for f in case.iterdir():
            text = f.read_text()
            for leaked in ("/work/", ".vllm-venv", "/.cache/", "pytest-of-"):
                assert leaked not in text, f"{case.name}/{f.name} names {leaked}"
            assert f.stat().st_size < 64_000, f"{case.name}/{f.name} is too big for a fixture"
