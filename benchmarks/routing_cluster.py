"""The processes of benchmarks/routing.py: ``pdserve`` servers started on free ports, and the
counters read from their ``/metrics`` (workers' prefix-cache and prompt counters, routers'
routing reasons and requests per worker)."""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Process:
    """A started ``pdserve`` process whose output is kept (and written to ``log``)."""

    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    grpc: str = ""
    http: str = ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start_pdserve(args: list[str], log: Path, timeout_s: float = 600.0) -> Process:
    """``python -m pdserve ARGS --grpc-port 0 --http-port 0``; waits for its HTTP line."""
    cmd = [sys.executable, "-m", "pdserve", *args, "--grpc-port", "0", "--http-port", "0"]
    proc = subprocess.Popen(
        cmd, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    p = Process(proc)
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        with open(log, "w") as out:
            for line in proc.stdout:
                out.write(line)
                out.flush()
                p.lines.append(line)
                if line.startswith("pdserve: gRPC "):
                    p.grpc = line.split()[-1]
                elif line.startswith("pdserve: HTTP "):
                    p.http = line.split()[-1]
                    ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    if not ready.wait(timeout_s) or not p.http:
        p.stop()
        raise RuntimeError(f"{shlex.join(cmd)} did not start:\n" + "".join(p.lines[-40:]))
    print(f"started: {shlex.join(cmd)}", flush=True)
    return p


def scrape(url: str) -> list[tuple[str, dict[str, str], float]]:
    text = httpx.get(url, timeout=30, trust_env=False).text
    return [
        (s.name, dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


def wait_routable(router: Process, decode: int, prefill: int, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        pools = {
            labels.get("pool"): v
            for name, labels, v in scrape(f"{router.http}/metrics")
            if name == "pdserve_router_healthy_workers"
        }
        if pools.get("decode") == decode and pools.get("prefill") == prefill:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"router {router.http} sees {pools}")
        time.sleep(0.5)


def worker_counters(urls: list[str]) -> dict[str, dict[str, float]]:
    """Per worker (metrics URL): prefix-cache lookups and hits (blocks), generated tokens."""
    out: dict[str, dict[str, float]] = {}
    for url in urls:
        got: dict[str, float] = {}
        for name, _, value in scrape(url):
            if name == "pdserve_engine_prefix_cache_query_blocks_total":
                got["query"] = value
            elif name == "pdserve_engine_prefix_cache_hit_blocks_total":
                got["hit"] = value
            elif name == "pdserve_engine_prompt_tokens_computed_total":
                got["prompt_computed"] = value
            elif name == "pdserve_engine_kv_free_blocks":
                got["free"] = value
            elif name == "pdserve_engine_kv_blocks":
                got["blocks"] = value
            elif name == "pdserve_engine_requests":
                got["requests"] = got.get("requests", 0.0) + value
        out[url] = got
    return out


def router_counters(router: Process) -> dict[str, float]:
    """Routing decisions by reason and requests routed to each worker."""
    got: dict[str, float] = {}
    for name, labels, value in scrape(f"{router.http}/metrics"):
        if name == "pdserve_router_routing_decisions_total":
            got[f"reason:{labels['reason']}"] = value
        elif name == "pdserve_router_routed_requests_total":
            got[f"{labels['worker_role']}:{labels['worker_id']}"] = value
    return got


def wait_idle(urls: list[str], timeout_s: float = 120.0) -> None:
    """No request left on any worker (between variants)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(c.get("requests", 0.0) == 0 for c in worker_counters(urls).values()):
            return
        time.sleep(0.5)
    raise RuntimeError("workers still busy between variants")


def machine() -> dict[str, Any]:
    model = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": model,
        "cpus": os.cpu_count(),
        "loadavg_at_end": os.getloadavg(),
        "python": platform.python_version(),
    }
