"""Kubernetes API stand-in for tests: `FakeKube` and the `kube_api` pytest fixture.

Use from a test module (tests/ is on sys.path under pytest's default import mode):

    from kubeapi.objects import deployment_with_pod    # the `kube_api` fixture comes from kubeapi.plugin

    def test_x(kube_api):
        api_client = kube_api.api_client()   # a real kubernetes.client.ApiClient
"""

from __future__ import annotations

from kubeapi.server import ApiError, Call, FakeKube, Fault, Request

__all__ = ["ApiError", "Call", "FakeKube", "Fault", "Request"]
