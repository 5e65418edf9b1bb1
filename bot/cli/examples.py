"""The bundled example incident (`demo`, `test-incident`): in an installed wheel setup.py copies it
to bot/_bundled/, else it is in the checkout."""

from __future__ import annotations

from pathlib import Path

EXAMPLE_DIRS = (Path(__file__).resolve().parents[1] / "_bundled" / "examples" / "incident",
                Path(__file__).resolve().parents[2] / "examples" / "incident")


def example_dir(given: str | None = None) -> Path:
    if given:
        return Path(given)
    for folder in EXAMPLE_DIRS:
        if (folder / "alert.json").is_file():
            return folder
    raise FileNotFoundError("the bundled example incident is missing (examples/incident/alert.json)")
