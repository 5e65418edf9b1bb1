"""The shipped YAML files are parsed ahead of time (bot/support/parsed_ahead.jsonl, issue 20): a
text the table holds reads as the document PyYAML gives, exactly; any other text is parsed as
YAML; and a stale table fails here (regenerate it with tests/tools/parsed_ahead.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bot.support import yamlload

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))
import parsed_ahead  # noqa: E402 - the generator, beside the other table tools

sys.path.remove(str(TOOLS))


@pytest.mark.parametrize("path", parsed_ahead.sources(), ids=lambda p: p.name)
def test_each_shipped_file_reads_from_the_table_as_pyyaml_parses_it(path: Path) -> None:
    text = path.read_text(encoding="utf-8")

    assert yamlload.text_key(text) in yamlload._parsed_ahead(), (
        f"{path} changed since bot/support/parsed_ahead.jsonl was written: run python tests/tools/parsed_ahead.py")
    assert repr(yamlload.safe_load(text)) == repr(yaml.safe_load(text))  # repr: 910 and '910' differ, 1 and 1.0 too


def test_the_table_holds_the_shipped_files_only() -> None:
    assert len(yamlload._parsed_ahead()) == len(parsed_ahead.sources())


def test_the_generator_writes_the_table_read(tmp_path: Path) -> None:
    out = tmp_path / "table.jsonl"

    parsed_ahead.write(out)

    assert out.read_text(encoding="utf-8") == yamlload.PARSED_AHEAD.read_text(encoding="utf-8")


def test_an_edited_playbook_is_parsed_as_yaml() -> None:
    shipped = (parsed_ahead.ROOT / "playbooks" / "cuda-graph-capture.yaml").read_text(encoding="utf-8")
    edited = shipped.replace("title:", "title: EDITED", 1)

    assert yamlload.safe_load(edited)["title"].startswith("EDITED")
    assert yamlload.safe_load(edited) == yaml.safe_load(edited)


def test_each_read_gives_its_own_objects() -> None:
    text = (parsed_ahead.ROOT / "bot" / "diagnosis" / "vllm_flags.yaml").read_text(encoding="utf-8")
    first = yamlload.safe_load(text)
    first.clear()

    assert yamlload.safe_load(text) == yaml.safe_load(text) != {}


def test_bad_yaml_raises_pyyaml_own_error() -> None:
    with pytest.raises(yamlload.YAMLError) as caught:
        yamlload.safe_load("a: [1, 2\nb: 3\n")

    assert isinstance(caught.value, yaml.YAMLError) and caught.value.problem_mark is not None


def test_a_log_alone_is_diagnosed_without_importing_pyyaml(tmp_path: Path) -> None:
    """Every YAML file such a run reads (the playbooks, vLLM's names) comes from the table."""
    log = tmp_path / "x.log"
    log.write_text("ERROR 06-01 10:00:12 [core.py:708] ValueError: No available memory for the cache blocks. Try "
                   "increasing `gpu_memory_utilization` when initializing the engine.\n")
    probe = ("import contextlib, io, sys\nfrom bot.cli import main\nwith contextlib.redirect_stdout(io.StringIO()):\n"
             "    assert main(sys.argv[1:]) == 0\nprint('yaml' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe, "diagnose", "--log", str(log)], capture_output=True, text=True,
                          check=True)

    assert done.stdout.split() == ["False"]
