"""`vllm-oncall` command line: diagnose and eval here; cluster and chat commands register themselves."""

from __future__ import annotations

import argparse
import sys

from bot import cli_kube, cli_serve


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vllm-oncall", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    cli_kube.register(sub)
    cli_serve.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
