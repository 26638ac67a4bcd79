"""The chaos benchmark's faults on a running cluster (``tests.faults.cluster``), each logged with
its time.

- ``kill``: ``kill -9`` a worker, then start a replacement on the same port;
- ``pause``: SIGSTOP a worker for a few seconds, then SIGCONT;
- ``drain``: SIGTERM a worker (it drains within its ``--shutdown-grace-s``), then restart it;
- ``cancel``: a burst of requests the client gives up on mid-stream (HTTP connection closed,
  HTTP read timeout, gRPC cancel, gRPC deadline) — run by the caller, which owns the clients.

A worker fault never takes a role's last healthy worker: with both workers of a role down
every request would fail for as long as the replacement takes to start, which tells nothing
about fault handling. Each worker is under at most one fault at a time.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.faults.cluster import Cluster
from tests.services.workers import WorkerProcess, spawn_worker, wait_started

WORKER_FAULTS = ("kill", "pause", "drain")
ROLES = ("prefill", "decode")
CANCEL = "cancel"
PAUSE_S = (2.0, 8.0)  # SIGSTOP length, uniform; the router's stall timeout lies inside


@dataclass
class FaultLog:
    """Every fault with its time since the start, printed as it happens."""

    start: float = field(default_factory=time.monotonic)
    lines: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, message: str) -> None:
        line = f"t={time.monotonic() - self.start:7.1f}s  {message}"
        with self._lock:
            self.lines.append(line)
        print(line, flush=True)


@dataclass
class WorkerFaults:
    """Draws and applies worker faults; replaced workers take their old place in ``cluster``."""

    cluster: Cluster
    model: Path
    worker_args: dict[str, Sequence[str]]  # role -> the argv the cluster started it with
    num_kv_blocks: int
    log: FaultLog
    retired: list[WorkerProcess] = field(default_factory=list)  # killed/drained, for their logs
    _busy: set[str] = field(default_factory=set)  # targets under a fault now
    _bag: list[tuple[str, str]] = field(default_factory=list)  # (kind, role) still to draw
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def pick(self, rng: random.Random) -> tuple[str, WorkerProcess | None]:
        """The next fault and its worker (``None`` for ``cancel``); marks the worker busy.

        Faults come from a shuffled bag of every (kind, role) and a cancel burst, refilled when
        empty, so each kind hits each role as often; the first one whose role has both workers
        healthy is taken (a cancel burst when none has)."""
        with self._lock:
            if not self._bag:
                self._bag = [(k, r) for k in WORKER_FAULTS for r in ROLES] + [(CANCEL, "")]
                rng.shuffle(self._bag)
            for i, (kind, role) in enumerate(self._bag):
                pool = self.cluster.prefill if role == "prefill" else self.cluster.decode
                if kind == CANCEL or not self._busy.intersection(w.target for w in pool):
                    del self._bag[i]
                    if kind == CANCEL:
                        return CANCEL, None
                    worker = rng.choice(pool)
                    self._busy.add(worker.target)
                    return kind, worker
        return CANCEL, None

    def apply(self, kind: str, worker: WorkerProcess, rng: random.Random) -> None:
        """Blocking: returns once the worker serves again (its replacement healthy). A
        replacement that does not start (its port taken meanwhile, say) is logged and its
        worker stays busy, never drawn again: the role runs one short from then on."""
        name = f"{worker.role} {worker.target}"
        if kind == "pause":
            pause_s = rng.uniform(*PAUSE_S)
            self.log(f"SIGSTOP {name} for {pause_s:.1f}s")
            worker.pause()
            time.sleep(pause_s)
            worker.resume()
            self.log(f"SIGCONT {name}")
        else:
            if kind == "kill":
                self.log(f"kill -9 {name}")
                worker.kill()
            else:
                self.log(f"SIGTERM {name} (drain)")
                status = worker.stop(timeout_s=60.0)
                self.log(f"{name} exited with status {status} after the drain")
            try:
                self._replace(worker)
            except RuntimeError as e:
                self.log(f"replacement {name} did not start, left out from now on: {e}")
                return
        with self._lock:
            self._busy.discard(worker.target)

    def _replace(self, old: WorkerProcess) -> None:
        port = int(old.target.rsplit(":", 1)[1])
        args = self.worker_args[old.role]
        new = spawn_worker(old.role, self.model, *args, num_kv_blocks=self.num_kv_blocks, port=port)
        wait_started(new)
        pool = self.cluster.prefill if old.role == "prefill" else self.cluster.decode
        pool[pool.index(old)] = new
        self.retired.append(old)
        self.log(f"replacement {old.role} {new.target} serving (pid {new.pid})")
