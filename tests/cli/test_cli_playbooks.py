"""Extra playbook folders (--playbooks DIR, repeatable; VLLM_ONCALL_PLAYBOOKS): merged over the
bundled playbooks, a same id replacing the bundled one."""

from __future__ import annotations

import logging
import shutil

import pytest

from bot.cli import main
from bot.cli.books import extra_dirs, load_books
from bot.diagnosis.playbooks import DEFAULT_DIR, PlaybookError, load_dir


def custom_folder(tmp_path, name="custom", title="Custom - shared memory too small"):
    folder = tmp_path / name
    folder.mkdir()
    text = (DEFAULT_DIR / "shm-too-small.yaml").read_text()
    (folder / "shm-too-small.yaml").write_text(text.replace(text.splitlines()[1], f"title: {title}"))
    (folder / "site-only.yaml").write_text(text.replace("id: shm-too-small", "id: site-only")
                                           .replace("priority: 940", "priority: 1"))
    return folder


def test_no_extra_folder_means_the_bundled_playbooks_unchanged():
    assert load_books([]) is None


def test_same_id_replaces_and_is_logged_new_id_is_added(tmp_path, caplog):
    folder = custom_folder(tmp_path)
    with caplog.at_level(logging.INFO, logger="bot.diagnosis.playbooks"):
        books = load_books([folder])
    by_id = {b.id: b for b in books}
    assert len(books) == len(load_dir()) + 1
    assert by_id["shm-too-small"].title == "Custom - shared memory too small"
    assert by_id["shm-too-small"].source == str(folder / "shm-too-small.yaml")
    assert "site-only" in by_id
    assert "playbook shm-too-small from" in caplog.text and "replaces" in caplog.text
    assert [b.priority for b in books] == sorted((b.priority for b in books), reverse=True)


def test_later_folders_win_and_an_empty_folder_adds_nothing(tmp_path):
    first, second = custom_folder(tmp_path, "a", "from a"), custom_folder(tmp_path, "b", "from b")
    empty = tmp_path / "empty"
    empty.mkdir()
    books = {b.id: b for b in load_books([first, second, empty])}
    assert books["shm-too-small"].title == "from b"


def test_a_missing_folder_or_a_broken_playbook_is_an_error(tmp_path):
    with pytest.raises(PlaybookError, match="no playbooks folder"):
        load_books([tmp_path / "typo"])
    folder = custom_folder(tmp_path)
    (folder / "site-only.yaml").write_text("id: site-only\n")
    with pytest.raises(PlaybookError, match="site-only.yaml"):
        load_books([folder])


def test_option_wins_over_the_environment(tmp_path):
    assert extra_dirs(["x", "y"], {"VLLM_ONCALL_PLAYBOOKS": "z"}) == [tmp_path.__class__("x"), tmp_path.__class__("y")]
    assert [str(p) for p in extra_dirs(None, {"VLLM_ONCALL_PLAYBOOKS": "/a, /b"})] == ["/a", "/b"]
    assert extra_dirs(None, {}) == []


def test_playbooks_command_lists_the_merged_set(tmp_path, capsys):
    first, second = custom_folder(tmp_path, "a"), tmp_path / "b"
    second.mkdir()
    shutil.copy(DEFAULT_DIR / "host-oom-killed.yaml", second)
    assert main(["playbooks", "--playbooks", str(first), "--playbooks", str(second)]) == 0
    ids = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert "site-only" in ids and len(ids) == len(load_dir()) + 1 and len(set(ids)) == len(ids)


@pytest.mark.parametrize("command", ["diagnose", "eval", "playbooks", "why", "apply", "fix", "serve", "demo"])
def test_every_diagnosing_command_takes_playbooks(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert "--playbooks DIR" in capsys.readouterr().out
