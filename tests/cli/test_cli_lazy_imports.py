"""`vllm-oncall --help` pays for no command's imports (issue 20: the playbook loader, the planner
and pydantic were imported for every command). Checked by what a fresh interpreter has loaded
after building the parser and printing the help, not by timing it."""

from __future__ import annotations

import os
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


COLLECTOR_PROBE = """
import contextlib, gc, io, sys
from bot.cli import main
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    code = main(sys.argv[1:])
print(code, gc.isenabled(), gc.get_freeze_count())
"""


def collector_after(*argv: str) -> tuple[int, bool, int]:
    done = subprocess.run([sys.executable, "-c", COLLECTOR_PROBE, *argv], capture_output=True, text=True, check=True)
    code, enabled, frozen = done.stdout.split()
    return int(code), enabled == "True", int(frozen)


def test_one_shot_commands_freeze_what_they_imported_and_leave_the_collector_on(tmp_path):
    """diagnose, eval and plan import the diagnosis with the cyclic collector paused, then freeze
    it out of its reach (bot.cli.long_lived_imports): the collector must be on again afterwards,
    also when the input is refused, and the imported modules' objects must be in the permanent
    generation."""
    log = tmp_path / "x.log"
    log.write_text("INFO 06-01 10:00:00 [api_server.py:1] vLLM API server version 0.10.1\n")
    for argv, want in ((["diagnose", "--log", str(log)], 0), (["diagnose", "--log", str(tmp_path / "none.log")], 2),
                       (["eval", str(tmp_path)], 2), (["plan", str(tmp_path / "none.yaml"), "--gpu", "L4"], 2)):
        code, enabled, frozen = collector_after(*argv)
        assert (code, enabled) == (want, True), argv
        assert frozen > 10_000, (argv, frozen)  # pydantic's and the diagnosis's objects, not a handful


METADATA_PROBE = """
import contextlib, io, sys
from bot.cli import main
with contextlib.redirect_stdout(io.StringIO()) as out:
    code = main(sys.argv[1:])
print(code, "importlib.metadata" in sys.modules, type(sys.modules["pydantic.plugin._loader"].get_plugins()).__name__)
"""


def diagnose_loads_metadata(log, plugins_setting: str | None) -> tuple[str, str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYDANTIC_DISABLE_PLUGINS"}
    if plugins_setting is not None:
        env["PYDANTIC_DISABLE_PLUGINS"] = plugins_setting
    done = subprocess.run([sys.executable, "-c", METADATA_PROBE, "diagnose", "--log", str(log)], env=env,
                          capture_output=True, text=True, check=True)
    code, loaded, plugins = done.stdout.split()[-3:]
    return code, loaded, plugins


def test_one_shot_commands_skip_pydantic_plugin_loader_only_when_plugins_are_off(tmp_path):
    """With plugins off (the default for one-shot commands, or the user's own "1"), pydantic's
    plugin loader, which imports importlib.metadata, is never imported (bot.cli._no_plugin_loader);
    with only some plugins disabled, pydantic's own loader runs its search."""
    log = tmp_path / "x.log"
    log.write_text("INFO 06-01 10:00:00 [api_server.py:1] vLLM API server version 0.10.1\n")
    assert diagnose_loads_metadata(log, None) == ("0", "False", "tuple")
    assert diagnose_loads_metadata(log, "1") == ("0", "False", "tuple")
    assert diagnose_loads_metadata(log, "some_plugin") == ("0", "True", "dict_values")


STAND_IN_PROBE = """
import os, sys
os.environ["PYDANTIC_DISABLE_PLUGINS"] = "__all__"
from bot.cli import _no_plugin_loader
_no_plugin_loader()
stand_in = sys.modules["pydantic.plugin._loader"]
from pydantic.plugin._loader import PYDANTIC_ENTRY_POINT_GROUP  # a name only pydantic's own loader has
real = sys.modules["pydantic.plugin._loader"]
print(PYDANTIC_ENTRY_POINT_GROUP, real is not stand_in, "importlib.metadata" in sys.modules,
      type(real.get_plugins()).__name__, hasattr(stand_in, "__file__"))
"""


def test_the_plugin_loader_stand_in_steps_aside_for_any_other_name():
    """A pydantic that asks the loader for more than get_plugins gets pydantic's own loader, which
    replaces the stand-in: a changed pydantic costs the import the stand-in saves, never an
    ImportError; a tool probing a dunder name imports nothing."""
    done = subprocess.run([sys.executable, "-c", STAND_IN_PROBE], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["pydantic", "True", "True", "tuple", "False"]
