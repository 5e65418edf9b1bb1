"""The version of this vllm-oncall: `--version`, the start-up line, vllm_oncall_build_info."""

from __future__ import annotations

from pathlib import Path

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def version() -> str:
    """The installed package's version; in a checkout that was never installed, pyproject's."""
    # imported here: importlib.metadata (email, zipfile, ...) costs every command that parses
    # its arguments, and only --version and serve's start-up line ask (issue 20)
    import tomllib
    from importlib import metadata

    try:
        return metadata.version("vllm-oncall")
    except metadata.PackageNotFoundError:
        pass
    try:
        return str(tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]["version"])
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"
