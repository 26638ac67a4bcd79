"""benchmarks/http_ready.py against a real HTTP server: 503 until ready, then 200; a server
process that exits first fails the wait at once."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from benchmarks.http_ready import wait_http_ok


def test_waits_through_503_until_200() -> None:
    ready_at = time.monotonic() + 0.6
    hits: list[int] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code = 200 if time.monotonic() >= ready_at else 503
            hits.append(code)
            self.send_response(code)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        wait_http_ok(f"http://127.0.0.1:{server.server_port}/health", 10, interval_s=0.1)
    finally:
        server.shutdown()
        server.server_close()
    assert hits[0] == 503 and hits[-1] == 200
    assert time.monotonic() >= ready_at


def test_a_server_that_exits_first_fails_at_once() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="exited with 3"):
        wait_http_ok("http://127.0.0.1:9/health", 30, proc)
    assert time.monotonic() - t0 < 5
