"""Which playbooks a command uses: the bundled ones, with extra folders merged over them.

Stand-in until bot.diagnosis.playbooks has its own merging loader (`load_playbooks(extra_dirs)`):
replace `load_books` by it then. Same rules: an extra folder's playbook with a bundled id
replaces the bundled one (logged), a new id is added; a folder that does not exist or a playbook
that does not validate is a PlaybookError naming the file.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterable, Sequence

from bot.diagnosis.playbooks import Playbook, PlaybookError, load_dir

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
    extra = list(extra)
    if not extra:
        return None
    merged = {book.id: book for book in load_dir()}
    for folder in extra:
        for book in _load_extra(folder):
            if book.id in merged:
                log.info("playbook %s from %s replaces %s", book.id, book.source, merged[book.id].source)
            merged[book.id] = book
    return sorted(merged.values(), key=lambda b: -b.priority)  # as load_dir orders them


def _load_extra(folder: Path) -> list[Playbook]:
    if not folder.is_dir():
        raise PlaybookError(f"{folder}: no playbooks folder")
    if not any(folder.glob("*.yaml")):  # an empty ConfigMap mount: nothing to add
        log.info("no *.yaml playbooks in %s; using the bundled ones", folder)
        return []
    return load_dir(folder)


def add_option(parser) -> None:
    """`--playbooks DIR`, repeatable, on every command that diagnoses or checks a proposal."""
    parser.add_argument("--playbooks", metavar="DIR", action="append",
                        help=f"extra playbooks folder merged over the bundled ones (same id replaces); "
                             f"repeatable; default: {PLAYBOOKS_VAR}")


def books_for(args) -> list[Playbook] | None:
    """The playbooks the command's --playbooks (or VLLM_ONCALL_PLAYBOOKS) asks for; None: bundled."""
    return load_books(extra_dirs(getattr(args, "playbooks", None)))
