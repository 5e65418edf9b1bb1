"""Build step that pyproject.toml cannot express: copy the top-level playbooks/ and the demo
incident (examples/incident/) into the wheel as bot/_bundled/, so an installed `vllm-oncall`
finds them (bot.diagnosis.playbooks and bot.cli.serve look there first, then in the checkout).
Everything else about the package is declared in pyproject.toml."""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
# source in the checkout -> destination inside the installed `bot` package
BUNDLED = {
    ROOT / "playbooks": Path("bot", "_bundled", "playbooks"),
    ROOT / "examples" / "incident": Path("bot", "_bundled", "examples", "incident"),
}


class build_py_with_bundled_data(build_py):
    def run(self) -> None:
        super().run()
        if self.editable_mode:  # an editable install reads the checkout itself
            return
        for source, target in BUNDLED.items():
            if not source.is_dir():
                raise SystemExit(f"setup.py: {source} is missing; it must be in the wheel")
            destination = Path(self.build_lib) / target
            shutil.rmtree(destination, ignore_errors=True)
            shutil.copytree(source, destination)


setup(cmdclass={"build_py": build_py_with_bundled_data})
