"""The webhook as an attacker and a flaky network see it, over real sockets: malformed requests
answered quickly with a 4xx and a counted reason, /healthz under 500 slow connections, big valid
batches always accepted, a 10,000-alert storm folded into one message per workload."""

from __future__ import annotations

import json
import logging
import re
import socket
import threading
import time
import urllib.request

import pytest
from fakes import FakeCluster, kv_diagnosis

from bot.app.service import OncallService, Policy
from bot.app.work import WorkQueue
from bot.http.wire import Limits, printable
from bot.local.store import FolderIncidentStore
from bot.slack.app import build_app
from bot.slack.chat import SlackChat, make_client

NS = "inference"
TOKEN = "s3cret"
SUFFIXES = [a + b + c + d + e for a, b, c, d, e in zip("bcdfghjklm" * 40, "npqrstvwxz" * 40, "2456789bcd" * 40,
                                                        "fghjklmnpq" * 40, "rstvwxz245" * 40)]


def pod_name(workload: int, replica: int) -> str:
    return f"vllm-w{workload}-7d9f8c6b5-{SUFFIXES[replica]}"


def alert(pod: str, status: str = "firing") -> dict:
    return {"status": status, "labels": {"alertname": "KubePodCrashLooping", "namespace": NS, "pod": pod,
                                         "container": "vllm"}, "annotations": {}}


def batch(alerts: list[dict]) -> bytes:
    return json.dumps({"version": "4", "status": "firing", "receiver": "vllm-oncall", "alerts": alerts}).encode()


@pytest.fixture
def world(slack, tmp_path):
    """A server factory over the Slack stand-in, a FakeCluster and a FolderIncidentStore."""
    servers = []

    def make(workloads: int = 1, replicas: int = 1, **kw):
        cluster = FakeCluster()
        for w in range(workloads):
            for r in range(replicas):
                cluster.add_pod(NS, pod_name(w, r), f"vllm-w{w}")
        chat = SlackChat(make_client("xoxb-test", slack.url), "C0ALERTS", max_attempts=3, backoff_seconds=0.01)
        service = OncallService(cluster, FolderIncidentStore(tmp_path / f"s{len(servers)}"), chat,
                                Policy(approver_users=frozenset({"U0APPROVER"})), metrics=chat.metrics,
                                diagnose=kv_diagnosis)
        app = build_app(service, chat.client, signing_secret="signing", token_verification_enabled=False)
        from bot.http.server import BotServer

        server = BotServer(service, alert_token=TOKEN, bolt_app=app, **kw).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


def counted(server, name: str, label: str | None = None) -> float:
    counter = getattr(server.metrics, name)
    return (counter.labels(label) if label else counter)._value.get()


def raw_exchange(server, data: bytes, wait: float = 3.0, close_write: bool = False) -> tuple[int, float]:
    """Send raw bytes, return (status, seconds until the answer). The socket stays open for
    writing unless close_write, so a server waiting for more bytes would hang here."""
    host, port = server.sock.getsockname()[:2]
    started = time.monotonic()
    with socket.create_connection((host, port), timeout=wait) as sock:
        sock.sendall(data)
        if close_write:
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        while b"\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    match = re.match(rb"HTTP/1\.1 (\d{3}) ", answer)
    assert match, f"no HTTP answer: {answer[:80]!r}"
    return int(match.group(1)), time.monotonic() - started


def post_head(path: str, extra: str) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nHost: bot\r\nAuthorization: Bearer {TOKEN}\r\n"
            f"Content-Type: application/json\r\n{extra}\r\n").encode()


