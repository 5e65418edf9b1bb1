"""The Web API client over HTTPS: it verifies Slack's certificate against the system's CA bundle
(SSL_CERT_FILE here, naming a CA made for the test) and reads that bundle once, when the client
is made, not at every call (WebClient opens a connection per call: loading the bundle each time
cost 5-20 ms of CPU per Slack call). The server is a local HTTPS answerer of auth.test with a
certificate for 127.0.0.1, made by the openssl command (skipped where there is none)."""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import threading
import urllib.error
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bot.slack.chat import make_client

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


class AuthTest(BaseHTTPRequestHandler):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = json.dumps({"ok": True, "user_id": "U0BOT", "bot_id": "B0BOT"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate (its own CA) for 127.0.0.1, and its key."""
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


@pytest.fixture
def https_slack(tmp_path) -> Iterator[tuple[str, Path]]:
    """(the API's base URL, the CA certificate that signed it)."""
    cert, key = certificate(tmp_path)
    server = ThreadingHTTPServer(("127.0.0.1", 0), AuthTest)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(cert, key)
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/api/", cert
    finally:
        server.shutdown()
        server.server_close()


def test_the_certificate_is_verified_against_the_ca_bundle_read_when_the_client_is_made(https_slack, monkeypatch,
                                                                                           tmp_path):
    url, ca = https_slack
    monkeypatch.setenv("SSL_CERT_FILE", str(ca))
    client = make_client("xoxb-test-token", url)
    assert client.auth_test()["user_id"] == "U0BOT"
    # Read once: a bundle that no longer trusts the server, named after the client was made, is not read.
    (tmp_path / "other").mkdir()
    other, _ = certificate(tmp_path / "other")
    monkeypatch.setenv("SSL_CERT_FILE", str(other))
    assert client.auth_test()["user_id"] == "U0BOT"
    # ... and a client made now reads it, and refuses the server it does not trust.
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        make_client("xoxb-test-token", url).auth_test()


def test_a_server_the_bundle_does_not_trust_is_refused(https_slack, monkeypatch, tmp_path):
    url, _ = https_slack
    (tmp_path / "other").mkdir()
    other, _ = certificate(tmp_path / "other")
    monkeypatch.setenv("SSL_CERT_FILE", str(other))
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        make_client("xoxb-test-token", url).auth_test()
