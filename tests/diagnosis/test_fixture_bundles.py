"""Our own evidence bundles (tests/fixtures/bundles), written from ../shared/reference formats.

Each is diagnosed like a real incident and scored like the shared corpus: the right cause,
a change that pulls a labelled lever, --max-model-len within what the log says fits, and no
change at all when the cause is unknown. The causes come from the playbooks themselves: a
new playbook without a bundle fails here.
"""

from __future__ import annotations

import json

import pytest
from builders import FIXTURE_BUNDLES

from bot.diagnosis.evaluate import score_case
from bot.diagnosis.playbooks import load_dir

CASES = sorted(p for p in FIXTURE_BUNDLES.glob("*") if (p / "expected.json").is_file())
PLAYBOOKS = load_dir()
EXPECTED = {p.name: json.loads((p / "expected.json").read_text())["cause"] for p in CASES}


@pytest.mark.parametrize("case", CASES, ids=[p.name for p in CASES])
def test_fixture_bundle(case):
    result = score_case(case)
    assert result.got == result.expected, result
    assert not result.wrong_fix
    if result.expected is not None:
        assert result.lever_pulled, result


@pytest.mark.parametrize("book", PLAYBOOKS, ids=[b.id for b in PLAYBOOKS])
def test_every_playbook_has_a_fixture_bundle(book):
    """A new cause is a YAML file plus a test case: this keeps the second half honest."""
    assert book.id in EXPECTED.values(), f"no bundle under {FIXTURE_BUNDLES} expects {book.id!r}"


def test_every_bundle_expects_a_playbook_or_no_cause():
    known = {b.id for b in PLAYBOOKS}
    assert {name: cause for name, cause in EXPECTED.items() if cause is not None and cause not in known} == {}
    assert None in EXPECTED.values()  # the "no known cause" path has bundles too
