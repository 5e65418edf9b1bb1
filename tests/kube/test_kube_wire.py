"""KubeApi's own HTTP/1.1 exchange (bot/kube/wire.py) against a server that answers with exactly
the bytes each test scripts: the framings an API server (or what stands in front of one) may use,
when a kept connection is used again and when it is not, and what a broken answer becomes (the
same urllib3 exception as through the client's generic layer, so the same retry and typed error).

The server answers each request it reads with the next scripted answer; no test waits on time."""

from __future__ import annotations

import gzip
import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from kubernetes import client

from bot.kube.api import KubeApi, api_client_without_its_own_retries
from bot.kube.errors import KubeError, KubeNotFound, KubeUnavailable
from bot.kube.retry import RetryPolicy

NS, POD = "inference", "vllm-0"
POD_JSON = json.dumps({"kind": "Pod", "metadata": {"name": POD, "namespace": NS}}).encode()
FAILURE_BOUND_SECONDS = 60  # only bounds a failure: every wait ends as soon as the server answers


@dataclass
class Say:
    """One scripted answer: its bytes, then the connection closed (`close`) or kept."""

    answer: bytes | None  # None: close the connection without answering
    close: bool = False


def http(status: str, body: bytes = POD_JSON, *headers: str, length: bool = True, version: str = "HTTP/1.1") -> bytes:
    lines = [f"{version} {status}", "Content-Type: application/json", *headers]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@dataclass
class Scripted:
    """A TCP server answering the requests it reads, in order, with the scripted answers."""

    script: list[Say]
    requests: list[tuple[bytes, bytes]] = field(default_factory=list)  # (head, body) as received
    connections: int = 0

    def __post_init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return  # closed
            self.connections += 1
            threading.Thread(target=self._talk, args=(conn,), daemon=True).start()

    def _talk(self, conn: socket.socket) -> None:
        conn.settimeout(FAILURE_BOUND_SECONDS)
        with conn, conn.makefile("rb") as stream:
            while True:
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = stream.readline()
                    if not line:
                        return  # the client closed
                    head += line
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                with self.lock:
                    self.requests.append((head, stream.read(length)))
                    say = self.script.pop(0)
                if say.answer is None:
                    return
                conn.sendall(say.answer)
                if say.close:
                    return

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def server() -> Iterator[Scripted]:
    scripted = Scripted([])
    yield scripted
    scripted.close()


def api_for(url: str, attempts: int = 1, waits: list[float] | None = None, **settings: object) -> KubeApi:
    cfg = client.Configuration()
    cfg.host = url
    for name, value in settings.items():
        setattr(cfg, name, value)
    sleep = waits.append if waits is not None else (lambda seconds: None)
    return KubeApi(api_client_without_its_own_retries(cfg), retry=RetryPolicy(attempts=attempts, sleep=sleep))


def test_a_chunked_answer_is_read_whole_and_its_connection_kept(server):
    chunks = [POD_JSON[:10], POD_JSON[10:]]
    body = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(c), c) for c in chunks) + b"0\r\nX-Trailer: t\r\n\r\n"
    server.script += [Say(http("200 OK", body, "Transfer-Encoding: chunked", length=False)), Say(http("200 OK"))]
    api = api_for(server.url)
    assert api.get_pod(NS, POD)["metadata"]["name"] == POD
    assert api.get_pod(NS, POD)["metadata"]["name"] == POD
    assert server.connections == 1


@pytest.mark.parametrize("first", [
    Say(http("200 OK", POD_JSON, "Connection: close"), close=True),
    Say(http("200 OK", POD_JSON, length=False), close=True),  # no length: the body ends at the close
    Say(http("200 OK", POD_JSON, version="HTTP/1.0"), close=True),  # 1.0 without keep-alive
], ids=["Connection: close", "to the close", "HTTP/1.0"])
def test_an_answer_that_ends_its_connection_is_read_and_the_next_call_connects_again(server, first):
    server.script += [first, Say(http("200 OK"))]
    api = api_for(server.url)
    assert api.get_pod(NS, POD)["metadata"]["name"] == POD
    assert api.get_pod(NS, POD)["metadata"]["name"] == POD
    assert server.connections == 2


