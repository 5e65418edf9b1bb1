"""`vllm-oncall --help` pays for no command's imports (issue 20: the playbook loader, the planner
and pydantic were imported for every command). Checked by what a fresh interpreter has loaded
after building the parser and printing the help, not by timing it."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("pydantic", "bot.diagnosis.playbooks", "bot.diagnosis.preflight", "bot.diagnosis.cmdline",
         "bot.diagnosis.models", "bot.cli.settings", "kubernetes", "slack_bolt",
         "importlib.metadata")  # the version lookup: only --version and serve's start-up line need it

PROBE = """
import contextlib, io, sys
from bot.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
assert "usage:" in out.getvalue(), out.getvalue()
print(" ".join(sorted(m for m in sys.modules
                      if m.split(".")[0] in ("pydantic", "bot", "kubernetes", "slack_bolt") or m == "importlib.metadata")))
"""


def loaded_by(*argv: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", PROBE, *argv], capture_output=True, text=True, check=True)
    return set(done.stdout.split())


def test_help_imports_no_command_module():
    for argv in (["--help"], ["plan", "--help"], ["serve", "--help"], ["diagnose", "--help"]):
        assert not loaded_by(*argv) & set(HEAVY), argv


def test_a_command_still_loads_what_it_needs():
    """The probe can fail: `playbooks` itself imports the loader."""
    done = subprocess.run([sys.executable, "-c", "import sys\nfrom bot.cli import main\nmain(['playbooks'])\n"
                           "print('bot.diagnosis.playbooks' in sys.modules)"], capture_output=True, text=True)
    assert done.stdout.split()[-1] == "True"


def test_version_still_answers():
    done = subprocess.run([sys.executable, "-m", "bot.cli", "--version"], capture_output=True, text=True, check=True)
    assert done.stdout.startswith("vllm-oncall ") and done.stdout.split()[1][0].isdigit()
