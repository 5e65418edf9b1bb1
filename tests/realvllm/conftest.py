"""Fixtures of the real-vLLM scenarios: the real-vLLM venv (`make vllm`), the tiny models, and the
world of stand-ins around `serve` (realvllm_world.py).

Outside CI a machine without the venv skips these tests; in CI (CI set, .ci/run runs `make vllm`)
a missing venv fails them, as a missing Alertmanager does.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from realvllm_world import MODELS_CACHE, VLLM_PYTHON, World


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "realvllm: runs a real vLLM (CPU) process; needs `make vllm`")


@pytest.fixture(scope="session")
def vllm_python() -> str:
    if VLLM_PYTHON.exists():
        return str(VLLM_PYTHON)
    if os.environ.get("CI"):
        pytest.fail(f"the real-vLLM venv is required in CI ({VLLM_PYTHON}; .ci/run runs `make vllm`)")
    pytest.skip(f"no real-vLLM venv at {VLLM_PYTHON} (`make vllm` installs it)")


@pytest.fixture(scope="session")
def models(vllm_python: str) -> dict[str, str]:
    """The pod-side model paths -> the tiny model directories (made once, cached)."""
    out = {}
    for variant in ("serving", "short", "head16"):
        folder = MODELS_CACHE / variant
        subprocess.run([vllm_python, str(Path(__file__).with_name("tinymodel.py")), str(folder), variant],
                       check=True, capture_output=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        out[f"/models/tiny-llama-{variant}"] = str(folder)
    return out


@pytest.fixture
def world_factory(tmp_path, vllm_python, models):
    worlds: list[World] = []

    def make(**settings: str) -> World:
        w = World(tmp_path, vllm_python, models, **settings)
        worlds.append(w)
        return w

    yield make
    for w in worlds:
        w.stop()
