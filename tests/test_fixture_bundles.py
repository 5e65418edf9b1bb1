"""Our own evidence bundles (tests/fixtures/bundles), written from ../shared/reference formats.

Each is diagnosed like a real incident and scored like the shared corpus: the right cause,
a change that pulls a labelled lever, --max-model-len within what the log says fits, and no
change at all when the cause is unknown.
"""

from __future__ import annotations

import pytest

from bot.diagnosis.evaluate import score_case

from conftest import FIXTURE_BUNDLES

CASES = sorted(p for p in FIXTURE_BUNDLES.glob("*") if (p / "expected.json").is_file())


@pytest.mark.parametrize("case", CASES, ids=[p.name for p in CASES])
def test_fixture_bundle(case):
    result = score_case(case)
    assert result.got == result.expected, result
    assert not result.wrong_fix
    if result.expected is not None:
        assert result.lever_pulled, result
