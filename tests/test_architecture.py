"""The code stays small enough to read: no function in bot/ over 60 lines, no class over 300,
and the layer contracts in pyproject.toml ([tool.importlinter]) hold (import-linter, the same check CI runs)."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BOT = ROOT / "bot"
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 300


def _spans(kinds: tuple[type, ...]) -> list[tuple[str, int]]:
    found = []
    for path in sorted(BOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, kinds):
                lines = node.end_lineno - node.lineno + 1  # type: ignore[attr-defined]
                found.append((f"{path.relative_to(ROOT)}:{node.lineno} {node.name}", lines))  # type: ignore[attr-defined]
    return found


def test_no_function_is_longer_than_sixty_lines():
    long = [f"{where} ({n} lines)" for where, n in _spans((ast.FunctionDef, ast.AsyncFunctionDef))
            if n > MAX_FUNCTION_LINES]
    assert not long, "split these functions:\n" + "\n".join(long)


def test_no_class_is_longer_than_three_hundred_lines():
    long = [f"{where} ({n} lines)" for where, n in _spans((ast.ClassDef,)) if n > MAX_CLASS_LINES]
    assert not long, "split these classes:\n" + "\n".join(long)


def test_the_layer_contracts_hold():
    lint = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert lint, "import-linter is a dev dependency: pip install -e '.[dev]'"
    proc = subprocess.run([lint, "--config", str(ROOT / "pyproject.toml"), "--no-cache"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
