"""Imports point down only: the pure core never reaches the cluster, chat or server code,
and the Slack side never talks to Kubernetes directly (it goes through bot.service)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

BOT = Path(__file__).resolve().parents[1] / "bot"
CORE = sorted(str(p.relative_to(BOT).with_suffix("")) for p in [*(BOT / "diagnosis").glob("*.py"),
                                                                  *(BOT / "remedy").glob("*.py")])
OUTSIDE = ("bot.kube", "bot.slack", "bot.http", "bot.app", "bot.cli", "bot.local", "bot.llm",
           "kubernetes", "slack_bolt", "slack_sdk", "openai")


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


@pytest.mark.parametrize("module", CORE)
def test_core_modules_do_no_io_beyond_files(module):
    bad = {n for n in imports_of(BOT / f"{module}.py") if n.startswith(OUTSIDE)}
    assert not bad, f"bot/{module}.py imports {sorted(bad)}"


def test_slack_side_never_imports_kubernetes():
    for path in (BOT / "slack").glob("*.py"):
        bad = {n for n in imports_of(path) if n.startswith(("bot.kube", "kubernetes"))}
        assert not bad, f"{path.name} imports {sorted(bad)}"
