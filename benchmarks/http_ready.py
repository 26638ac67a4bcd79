"""Waiting for a server a benchmark started: until an HTTP GET of ``url`` answers 200."""

from __future__ import annotations

import subprocess
import time
import urllib.request


def wait_http_ok(
    url: str,
    timeout_s: float,
    proc: subprocess.Popen[bytes] | None = None,
    interval_s: float = 0.5,
) -> None:
    """Poll ``url`` until it answers 200 (pdserve's ``/health`` answers 503 until it can
    serve); fail at once if ``proc``, the server, exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode} before {url} answered")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                if r.status == 200:
                    return
        except OSError:  # refused, 503, timed out
            pass
        time.sleep(interval_s)
    raise RuntimeError(f"{url} did not answer 200 within {timeout_s:.0f} s")
