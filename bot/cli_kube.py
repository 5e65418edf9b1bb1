"""Terminal commands that talk to a cluster: why, collect, apply, rollback, fix."""

from __future__ import annotations

import argparse


def register(sub: "argparse._SubParsersAction") -> None:
    """Add the cluster subcommands to the `vllm-oncall` parser."""
