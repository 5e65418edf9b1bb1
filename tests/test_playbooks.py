"""Playbook files: validated at load, a typo names the file and the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from bot.diagnosis.playbooks import DEFAULT_DIR, PlaybookError, load_dir, load_file, longest_literal

from conftest import FIXTURE_BUNDLES

CAUSES = {
    "kv-cache-max-model-len", "no-kv-cache-memory", "shared-gpu-free-memory", "weights-exceed-gpu",
    "cuda-graph-capture", "sampler-warmup-max-num-seqs", "profiling-activation-oom", "allocator-fragmentation",
    "tensor-parallel-mismatch", "shm-too-small", "host-oom-killed", "probe-killed-during-load",
}

GOOD = """\
id: my-cause
title: A title
summary: one line
priority: 100
when:
  - log: 'Something specific happened'
explanation: it happened
fixes:
  - changes:
      - {kind: flag, name: --enforce-eager, value: enforce_eager_on}
"""


def test_bundled_playbooks_cover_every_cause():
    books = load_dir()
    assert {b.id for b in books} == CAUSES
    assert [b.priority for b in books] == sorted((b.priority for b in books), reverse=True)


def test_every_playbook_has_a_fixture_case():
    """A new cause is a YAML file plus a test case: this keeps the second half honest."""
    if not FIXTURE_BUNDLES.is_dir():
        pytest.skip("no fixture bundles yet")
    covered = {json.loads(p.read_text())["cause"] for p in FIXTURE_BUNDLES.glob("*/expected.json")}
    assert CAUSES <= covered, CAUSES - covered


def write(tmp_path: Path, text: str, name: str = "my-cause.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_a_good_playbook_loads(tmp_path):
    book = load_file(write(tmp_path, GOOD))
    assert book.allowed() == {("flag", "--enforce-eager")}
    assert book.literals() == ["Something specific happened"]


@pytest.mark.parametrize("broken, field, words", [
    (GOOD.replace("explanation:", "explanaton:"), "explanaton", "unknown field"),
    (GOOD.replace("value: enforce_eager_on", "value: enforce_eager_onn"), "fixes.0.changes.0.value", "did you mean 'enforce_eager_on'"),
    (GOOD.replace("- log: 'Something specific happened'", "- signal: oom_anyy"), "when.0", "unknown signal 'oom_anyy'"),
    (GOOD.replace("'Something specific happened'", "'(unclosed'"), "when.0", "not a valid regex"),
    (GOOD.replace("'Something specific happened'", "'\\d+ x'"), "when.0", "no literal of 4+ characters"),
    (GOOD.replace("name: --enforce-eager", "name: --enforce_eager"), "fixes.0.changes.0", "--dash-form"),
    (GOOD.replace("kind: flag", "kind: flags"), "fixes.0.changes.0.kind", "Input should be"),
    (GOOD.replace("priority: 100", "priority: lots"), "priority", "valid integer"),
])
def test_a_typo_names_the_file_and_the_field(tmp_path, broken, field, words):
    path = write(tmp_path, broken)
    with pytest.raises(PlaybookError) as err:
        load_file(path)
    message = str(err.value)
    assert str(path) in message
    assert f"`{field}" in message
    assert words in message


def test_id_must_match_file_name(tmp_path):
    with pytest.raises(PlaybookError, match="must match the file name"):
        load_file(write(tmp_path, GOOD, name="other.yaml"))


def test_broken_yaml_names_the_file(tmp_path):
    path = write(tmp_path, "id: [unclosed\n")
    with pytest.raises(PlaybookError, match="not valid YAML"):
        load_file(path)


def test_a_new_cause_needs_only_a_yaml_file(tmp_path):
    """Drop a playbook in a folder: its literal is scanned for, it matches, its change is computed."""
    from bot.diagnosis.diagnose import diagnose
    from bot.diagnosis.evidence import load_log

    folder = tmp_path / "books"
    shutil.copytree(DEFAULT_DIR, folder)
    (folder / "my-cause.yaml").write_text(GOOD.replace("priority: 100", "priority: 999"))
    log = tmp_path / "x.log"
    log.write_text("INFO 01-01 00:00:00 [x.py:1] start\nSomething specific happened here\n")
    result = diagnose(load_log(log), load_dir(folder))
    assert result.cause == "my-cause"
    assert [(c.name, c.after) for c in result.changes] == [("--enforce-eager", "true")]
    assert "Something specific happened here" in result.evidence


@pytest.mark.parametrize("regex, literal", [
    (r"max seq len \(\d+\) is larger than", ") is larger than"),
    (r"No available memory for the cache blocks", "No available memory for the cache blocks"),
    (r"Free memory on device(?: \S+)? \(", "Free memory on device"),
    (r"a|b", None),
    (r"colou?r scheme", "r scheme"),
])
def test_longest_literal(regex, literal):
    assert longest_literal(regex) == (literal.strip() if literal else None)
