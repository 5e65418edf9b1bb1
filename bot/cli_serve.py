"""Terminal commands for the chat side: serve (Slack + HTTP) and demo (the bundled incident)."""

from __future__ import annotations

import argparse


def register(sub: "argparse._SubParsersAction") -> None:
    """Add the serve/demo subcommands to the `vllm-oncall` parser."""
