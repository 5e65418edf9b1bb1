"""A run of diagnose, eval or playbooks builds that command's parser alone (bot.cli.build_parser:
argparse's per-argument work for the eleven others was 1.3% of a small log's diagnose, issue 20).
What a person sees must not change: the command's help, its usage in errors, its defaults."""

from __future__ import annotations

import contextlib
import io

import pytest

from bot.cli import OWN_COMMANDS, build_parser, main, subcommand_parser


@pytest.mark.parametrize("command", OWN_COMMANDS)
def test_one_commands_parser_is_the_same_as_in_the_whole(command):
    whole, alone = subcommand_parser(build_parser(), command), subcommand_parser(build_parser(command), command)
    assert alone is not None and alone.prog == f"vllm-oncall {command}"
    assert alone.format_help() == whole.format_help()
    assert alone.format_usage() == whole.format_usage()
    argv = [command, "CORPUS"] if command == "eval" else [command]
    assert vars(build_parser(command).parse_args(argv)) == vars(build_parser().parse_args(argv))


def test_the_top_level_help_still_lists_every_command():
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        main(["--help"])
    for command in (*OWN_COMMANDS, "plan", "why", "collect", "apply", "rollback", "fix", "serve", "demo"):
        assert f"    {command} " in out.getvalue() or f"    {command}\n" in out.getvalue(), command


def test_a_misspelled_command_is_answered_with_every_command():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
        main(["diagnos", "--log", "x.log"])
    assert "invalid choice: 'diagnos'" in err.getvalue() and "'serve'" in err.getvalue()


def test_an_unknown_option_is_answered_with_the_commands_usage():
    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit):
        main(["diagnose", "--lgo", "x.log"])
    assert err.getvalue().startswith("usage: vllm-oncall diagnose ")
    assert "unrecognized arguments: --lgo" in err.getvalue()