DEEP = b"[" * 100_000 + b"]" * 100_000
NESTED_40 = b'{"version": "4", "status": "firing", "alerts": [], "x": ' + b"[" * 40 + b"]" * 40 + b"}"
MALFORMED = [
    ("content-length abc", post_head("/alerts", "Content-Length: abc\r\n") + b"{}", 400, "bad_content_length"),
    ("content-length -1", post_head("/alerts", "Content-Length: -1\r\n") + b"{}", 400, "bad_content_length"),
    ("content-length missing", post_head("/alerts", "") + b'{"version": "4"}', 411, "missing_content_length"),
    ("content-length larger than the body", post_head("/alerts", "Content-Length: 100\r\n") + b'{"v": 1}', 408,
     "body_timeout"),
    ("two content-lengths", post_head("/alerts", "Content-Length: 2\r\nContent-Length: 3\r\n") + b"{}", 400,
     "bad_content_length"),
    ("chunked", post_head("/alerts", "Transfer-Encoding: chunked\r\n") + b"2\r\n{}\r\n0\r\n\r\n", 411,
     "transfer_encoding"),
    ("body too large", post_head("/alerts", f"Content-Length: {Limits.max_body_bytes + 1}\r\n"), 413,
     "body_too_large"),
    ("head too large", post_head("/alerts", "X-Pad: " + "a" * 20_000 + "\r\n"), 431, "head_too_large"),
    ("not http", b"HELLO THERE\r\n\r\n", 400, "bad_request_line"),
    ("bad header", b"GET /healthz HTTP/1.1\r\nno colon here\r\n\r\n", 400, "bad_header"),
    ("deeply nested json", post_head("/alerts", f"Content-Length: {len(DEEP)}\r\n") + DEEP, 400, "json_too_deep"),
    ("nested json over the depth limit", post_head("/alerts", f"Content-Length: {len(NESTED_40)}\r\n") + NESTED_40,
     400, "json_too_deep"),
    ("malformed json", post_head("/alerts", "Content-Length: 5\r\n") + b'{"a":', 400, "malformed_json"),
    ("not a webhook", post_head("/alerts", "Content-Length: 2\r\n") + b"{}", 400, "not_a_webhook"),
    ("invalid utf-8 to slack", post_head("/slack/events", "Content-Length: 4\r\n") + b"\xff\xfe{}", 400,
     "invalid_utf8"),
    ("unknown path", b"GET /etc/passwd HTTP/1.1\r\n\r\n", 404, "not_found"),
]


