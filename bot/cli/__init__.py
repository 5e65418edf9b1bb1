"""`vllm-oncall` command line.

diagnose and eval live here; the cluster commands (why, collect, apply, rollback, fix) and the
chat commands (serve, demo) register themselves from bot.cli.kube and bot.cli.serve.

The entry point: it may import every layer, and wires the adapters (bot.kube or bot.local,
bot.slack, bot.http, bot.llm) into the application (bot.app). `serve` and `demo` are wired in one
place, bot.cli.wiring (a typed `Wiring` built by `build(settings)`), which bot.cli.serve loads only
when it runs, so `--help` never imports the clients.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bot.cli import books as cli_books
from bot.cli import kube as cli_kube
from bot.cli import plan_args as cli_plan
from bot.cli import serve as cli_serve
from bot.cli import version as cli_version

DEBUG_VAR = "VLLM_ONCALL_DEBUG"  # set to 1 to see the traceback of an unexpected error


def _input_errors() -> tuple[type[Exception], ...]:
    """Bad input, one line and exit 2. Imported when an error is raised, not for every command
    (their modules bring pydantic and the playbook loader; issue 20: `--help` under 0.2 CPU-s)."""
    from bot.diagnosis.models import BundleError
    from bot.diagnosis.playbooks import PlaybookError

    return BundleError, PlaybookError


@contextmanager
def long_lived_imports() -> Iterator[None]:
    """Import with the cyclic collector paused, then freeze what was imported out of its reach.

    What importing the diagnosis builds (pydantic schemas, dataclasses, regexes) lives as long as
    the process: the collector walked it some 80 times for nothing, 15-20 ms of a diagnose's
    start-up (issue 20). Frozen rather than merely paused: switched back on, it would walk the
    whole heap it had let pile up. serve freezes its start-up heap the same way.

    pydantic looks for plugins when it builds its first model, reading the entry points of every
    installed package (~2% of a small log's diagnose); a one-shot command wants none, so the
    search is off unless PYDANTIC_DISABLE_PLUGINS says otherwise."""
    os.environ.setdefault("PYDANTIC_DISABLE_PLUGINS", "__all__")
    _no_plugin_loader()
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


PYDANTIC_PLUGIN_LOADER = "pydantic.plugin._loader"
PLUGINS_OFF = ("__all__", "1", "true")  # pydantic's spellings of PYDANTIC_DISABLE_PLUGINS for "none"


def _no_plugin_loader() -> None:
    """With plugins off, pydantic is given a plugin loader that answers "no plugins" at once.

    Its own loader answers the same, but its module imports importlib.metadata first (and with it
    email, zipfile, csv, ...) when the first model is built: 3.6% of the instructions of a small
    log's diagnose, for a search that is switched off (pydantic 2.14; its one caller,
    pydantic.plugin._schema_validator, imports only `get_plugins` from it). Any other name asked
    of it (a later pydantic's) is pydantic's own loader's: the stand-in steps aside for it, so the
    worst a changed pydantic costs is the import this saves. Left alone when plugins are on, or
    when pydantic's loader is already imported."""
    if os.environ.get("PYDANTIC_DISABLE_PLUGINS") not in PLUGINS_OFF or PYDANTIC_PLUGIN_LOADER in sys.modules:
        return
    loader = types.ModuleType(PYDANTIC_PLUGIN_LOADER, "pydantic's plugin loader, plugins off (bot.cli)")
    loader.get_plugins = _no_plugins  # type: ignore[attr-defined]  # a module made here, not typed
    loader.__getattr__ = _pydantic_loader_attribute  # type: ignore[method-assign]  # PEP 562: a module's fallback
    sys.modules[PYDANTIC_PLUGIN_LOADER] = loader


def _no_plugins() -> tuple[()]:
    return ()


def _pydantic_loader_attribute(name: str) -> Any:
    """A name the stand-in does not have, from pydantic's own loader, which replaces it from then on
    (a module's own dunder names are not asked of it: tools probing `__file__` import nothing)."""
    if name.startswith("__"):
        raise AttributeError(name)
    if getattr(sys.modules.get(PYDANTIC_PLUGIN_LOADER), "get_plugins", None) is _no_plugins:
        del sys.modules[PYDANTIC_PLUGIN_LOADER]
    return getattr(importlib.import_module(PYDANTIC_PLUGIN_LOADER), name)


def cmd_diagnose(args: argparse.Namespace) -> int:
    with long_lived_imports():
        from bot.diagnosis.diagnose import diagnose
        from bot.diagnosis.evidence import load_bundle, load_log
        from bot.diagnosis.models import BundleError
        from bot.diagnosis.render import render_text

    if not args.bundle and not args.log:
        raise BundleError("give an evidence bundle folder, or --log FILE")
    if args.bundle and args.log:  # one source of evidence: never drop one silently
        raise BundleError(f"give the bundle folder {args.bundle} or --log {args.log}, not both "
                          f"(a bundle's log is its previous.log)")
    _refuse_gzip(Path(args.log) if args.log else Path(args.bundle) / "previous.log")
    books = cli_books.books_for(args)
    evidence = load_log(args.log) if args.log else load_bundle(args.bundle)
    result = diagnose(evidence, books)
    if args.format == "json":
        print(json.dumps(result.to_public_json(), indent=2))
    else:
        print(render_text(result))
    return 0


GZIP_MAGIC = b"\x1f\x8b"


def _refuse_gzip(log: Path) -> None:
    """A compressed log is not "not text": say what it is and what to do."""
    try:
        with log.open("rb") as f:
            head = f.read(2)
    except OSError:
        return  # the loader says what is wrong with the path
    if head == GZIP_MAGIC:
        from bot.diagnosis.models import BundleError

        raise BundleError(f"{log}: gzip-compressed; decompress it first (gunzip -k {log}, or zcat {log} > FILE)")


def cmd_eval(args: argparse.Namespace) -> int:
    with long_lived_imports():
        from bot.diagnosis.evaluate import evaluate, format_report
        from bot.diagnosis.models import BundleError

    corpus = Path(args.corpus)
    if not corpus.is_dir():
        raise BundleError(f"{corpus}: no such corpus folder")
    results, summary = evaluate(corpus, cli_books.books_for(args))
    if not results:
        raise BundleError(f"{corpus}: no labelled bundles found (each is a folder with previous.log and "
                          "expected.json); point eval at the corpus folder itself")
    if args.format == "json":
        print(json.dumps({"cases": [r.model_dump() for r in results], "summary": summary}, indent=2))
    else:
        print(format_report(results, summary))
    if args.min_right is not None and summary["causes_right"] < args.min_right:
        return 1
    return 1 if args.strict and summary["wrong_confident_fixes"] else 0


def cmd_playbooks(args: argparse.Namespace) -> int:
    from bot.diagnosis.playbooks import load_dir

    for book in cli_books.books_for(args) or load_dir():
        changes = sorted({f"{k} {n}" for k, n in book.allowed()})
        print(f"{book.id:<30} {book.summary}  [{', '.join(changes)}]")
    return 0


class _VersionAction(argparse.Action):
    """argparse's `version` action, with the version looked up only when asked for."""

    def __init__(self, option_strings: list[str], dest: str, help: str | None = None) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: object,
                 option_string: str | None = None) -> None:
        print(f"vllm-oncall {cli_version.version()}")
        parser.exit()


