"""Start real prefill/decode worker processes on loopback for the tests, and check their pools.

``launch_worker`` returns a ``WorkerProcess`` a test can stop, kill, pause (SIGSTOP) and
resume; ``wait_pools_free`` is the end-of-test check that every pool is fully free again.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import httpx
from prometheus_client.parser import text_string_to_metric_families

from pdserve.launch import wait_healthy
from protos.pdserve.v1 import worker_pb2 as wpb
from protos.pdserve.v1 import worker_pb2_grpc
from tests.sockets import free_port

REPO = Path(__file__).resolve().parents[2]
STARTUP_TIMEOUT_S = 300.0  # generous: the machine may be shared and loaded


@dataclass
class WorkerProcess:
    """One ``python -m {role}_service`` child; its output is kept in ``lines``."""

    role: str  # "prefill" | "decode"
    proc: subprocess.Popen[str]
    target: str  # gRPC host:port
    lines: list[str] = field(default_factory=list)
    metrics_url: str | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def is_alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        return "".join(self.lines)

    def load(self, check_integrity: bool = False, timeout_s: float = 10.0) -> wpb.WorkerLoad:
        """``GetLoad`` (with the worker's invariant checks when ``check_integrity``)."""
        stub_cls = (
            worker_pb2_grpc.DecodeWorkerStub
            if self.role == "decode"
            else worker_pb2_grpc.PrefillWorkerStub
        )
        with grpc.insecure_channel(self.target) as channel:
            request = wpb.GetLoadRequest(check_integrity=check_integrity)
            return stub_cls(channel).GetLoad(request, timeout=timeout_s)  # type: ignore[no-any-return]

    def metrics(self) -> dict[str, float]:
        """This worker's own ``/metrics`` samples without labels: name -> value."""
        assert self.metrics_url is not None, "started without a metrics port"
        text = httpx.get(self.metrics_url, timeout=10).text
        return {
            sample.name: sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }

    def metric(self, name: str) -> float:
        """The sum of sample ``name``'s values over its label sets in this worker's
        ``/metrics`` (0 when absent), read without parsing the whole exposition: cheap
        enough to poll in a tight loop."""
        assert self.metrics_url is not None, "started without a metrics port"
        text = httpx.get(self.metrics_url, timeout=10).text
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in text.splitlines()
            if line.startswith((name + "{", name + " "))
        )

    def cpu_seconds(self) -> float | None:
        """CPU time all of this process's threads have had so far (the scheduler's own
        count, in ns, from /proc), or None where /proc does not tell it."""
        total = 0
        try:
            tasks = list(os.scandir(f"/proc/{self.pid}/task"))
        except OSError:
            return None
        for task in tasks:
            try:
                with open(f"{task.path}/schedstat") as f:
                    total += int(f.read().split()[0])
            except FileNotFoundError:
                continue  # the thread ended meanwhile
            except (OSError, ValueError, IndexError):
                return None
        return total / 1e9

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def kill(self) -> None:
        if self.is_alive:
            self.proc.send_signal(signal.SIGCONT)  # a stopped process dies only when resumed
            self.proc.kill()
        self.proc.wait()

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM, then SIGKILL after ``timeout_s``; returns the exit status."""
        if self.is_alive:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


_spawned: list[subprocess.Popen[str]] = []


@atexit.register
def _kill_leftovers() -> None:
    """A test killed by its timeout may skip its cleanup: no worker outlives the run."""
    for proc in _spawned:
        if proc.poll() is None:
            proc.send_signal(signal.SIGCONT)
            proc.kill()


def child_pids(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (Linux: read from /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()  # after "pid (comm)"
            except OSError:
                continue  # exited meanwhile
            if int(fields[1]) == pid:  # ppid
                found.append(int(entry))
    return found


def spawn_worker(
    role: str, model: Path, *args: str, num_kv_blocks: int = 128, port: int | None = None
) -> WorkerProcess:
    """Start the worker without waiting for it (see ``wait_started``): several start faster
    side by side. ``args`` go last, so they override the defaults here."""
    port = port or free_port()
    cmd = [
        sys.executable, "-m", f"{role}_service",
        "--port", str(port), "--model", str(model), "--dtype", "float32",
        "--num-kv-blocks", str(num_kv_blocks),
        *args,
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    _spawned.append(proc)
    worker = WorkerProcess(role, proc, f"127.0.0.1:{port}")

    def pump() -> None:  # keeps reading so the worker never blocks on a full pipe
        assert proc.stdout is not None
        for line in proc.stdout:
            worker.lines.append(line)
            if " metrics http" in line:
                worker.metrics_url = line.split()[-1]
            if os.environ.get("PDSERVE_TEST_ECHO"):
                sys.stderr.write(f"[{role} {port}] {line}")

    threading.Thread(target=pump, daemon=True).start()
    return worker


def wait_started(worker: WorkerProcess, timeout_s: float = STARTUP_TIMEOUT_S) -> WorkerProcess:
    try:
        wait_healthy(worker.target, worker.proc, timeout_s)  # type: ignore[arg-type]
    except (RuntimeError, TimeoutError) as e:
        worker.kill()
        raise RuntimeError(f"{worker.role} worker did not start: {e}\n{worker.output()}") from e
    deadline = time.monotonic() + 10
    while worker.metrics_url is None and time.monotonic() < deadline:
        time.sleep(0.02)  # printed right after the gRPC address
    return worker


def launch_worker(role: str, model: Path, *args: str, num_kv_blocks: int = 128) -> WorkerProcess:
    return wait_started(spawn_worker(role, model, *args, num_kv_blocks=num_kv_blocks))


@contextmanager
def start_worker(role: str, model: Path, *args: str) -> Iterator[str]:
    """Run ``python -m {role}_service`` and yield its gRPC target; stop it afterwards."""
    worker = launch_worker(role, model, *args)
    try:
        yield worker.target
    finally:
        worker.stop()


def pool_problems(worker: WorkerProcess) -> list[str]:
    """Why ``worker``'s pool is not fully free now (empty: it is), from ``GetLoad`` with the
    worker's invariant checks and from its ``/metrics``."""
    load = worker.load(check_integrity=True)
    problems = []
    if load.num_free_blocks != load.num_blocks:
        problems.append(f"{load.num_blocks - load.num_free_blocks} blocks held")
    if load.num_running_requests or load.num_waiting_requests:
        problems.append(f"{load.num_running_requests} running, {load.num_waiting_requests} waiting")
    if load.num_reservations:
        problems.append(f"{load.num_reservations} reservations/transfers open")
    if not load.integrity_checked:
        problems.append("the integrity check did not run")
    elif load.integrity_error:
        problems.append(load.integrity_error)
    if worker.metrics_url is not None:
        m = worker.metrics()
        free, total = m["pdserve_engine_kv_free_blocks"], m["pdserve_engine_kv_blocks"]
        if free != total:
            problems.append(f"/metrics: {total - free:.0f} blocks held")
    return problems


def wait_pools_free(workers: Sequence[WorkerProcess], timeout_s: float = 20.0) -> None:
    """Wait until every live worker's pool is fully free: every block free (GetLoad and
    /metrics), nothing running or waiting, no reservation or transfer open, and every
    invariant of ``check_integrity`` holding. Raises AssertionError naming what is held."""
    deadline = time.monotonic() + timeout_s
    while True:
        problems = {
            f"{w.role} {w.target}": p for w in workers if w.is_alive and (p := pool_problems(w))
        }
        if not problems:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"pools not free after {timeout_s:.0f}s: {problems}")
        time.sleep(0.1)
