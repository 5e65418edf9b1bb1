"""A stand-in process for the kubelet's own test (test_kubelet.py): prints a line, waits
START_DELAY seconds, then either exits with EXIT_CODE or serves GET /health on --port."""

import os
import sys
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

print(f"starting {' '.join(sys.argv[1:])} MARK={os.environ.get('MARK', '')}", flush=True)
time.sleep(float(os.environ.get("START_DELAY", "0")))
if os.environ.get("EXIT_CODE"):
    print("fatal: exiting", flush=True)
    sys.exit(int(os.environ["EXIT_CODE"]))


class Health(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


port = int(sys.argv[sys.argv.index("--port") + 1])
print("serving", flush=True)
HTTPServer(("127.0.0.1", port), Health).serve_forever()
