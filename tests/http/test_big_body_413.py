"""A 50 MB POST to /alerts gets a 413 answer, not a connection reset (issue 19)."""

from __future__ import annotations

import http.client

from test_server_hardening import TOKEN, world  # noqa: F401  (the fixture)


def test_a_50_mb_post_is_answered_413(world):  # noqa: F811
    server = world()
    body = b"x" * (50 * 1024 * 1024)
    conn = http.client.HTTPConnection("127.0.0.1", server.sock.getsockname()[1], timeout=30)
    try:
        conn.request("POST", "/alerts", body=body, headers={"Authorization": f"Bearer {TOKEN}",
                                                            "Content-Type": "application/json"})
        answer = conn.getresponse()
        assert answer.status == 413 and b"body larger than" in answer.read()
    finally:
        conn.close()
