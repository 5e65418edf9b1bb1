"""Kubernetes API stand-in for tests: `FakeKube` and the `kube_api` pytest fixture.

Use from a test module (tests/ is on sys.path under pytest's default import mode):

    from kubeapi import kube_api  # noqa: F401  (the fixture)
    from kubeapi.objects import deployment_with_pod

    def test_x(kube_api):
        api_client = kube_api.api_client()   # a real kubernetes.client.ApiClient
"""

from __future__ import annotations

import pytest

from kubeapi.server import ApiError, Call, FakeKube, Fault

__all__ = ["ApiError", "Call", "FakeKube", "Fault", "kube_api"]


@pytest.fixture
def kube_api():
    """A started FakeKube on 127.0.0.1 with a free port; stopped after the test."""
    fake = FakeKube().start()
    try:
        yield fake
    finally:
        fake.stop()
