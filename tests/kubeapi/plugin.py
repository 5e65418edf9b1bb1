"""pytest plugin (registered in tests/conftest.py): the `kube_api` fixture."""

from __future__ import annotations

import pytest

from kubeapi.server import FakeKube


@pytest.fixture
def kube_api():
    """A started FakeKube on 127.0.0.1 with a free port; stopped after the test."""
    fake = FakeKube().start()
    try:
        yield fake
    finally:
        fake.stop()


@pytest.fixture
def kube_api_b():
    """A second, independent FakeKube: another cluster, for the multi-cluster tests."""
    fake = FakeKube().start()
    try:
        yield fake
    finally:
        fake.stop()