def test_a_100_continue_and_a_gzip_body_are_read_as_urllib3_read_them(server):
    coded = gzip.compress(POD_JSON)
    server.script.append(Say(b"HTTP/1.1 100 Continue\r\n\r\n" + http("200 OK", coded, "Content-Encoding: gzip")))
    assert api_for(server.url).get_pod(NS, POD)["metadata"]["name"] == POD


@pytest.mark.parametrize("broken", [
    Say(None),  # closed without an answer (a kept connection the server dropped)
    Say(http("200 OK")[:-5], close=True),  # fewer bytes than its Content-Length
    Say(b"SPDY/3 200 OK\r\n\r\n", close=True),  # not an HTTP status line
    Say(b"HTTP/2.0 200 OK\r\n\r\n", close=True),  # not HTTP/1.x
], ids=["no answer", "short body", "garbled status line", "another protocol"])
def test_a_broken_answer_is_a_protocol_error_retried_then_unavailable(server, broken):
    server.script += [broken, broken]
    waits: list[float] = []
    with pytest.raises(KubeUnavailable) as info:
        api_for(server.url, attempts=2, waits=waits).get_pod(NS, POD)
    assert len(waits) == 1  # retried once: transient, as urllib3's ProtocolError was
    assert str(info.value).startswith(f"Kubernetes API at {server.url} unreachable (get pods): ")
    assert "\n" not in str(info.value)


def test_a_429_s_retry_after_is_read_whatever_the_case_of_its_header(server):
    server.script += [Say(http("429 Too Many Requests", b'{"kind":"Status","message":"slow down"}',
                               "retry-after: 7")), Say(http("200 OK"))]
    waits: list[float] = []
    assert api_for(server.url, attempts=2, waits=waits).get_pod(NS, POD)["metadata"]["name"] == POD
    assert waits == [7.0]


def test_an_error_answer_is_typed_by_its_status_with_the_servers_message(server):
    server.script.append(Say(http("404 Not Found", b'{"kind":"Status","message":"pods \\"x\\" not found",'
                                                   b'"reason":"NotFound"}')))
    with pytest.raises(KubeNotFound) as info:
        api_for(server.url).get_pod(NS, "x")
    assert info.value.reason == "NotFound" and info.value.server_message == 'pods "x" not found'


def test_a_token_with_a_line_break_is_never_sent(server):
    api = api_for(server.url, api_key={"authorization": "t0ken\r\nX-Injected: yes"},
                  api_key_prefix={"authorization": "Bearer"})
    with pytest.raises(ValueError, match="line break"):
        api.get_pod(NS, POD)
    assert server.requests == []


def test_a_server_url_with_a_path_puts_it_before_every_request(server):
    server.script.append(Say(http("200 OK")))
    api_for(server.url + "/k8s/clusters/c-1").get_pod(NS, POD)
    [(head, _)] = server.requests
    assert head.startswith(f"GET /k8s/clusters/c-1/api/v1/namespaces/{NS}/pods/{POD} HTTP/1.1\r\n".encode())


def test_a_body_is_sent_once_as_compact_json_with_its_length(server):
    server.script.append(Say(http("201 Created", b'{"metadata":{"name":"i1"}}')))
    body = {"metadata": {"name": "i1"}, "spec": {"record": '{"a": 1}', "count": 2}}
    api_for(server.url).create_custom("g", "v1", NS, "things", body)
    [(head, sent)] = server.requests
    assert sent == json.dumps(body, separators=(",", ":")).encode()
    assert f"Content-Length: {len(sent)}\r\n".encode() in head


def test_through_an_http_proxy_urllib3_sends_the_request_as_a_proxy_expects_it(server):
    """A proxy in the configuration: urllib3's own path (the absolute URL in the request line)."""
    server.script.append(Say(http("200 OK")))
    api = api_for("http://kube.example:6443", proxy=server.url)
    assert api.get_pod(NS, POD)["metadata"]["name"] == POD
    [(head, _)] = server.requests
    assert head.startswith(f"GET http://kube.example:6443/api/v1/namespaces/{NS}/pods/{POD} HTTP/1.1\r\n".encode())


def test_a_refused_connection_is_urllib3s_error_retried_then_unavailable():
    listener = socket.create_server(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    listener.close()  # nothing listens there now
    waits: list[float] = []
    with pytest.raises(KubeError) as info:
        api_for(url, attempts=2, waits=waits).get_pod(NS, POD)
    assert type(info.value) is KubeUnavailable and len(waits) == 1
    assert "Connection refused" in str(info.value)
