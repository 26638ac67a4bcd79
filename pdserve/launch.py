"""``pdserve serve`` in disaggregated mode: start a decode and a prefill worker as child
processes, then run the router in this process over them. Every child is stopped on exit."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pdserve.tls import ClientTls

REPO_ROOT = Path(__file__).resolve().parent.parent


def serve_kv_transport(requested: str, *pinned: set[int] | None) -> tuple[str, str | None]:
    """The KV transport ``pdserve serve`` gives its workers, and why when it overrides "auto".

    "auto" means UCX when ucxx is installed, except when a worker is pinned to a single CPU:
    there, on the 2-core VM this was measured on, UCX (ucxx thread progress with Python
    futures, any UCX_TLS) froze the decode worker's token stream to the router for up to the
    whole length of a concurrent prefill (1.4-3.4 s per 1024-token burst; docs/kv_transfer.md),
    while TCP, or UCX on unpinned workers, did not. Pinning either worker alone also stalled,
    so the rule needs both workers' CPU sets: it lives here, not in the decode worker's
    ``resolve_transport``, which sees only its own. "auto" takes TCP there; an explicit
    transport is always kept.
    """
    if requested == "auto" and any(cpus is not None and len(cpus) == 1 for cpus in pinned):
        return "tcp", (
            "a worker is pinned to one CPU: KV transport tcp (UCX stalls decode's token stream "
            "in that layout; pass --kv-transport ucx to override)"
        )
    return requested, None


# ``pdserve serve``'s decode workers run at this niceness by default (``--decode-nice``): when
# they share cores with the prefill workers, prompts get the CPU first. Measured on the 2-core
# VM with vLLM's client (docs/benchmarks.md, 2026-12-06; medians of 3): TTFT p50 18.3 -> 8.7 s,
# TPOT p50 106 -> 161 ms, output tok/s the same.
DEFAULT_DECODE_NICE = 2


def check_nice(value: int, flag: str) -> int:
    """A worker's niceness: 0 (the router's own priority) to 19 (the lowest). Raising a
    worker above the router would need CAP_SYS_NICE and starve the router's event loop."""
    if not 0 <= value <= 19:
        raise ValueError(f"{flag} must be 0 (no change) to 19 (lowest priority), got {value}")
    return value


def parse_cpus(spec: str | None) -> set[int] | None:
    if not spec:
        return None
    return {int(x) for x in spec.split(",") if x.strip()}


def start_worker(
    role: str,
    model: str,
    port: int,
    extra: Sequence[str],
    cpus: set[int] | None,
    nice: int = 0,
) -> subprocess.Popen[bytes]:
    """Start ``python -m {role}_service``; ``cpus`` pins it (like ``taskset``), ``nice``
    lowers its CPU priority (like ``nice -n``): it only matters where workers share cores."""
    cmd = [sys.executable, "-m", f"{role}_service", "--port", str(port), "--model", model, *extra]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    if cpus:
        env.setdefault("OMP_NUM_THREADS", str(len(cpus)))

    def prepare() -> None:  # in the child, before exec
        # Its own process group: Ctrl-C reaches only ``pdserve serve``, which drains the
        # router first and then stops its workers (with nothing left in flight).
        os.setpgrp()
        _die_with_parent()
        if cpus:
            os.sched_setaffinity(0, cpus)
        if nice:
            os.nice(nice)

    return subprocess.Popen(cmd, env=env, preexec_fn=prepare)


def _die_with_parent() -> None:
    """Linux: SIGTERM this process when its parent dies (a killed ``pdserve serve`` leaves no
    worker behind; SIGTERM lets it drain)."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)


def wait_healthy(
    target: str, proc: subprocess.Popen[bytes], timeout_s: float, tls: ClientTls | None = None
) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    from pdserve.tls import open_sync_channel

    deadline = time.monotonic() + timeout_s
    with open_sync_channel(target, tls) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"worker at {target} exited with status {proc.returncode}")
            try:
                reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=1.0)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                time.sleep(0.2)
    raise TimeoutError(f"worker at {target} not healthy within {timeout_s:.0f}s")


def terminate(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    """SIGTERM every process still running: each drains and exits by itself."""
    for p in procs:
        if p.poll() is None:
            p.terminate()


def stop_workers(procs: Sequence[subprocess.Popen[bytes]], timeout_s: float = 15.0) -> None:
    """Terminate the workers and wait; SIGKILL one still alive after ``timeout_s``."""
    terminate(procs)
    deadline = time.monotonic() + timeout_s
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
