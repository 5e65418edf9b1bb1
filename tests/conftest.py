"""Fixtures shared by every test folder, and the stand-ins registered as pytest plugins:
`kube_api` (the Kubernetes API's wire format, tests/kubeapi) and `slack` (Slack's Web API,
tests/slackapi). Builders for evidence live in tests/builders.py, port-level fakes in
tests/fakes.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from builders import SHARED_CORPUS

pytest_plugins = ["kubeapi.plugin", "slackapi.plugin"]


@pytest.fixture
def corpus_dir() -> Path:
    if not SHARED_CORPUS.is_dir():
        pytest.skip(f"shared corpus not present at {SHARED_CORPUS}")
    return SHARED_CORPUS
