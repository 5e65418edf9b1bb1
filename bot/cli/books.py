"""Which playbooks a command uses: the bundled ones, with extra folders merged over them.

The merging is bot.diagnosis.playbooks.load_playbooks (same id replaces, logged; a later folder
wins). What this adds for the command line and the deployment: the folders come from
--playbooks DIR (repeatable) or VLLM_ONCALL_PLAYBOOKS, no folder means exactly the bundled
playbooks as before, and an existing folder without playbooks (deploy/'s ConfigMap mount, empty
until you add one) adds nothing instead of failing. A folder that does not exist, or a playbook
that does not validate, is a PlaybookError naming the file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the loader is imported by the commands that load playbooks only (issue 20)
    from bot.diagnosis.playbooks import Playbook

log = logging.getLogger(__name__)
PLAYBOOKS_VAR = "VLLM_ONCALL_PLAYBOOKS"


def extra_dirs(given: Sequence[str] | None, env: dict[str, str] | None = None) -> list[Path]:
    """--playbooks DIR (repeatable) when given, else VLLM_ONCALL_PLAYBOOKS (comma-separated)."""
    if given:
        return [Path(d) for d in given]
    value = (os.environ if env is None else env).get(PLAYBOOKS_VAR, "")
    return [Path(part.strip()) for part in value.replace(";", ",").split(",") if part.strip()]


def load_books(extra: Iterable[Path]) -> list[Playbook] | None:
    """None without extra folders: callers then use the bundled playbooks exactly as before."""
    from bot.diagnosis.playbooks import PlaybookError, load_playbooks

    extra = list(extra)
    if not extra:
        return None
    for folder in extra:
        if not folder.is_dir():
            raise PlaybookError(f"{folder}: no playbooks folder")
    with_books = [folder for folder in extra if any(folder.glob("*.yaml"))]
    for folder in set(extra) - set(with_books):
        log.info("no *.yaml playbooks in %s; nothing to add", folder)
    return load_playbooks(with_books)


def add_option(parser) -> None:
    """`--playbooks DIR`, repeatable, on every command that diagnoses or checks a proposal."""
    parser.add_argument("--playbooks", metavar="DIR", action="append",
                        help=f"extra playbooks folder merged over the bundled ones (same id replaces); "
                             f"repeatable; default: {PLAYBOOKS_VAR}")


def books_for(args) -> list[Playbook] | None:
    """The playbooks the command's --playbooks (or VLLM_ONCALL_PLAYBOOKS) asks for; None: bundled."""
    return load_books(extra_dirs(getattr(args, "playbooks", None)))