@pytest.mark.parametrize("data,status,reason", [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_malformed_requests_get_a_quick_counted_4xx(world, data, status, reason):
    server = world(limits=Limits(body_idle_timeout=0.3))  # the 408 case waits for this, not the 2 s default
    before = counted(server, "http_rejected", reason)
    answer, seconds = raw_exchange(server, data)
    assert answer == status and seconds < 1.0
    assert counted(server, "http_rejected", reason) == before + 1
    assert request(server, "/healthz") == (200, "ok\n")  # and the server is still fine


def test_a_body_cut_short_by_the_client_is_400(world):
    server = world()
    answer, seconds = raw_exchange(server, post_head("/alerts", "Content-Length: 100\r\n") + b"{}", close_write=True)
    assert answer == 400 and seconds < 1.0 and counted(server, "http_rejected", "body_incomplete") == 1


def test_wrong_token_is_counted(world):
    server = world()
    answer, _ = raw_exchange(server, b"POST /alerts HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}")
    assert answer == 401 and counted(server, "http_rejected", "unauthorized") == 1


def request(server, path: str, body: bytes | None = None, timeout: float = 5) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
    req = urllib.request.Request(server.url + path, data=body, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def open_slow_clients(server, count: int) -> list[socket.socket]:
    host, port = server.sock.getsockname()[:2]
    clients = []
    for _ in range(count):
        sock = socket.create_connection((host, port), timeout=5)
        sock.sendall(b"POST /alerts HTTP/1.1\r\nHost: bot\r\n")  # and then nothing more, for a while
        clients.append(sock)
    return clients


def test_healthz_is_served_under_500_slow_connections(world):
    server = world()
    clients = open_slow_clients(server, 500)
    try:
        for _ in range(5):
            # answered within the client's 2 s, long before any slow client's head deadline: the 500
            # slow connections hold no worker (no wall-time figure asserted: a busy machine is slow)
            assert request(server, "/healthz", timeout=2) == (200, "ok\n")
    finally:
        for sock in clients:
            sock.close()


def test_slow_clients_are_cut_off_and_the_cap_answers_at_once(world):
    # The head deadline is real time (a socket's): long enough that a loaded machine opens the 20
    # slow clients and asks once more before it cuts them off; "at once" is well inside it.
    server = world(limits=Limits(head_timeout=3.0, max_connections=20))
    clients = open_slow_clients(server, 20)
    try:
        answer, seconds = raw_exchange(server, b"GET /healthz HTTP/1.1\r\n\r\n")
        assert answer == 503 and seconds < 1.5 and counted(server, "http_rejected", "too_many_connections") >= 1
        clients[0].settimeout(60)
        assert clients[0].recv(100).startswith(b"HTTP/1.1 408 ")  # the slow client's head deadline
        deadline = time.monotonic() + 60
        while counted(server, "http_rejected", "head_timeout") < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert counted(server, "http_rejected", "head_timeout") == 20
        assert request(server, "/healthz") == (200, "ok\n")  # room again
    finally:
        for sock in clients:
            sock.close()


def test_keep_alive_connection_serves_several_requests(world):
    server = world()
    host, port = server.sock.getsockname()[:2]
    with socket.create_connection((host, port), timeout=3) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\nGET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        answer = b""
        while answer.count(b"ok\n") < 2:
            answer += sock.recv(4096)
    assert answer.count(b"HTTP/1.1 200 OK") == 2


def total(server, name: str, labels: tuple[str, ...]) -> float:
    return sum(counted(server, name, label) for label in labels)


# The storms below end in 25 and 50 incidents, each diagnosed, read from the API and posted: on a
# loaded machine (a failed run saw load 26 on 2 cores) that outlasted 60 s. The wait ends when the
# queue is idle; this only bounds a stuck queue, like the watch storm's (tests/kube/test_watch_storm.py).
WORK_BOUND = 300


def test_a_valid_1000_alert_batch_is_accepted_and_handled(world, slack):
    server = world(workloads=25, replicas=10, work=WorkQueue(workers=2, queue_size=4))
    alerts = [alert(pod_name(w, r)) for w in range(25) for r in range(10)] * 4
    status, body = request(server, "/alerts", batch(alerts))
    assert status == 200 and json.loads(body)["accepted"] == 1000
    assert server.executor.wait_idle(WORK_BOUND)
    assert total(server, "webhook_alerts", ("queued", "folded", "duplicate")) == 1000
    assert counted(server, "webhook_alerts", "duplicate") == 750
    assert len(slack.posts()) == 25


def test_a_10000_alert_storm_over_50_workloads_ends_with_50_messages(world, slack):
    server = world(workloads=50, replicas=2, work=WorkQueue(workers=2, queue_size=8))
    pods = [pod_name(w, r) for w in range(50) for r in range(2)]
    batches = [batch([alert(pods[(i * 7 + j) % len(pods)]) for j in range(1000)]) for i in range(10)]
    answers: list[int] = []

    def send(body: bytes) -> None:
        answers.append(request(server, "/alerts", body, timeout=20)[0])

    threads = [threading.Thread(target=send, args=(b,)) for b in batches]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert answers == [200] * 10  # never a 503
    assert server.executor.wait_idle(WORK_BOUND)
    assert total(server, "webhook_alerts", ("queued", "folded", "duplicate")) == 10_000
    incidents = server.service.store.list()
    assert len(incidents) == 50
    # Each workload is named once at the top level: its own message, or (when more than a few
    # waited for the channel while another posted: a busy machine) a line of a grouped message.
    own = [i for i in incidents if i.group is None]
    groups = {i.group.message_id for i in incidents if i.group is not None}
    assert all(i.message_id for i in own)
    assert len(slack.posts()) == len(own) + len(groups)
    handled = total(server, "alerts_received", ("firing",))
    assert sum(i.alert_count for i in incidents) == handled  # every handled alert is in an incident
    assert counted(server, "alert_work_items") <= handled


def test_only_a_bot_far_behind_answers_503(world):
    server = world(workloads=1, replicas=3, work=WorkQueue(workers=1, queue_size=100, max_pending_alerts=2))
    gate, running = threading.Event(), threading.Event()
    collect = server.service.cluster.collect
    # a stuck API: held until the test is done (the bound only ends a failed test)
    server.service.cluster.collect = lambda *a, **k: (running.set(), gate.wait(120), collect(*a, **k))[2]
    try:
        assert request(server, "/alerts", batch([alert(pod_name(0, 0))]))[0] == 200  # running, stuck
        assert running.wait(60), "the first alert's work never started"
        assert request(server, "/alerts", batch([alert(pod_name(0, 1)), alert(pod_name(0, 2))]))[0] == 200
        status, body = request(server, "/alerts", batch([alert(pod_name(0, 0))]))
        assert status == 503 and "busy" in body and counted(server, "http_rejected", "busy") == 1
    finally:
        gate.set()
    assert server.executor.wait_idle(60)


def test_a_newline_in_a_label_cannot_forge_a_log_line(world, slack, caplog):
    server = world()
    forged = alert("x\nERROR forged line")
    forged["labels"]["alertname"] = "Kube\r\nPodCrashLooping"
    other = alert(pod_name(0, 0))
    other["labels"]["container"] = "vllm\n<!channel>"
    with caplog.at_level(logging.DEBUG):
        status, body = request(server, "/alerts", batch([forged, alert("bad\npod"), other]) )
        server.executor.wait_idle(5)
    answer = json.loads(body)
    assert status == 200 and answer["accepted"] == 0
    assert [s["reason"].split(":")[0] for s in answer["skipped"]] == ["ignored alertname", "invalid label",
                                                                       "invalid label"]
    assert all("\n" not in r.getMessage() and "\r" not in r.getMessage() for r in caplog.records)
    assert slack.posts() == []


def test_printable_escapes_control_characters():
    assert printable("a\nb\r\x1b[31mc\u2028") == "a\\nb\\r\\x1b[31mc\\u2028"
    assert printable("x" * 500, 10) == "x" * 10 + "..."