OWN_COMMANDS = ("diagnose", "eval", "playbooks")  # the commands this module defines


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Every command's parser; or, for one of OWN_COMMANDS, that command's alone (the one a run
    names: its help and errors are the same). argparse makes a help formatter for each argument
    it adds, so the other eleven commands' parsers were 1.3% of a small log's diagnose (issue 20)."""
    parser = argparse.ArgumentParser(prog="vllm-oncall", description="Diagnose vLLM start-up crashes on Kubernetes.")
    parser.add_argument("--version", action=_VersionAction, help="show program's version number and exit")
    sub = parser.add_subparsers(dest="command", required=True)

    if command in (None, "diagnose"):
        p = sub.add_parser("diagnose", help="diagnose an evidence bundle folder (or a log file)")
        p.add_argument("bundle", nargs="?",
                       help="folder with previous.log and optional pod.yaml, node.yaml, events.yaml")
        p.add_argument("--log", help="a log file alone")
        p.add_argument("--format", choices=["text", "json"], default="text")
        cli_books.add_option(p)
        p.set_defaults(func=cmd_diagnose)

    if command in (None, "eval"):
        p = sub.add_parser("eval", help="score the diagnoser on a folder of labelled bundles")
        p.add_argument("corpus")
        p.add_argument("--format", choices=["text", "json"], default="text")
        p.add_argument("--min-right", type=int, help="exit 1 when fewer causes are right")
        p.add_argument("--strict", action="store_true", help="exit 1 on any wrong confident fix")
        cli_books.add_option(p)
        p.set_defaults(func=cmd_eval)

    if command in (None, "playbooks"):
        p = sub.add_parser("playbooks", help="list the causes and what each may change")
        cli_books.add_option(p)
        p.set_defaults(func=cmd_playbooks)

    if command is None:
        cli_plan.register(sub)
        cli_kube.register(sub)
        cli_serve.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser(argv[0] if argv and argv[0] in OWN_COMMANDS else None)
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the subcommand's own usage, not the top-level one
        subcommand_parser(parser, args.command).error(f"unrecognized arguments: {' '.join(unknown)}")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:
        if isinstance(exc, _input_errors()):
            print(f"vllm-oncall: {exc}", file=sys.stderr)
            return 2
        if isinstance(exc, BrokenPipeError):  # `vllm-oncall diagnose ... | head`
            sys.stderr.close()
            return 0
        if isinstance(exc, OSError):  # an input file that cannot be read, a folder that cannot be written
            print(f"vllm-oncall: {one_line_os_error(exc)}", file=sys.stderr)
            return 2
        # a bug: still one line, the traceback on request
        if os.environ.get(DEBUG_VAR):
            raise
        print(f"vllm-oncall: unexpected error: {type(exc).__name__}: {one_line(str(exc))} "
              f"(set {DEBUG_VAR}=1 to see where)", file=sys.stderr)
        return 1


def subcommand_parser(parser: argparse.ArgumentParser, command: str | None) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and command in action.choices:
            return action.choices[command]
    return parser


def one_line(text: str) -> str:
    return " ".join(text.split())


def one_line_os_error(exc: OSError) -> str:
    """`PATH: No such file or directory`, not Python's `[Errno 2] ...: 'PATH'`."""
    if exc.filename is not None and exc.strerror:
        return f"{exc.filename}: {exc.strerror}"
    return one_line(str(exc))

