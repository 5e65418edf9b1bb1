"""vLLM's own refusal of a flag, printed by the real argparse the way each release's entrypoint
builds its parser (prog names, subcommands, the serve usage line), with that release's flags
from the table read from its wheel.

- `vllm serve ...`: the top-level parser `vllm` (0.6-0.7: vllm/scripts.py; 0.8+:
  vllm/entrypoints/cli/main.py, `-v/--version`) with subcommands; the serve subparser only
  collects unknown words, which bubble up, so the error names prog `vllm` and the usage line
  is the top parser's.
- `python -m vllm.entrypoints.openai.api_server ...`: one parser whose prog is `api_server.py`
  (sys.argv[0]), whose usage line lists every option.
"""

from __future__ import annotations

import argparse
import contextlib
import io

from bot.diagnosis.cmdline import is_boolean
from bot.diagnosis.vllm_versions import TABLE, version_key


def _subcommands(release: str) -> list[str]:
    key = version_key(release) or ()
    if key < (0, 8):
        return ["serve", "complete", "chat"]  # vllm/scripts.py
    return ["chat", "complete", "serve", "bench", "collect-env", "run-batch"]


def _add_flags(parser: argparse.ArgumentParser, release: str) -> None:
    table = TABLE()
    for name, history in sorted(table.flags.items()):
        if not table.accepts(name, release) or history.alias_of or history.only_as_twin(release):
            continue  # aliases come with their flag; a 0.33+ twin with its --enable-/--disable- flag
        options = [name, *[a for a in history.aliases if table.accepts(a, release) or not a.startswith("--")]]
        twins = [n for n, h in table.flags.items() if h.inverse_of == name and h.only_as_twin(release)]
        if history.boolean:
            parser.add_argument(*options, *twins, action=argparse.BooleanOptionalAction)
        elif is_boolean(name):
            parser.add_argument(*options, action="store_true")
        else:
            parser.add_argument(*options)


def refusal(release: str, argv: list[str], entrypoint: str = "vllm serve") -> str:
    """What vLLM `release` prints to stderr for `argv` (the words after `vllm serve` or after
    `-m vllm.entrypoints.openai.api_server`), as argparse prints it; "" if it accepts them."""
    if entrypoint == "vllm serve":
        top = argparse.ArgumentParser(prog="vllm", description="vLLM CLI")
        if (version_key(release) or ()) >= (0, 8):
            top.add_argument("-v", "--version", action="version", version=release)
        subparsers = top.add_subparsers(required=False, dest="subparser")
        for name in _subcommands(release):
            sub = subparsers.add_parser(name, usage="vllm serve [model_tag] [options]" if name == "serve" else None)
            if name == "serve":
                sub.add_argument("model_tag", nargs="?")
                _add_flags(sub, release)
        parser, words = top, ["serve", *argv]
    else:
        parser = argparse.ArgumentParser(prog="api_server.py")
        _add_flags(parser, release)
        words = argv
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            parser.parse_args(words)
        except SystemExit:
            pass
    return err.getvalue()
