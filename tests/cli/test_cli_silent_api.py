"""Bounded time-outs (issue 19): an API server that accepts TCP and never answers, or a web server
that is not an API server, makes `why` fail in one line naming the URL it tried."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml


def kubeconfig(tmp_path, server: str):
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": server}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    return path


def why(tmp_path, server: str, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bot.cli", "why", "inference/vllm-0", "--kubeconfig",
                           str(kubeconfig(tmp_path, server)), *extra], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path)


@pytest.fixture
def silent_server():
    """Accepts connections and reads nothing, answers nothing."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    stop.set()
    thread.join(5)
    for conn in held:
        conn.close()
    listener.close()


def test_a_silent_api_server_fails_in_one_line_naming_the_url(silent_server, tmp_path):
    done = why(tmp_path, silent_server, "--request-timeout", "0.3")
    assert done.returncode == 2 and done.stdout == ""
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"vllm-oncall: Kubernetes API at {silent_server} unreachable (get pods)")
    assert "timed out" in line


def test_the_default_request_timeout_keeps_a_command_under_15_seconds():
    from bot.cli.kube import CONNECT_TIMEOUT_SECONDS, REQUEST_TIMEOUT_SECONDS

    # connect check, then tries that start within 2 x the timeout and each end within 1 x
    assert CONNECT_TIMEOUT_SECONDS + 3 * REQUEST_TIMEOUT_SECONDS < 15


class NotKubernetes(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"404 page not found\n"
        self.send_response(404)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def test_a_web_server_that_is_not_an_api_server_is_named(tmp_path):
    server = ThreadingHTTPServer(("127.0.0.1", 0), NotKubernetes)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        done = why(tmp_path, url)
    finally:
        server.shutdown()
        server.server_close()
    assert done.returncode == 2 and "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert f"{url} answered 404" in line and "is it a Kubernetes API server?" in line
