"""What each KubeApi method sends is what the API server receives: method, path, query, headers
(Accept, Content-Type, the bearer token from the configuration's refresh hook, as the in-cluster
loader rotates it) and body. Against the API stand-in, which records every request as it arrived.

KubeApi builds its requests itself (bot/kube/api.py) and sends them on the client's own connection
pool (bot/kube/wire.py); these are the requests the generated client methods sent for the same
calls, with the body's JSON written without spaces."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from kubeapi.objects import crashing_deployment
from kubeapi.server import FakeKube

from bot.kube.api import KubeApi
from bot.kube.errors import KubeNotFound
from bot.kube.retry import RetryPolicy

NS, POD = "inference", "llama-c48ab1f98c-abcde"
G, V, INCIDENTS, PLURAL = "oncall.vllm.ai", "v1", "vllm-oncall", "vllmincidents"
CUSTOM = f"/apis/{G}/{V}/namespaces/{INCIDENTS}/{PLURAL}"
INCIDENT = {"apiVersion": f"{G}/{V}", "kind": "VLLMIncident", "metadata": {"name": "i1", "labels": {"a": "b"}},
            "spec": {"cluster": "c", "namespace": NS, "workload": "llama", "cause": "x", "state": "proposed",
                     "approver": "", "change": "", "record": "{}"}}
EVENT = {"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e1", "namespace": NS},
         "involvedObject": {"kind": "Pod", "name": POD, "namespace": NS, "uid": None},
         "reason": "Diagnosed", "message": "m", "type": "Normal", "firstTimestamp": "2026-11-30T05:00:00Z",
         "count": 1}
# The Event as the client's model sends it: None left out, the timestamp with its offset.
EVENT_SENT = {"apiVersion": "v1", "count": 1, "firstTimestamp": "2026-11-30T05:00:00+00:00",
              "involvedObject": {"kind": "Pod", "name": POD, "namespace": NS}, "kind": "Event", "message": "m",
              "metadata": {"name": "e1", "namespace": NS}, "reason": "Diagnosed", "type": "Normal"}
SPEC_OPS = [{"op": "test", "path": "/spec/replicas", "value": 1}]


@pytest.fixture
def kube():
    fake = FakeKube().start()
    crashing_deployment(fake)
    yield fake
    fake.stop()


class RotatingToken:
    """The configuration's refresh_api_key_hook, as the in-cluster loader installs it: called before
    each request, it puts the current token in place (a new one each time, here)."""

    def __init__(self) -> None:
        self.issued = 0

    def __call__(self, configuration: Any) -> None:
        self.issued += 1
        configuration.api_key["authorization"] = f"token-{self.issued}"


@pytest.fixture
def token():
    return RotatingToken()


@pytest.fixture
def api(kube, token):
    api_client = kube.api_client()
    api_client.configuration.api_key = {"authorization": "token-0"}
    api_client.configuration.api_key_prefix = {"authorization": "Bearer"}
    api_client.configuration.refresh_api_key_hook = token
    api = KubeApi(api_client, retry=RetryPolicy(attempts=1))
    api.page_size = 1  # every list takes two pages: the continue token is sent back
    return api


# (what the bot calls, [(method, path and query, Content-Type, body as JSON)] the server receives)
CASES: list[tuple[str, Callable[[KubeApi], Any], list[tuple[str, str, str | None, Any]]]] = [
    ("get_pod", lambda api: api.get_pod(NS, POD), [("GET", f"/api/v1/namespaces/{NS}/pods/{POD}", None, None)]),
    ("list_pods", lambda api: api.list_pods(NS, label_selector="app=llama", field_selector="status.phase=Running"),
     [("GET", f"/api/v1/namespaces/{NS}/pods?fieldSelector=status.phase%3DRunning&labelSelector=app%3Dllama"
              "&limit=1", None, None)]),
    ("list_pods_on_node", lambda api: api.list_pods_on_node("gpu-node-1"),
     [("GET", "/api/v1/pods?fieldSelector=spec.nodeName%3Dgpu-node-1&limit=1", None, None)]),
    ("read_log", lambda api: api.read_log(NS, POD, "vllm"),
     [("GET", f"/api/v1/namespaces/{NS}/pods/{POD}/log?container=vllm&previous=false", None, None)]),
    ("read_log previous", lambda api: api.read_log(NS, POD, "vllm", previous=True, limit_bytes=1000, tail_lines=50),
     [("GET", f"/api/v1/namespaces/{NS}/pods/{POD}/log?container=vllm&limitBytes=1000&previous=true&tailLines=50",
       None, None)]),
    ("list_events", lambda api: api.list_events(NS, POD),
     [("GET", f"/api/v1/namespaces/{NS}/events?fieldSelector=involvedObject.name%3D{POD}&limit=1", None, None),
      ("GET", f"/api/v1/namespaces/{NS}/events?continue=1&fieldSelector=involvedObject.name%3D{POD}&limit=1",
       None, None)]),
    ("create_event", lambda api: api.create_event(NS, EVENT),
     [("POST", f"/api/v1/namespaces/{NS}/events", None, EVENT_SENT)]),
    ("get_node", lambda api: api.get_node("gpu-node-1"), [("GET", "/api/v1/nodes/gpu-node-1", None, None)]),
    ("get_workload", lambda api: api.get_workload("Deployment", NS, "llama"),
     [("GET", f"/apis/apps/v1/namespaces/{NS}/deployments/llama", None, None)]),
    ("find_workload", lambda api: api.find_workload("StatefulSet", NS, "llama"),
     [("GET", f"/apis/apps/v1/namespaces/{NS}/statefulsets/llama", None, None)]),
    ("list_replicasets", lambda api: api.list_replicasets(NS, label_selector="app=llama"),
     [("GET", f"/apis/apps/v1/namespaces/{NS}/replicasets?labelSelector=app%3Dllama&limit=1", None, None)]),
    ("patch_workload dry run", lambda api: api.patch_workload("Deployment", NS, "llama", SPEC_OPS, dry_run=True),
     [("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/llama?dryRun=All", "application/json-patch+json",
       SPEC_OPS)]),
    ("patch_workload", lambda api: api.patch_workload("Deployment", NS, "llama", SPEC_OPS),
     [("PATCH", f"/apis/apps/v1/namespaces/{NS}/deployments/llama", "application/json-patch+json", SPEC_OPS)]),
    ("create_custom", lambda api: api.create_custom(G, V, INCIDENTS, PLURAL, INCIDENT),
     [("POST", CUSTOM, None, INCIDENT)]),
    ("pod_pages of all namespaces", lambda api: list(api.pod_pages(None, label_selector="app=llama")),
     [("GET", "/api/v1/pods?labelSelector=app%3Dllama&limit=1", None, None)]),
    ("list_pods_versioned", lambda api: api.list_pods_versioned(NS),
     [("GET", f"/api/v1/namespaces/{NS}/pods?limit=1", None, None)]),
    ("a name that is not one path part", lambda api: api.find_workload("Deployment", NS, "a b/c?d"),
     [("GET", f"/apis/apps/v1/namespaces/{NS}/deployments/a%20b%2Fc%3Fd", None, None)]),
]
# On an incident created first: (what the bot calls, [(method, path, Content-Type, body)])
INCIDENT_CASES: list[tuple[str, Callable[[KubeApi], Any], list[tuple[str, str, str | None, Any]]]] = [
    ("get_custom", lambda api: api.get_custom(G, V, INCIDENTS, PLURAL, "i1"), [("GET", f"{CUSTOM}/i1", None, None)]),
    ("list_custom", lambda api: api.list_custom(G, V, INCIDENTS, PLURAL, label_selector="a=b"),
     [("GET", f"{CUSTOM}?labelSelector=a%3Db&limit=1", None, None)]),
    ("patch_custom merge", lambda api: api.patch_custom(G, V, INCIDENTS, PLURAL, "i1", {"spec": {"state": "x"}}),
     [("PATCH", f"{CUSTOM}/i1", "application/merge-patch+json", {"spec": {"state": "x"}})]),
    ("patch_custom JSON Patch", lambda api: api.patch_custom(G, V, INCIDENTS, PLURAL, "i1",
                                                             [{"op": "replace", "path": "/spec/state", "value": "y"}]),
     [("PATCH", f"{CUSTOM}/i1", "application/json-patch+json", [{"op": "replace", "path": "/spec/state", "value": "y"}])]),
]


def expected_headers(kube: FakeKube, api: KubeApi, token: str, content_type: str | None,
                     body: Any) -> dict[str, str]:
    headers = {"Host": kube.url.removeprefix("http://"), "Accept-Encoding": "identity", "Accept": "application/json",
               "User-Agent": api.api_client.user_agent, "authorization": f"Bearer {token}"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    if body is not None:
        headers["Content-Length"] = str(len(json.dumps(body, separators=(",", ":"))))  # JSON without spaces
    return headers


def check(kube: FakeKube, api: KubeApi, token: RotatingToken, call: Callable[[KubeApi], Any],
          expected: list[tuple[str, str, str | None, Any]]) -> None:
    kube.requests.clear()
    first_token = token.issued + 1
    try:
        call(api)
    except KubeNotFound:
        pass  # a missing object's request is as much the point as a found one's
    assert [(r.method, r.target) for r in kube.requests] == [(method, target) for method, target, _, _ in expected]
    for n, (request, (_, _, content_type, body)) in enumerate(zip(kube.requests, expected, strict=True)):
        assert request.headers == expected_headers(kube, api, f"token-{first_token + n}", content_type, body)
        assert (json.loads(request.body) if request.body else None) == body


@pytest.mark.parametrize("call, expected", [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_each_call_sends_the_request_the_server_receives(kube, api, token, call, expected):
    check(kube, api, token, call, expected)


@pytest.mark.parametrize("call, expected", [case[1:] for case in INCIDENT_CASES],
                         ids=[case[0] for case in INCIDENT_CASES])
def test_each_incident_call_sends_the_request_the_server_receives(kube, api, token, call, expected):
    api.create_custom(G, V, INCIDENTS, PLURAL, INCIDENT)
    check(kube, api, token, call, expected)


def test_a_list_of_several_pages_sends_each_continue_token_back(kube, api):
    for suffix in ("b", "c"):
        kube.put({**kube.get("Pod", POD, NS), "metadata": {"name": f"{POD}{suffix}", "namespace": NS}})
    kube.requests.clear()
    pods = api.list_pods(NS)  # one a page
    assert len(pods) == 3
    assert [r.target for r in kube.requests] == [f"/api/v1/namespaces/{NS}/pods?limit=1",
                                                 f"/api/v1/namespaces/{NS}/pods?continue=1&limit=1",
                                                 f"/api/v1/namespaces/{NS}/pods?continue=2&limit=1"]


def test_without_a_token_no_authorization_is_sent(kube):
    api = KubeApi(kube.api_client(), retry=RetryPolicy(attempts=1))
    api.get_pod(NS, POD)
    (request,) = kube.requests[-1:]
    assert "authorization" not in {name.lower() for name in request.headers}


def test_a_name_that_is_not_a_string_is_refused_before_anything_is_sent(kube, api):
    kube.requests.clear()
    with pytest.raises(ValueError, match="must be a string, not int: 7"):
        api.find_workload("ReplicaSet", NS, 7)  # type: ignore[arg-type]  # a forged ownerReference's name
    assert kube.requests == []

