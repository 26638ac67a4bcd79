"""A local ``redis-server`` child: ``pdserve serve --redis auto`` runs its control plane on
one, and the tests use the same class. Started on a free loopback port with no persistence;
stoppable, restartable (same port: clients reconnect) and pausable (SIGSTOP: calls time out).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pdserve.ports import free_port


class _ExitedAtStart(RuntimeError):
    pass


class RedisServer:
    def __init__(self, workdir: Path, port: int | None = None) -> None:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError(
                "redis-server is not installed (Debian: apt install redis-server; "
                "tests/ci/install.sh installs it)"
            )
        self.exe = exe
        self.workdir = workdir
        self.port = port or free_port()
        self._drawn = port is None  # our own draw: on a clash, start draws another
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0, attempts: int = 3) -> None:
        """Start and wait for PING. When the port was drawn here (none given) and the server
        exits at once (another listener took the port meanwhile), a new port is drawn, up to
        ``attempts`` starts; a restart keeps the port it has."""
        for attempt in range(1, attempts + 1):
            try:
                self._start_once(timeout_s)
                return
            except _ExitedAtStart:
                if not self._drawn or attempt == attempts:
                    raise
                self.port = free_port()

    def _start_once(self, timeout_s: float) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen(
            [
                self.exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.workdir),
                "--protected-mode",
                "yes",
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise _ExitedAtStart(
                    f"redis-server on port {self.port} exited with {self.proc.returncode}"
                )
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.05)
        raise TimeoutError("redis-server did not answer PING")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.proc = None

    def restart(self) -> None:
        """Stop and start again on the same port, empty (no persistence)."""
        self.stop()
        self._drawn = False  # clients hold this port now
        self.start()

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)


@contextmanager
def redis_server(workdir: Path) -> Iterator[RedisServer]:
    server = RedisServer(workdir)
    server.start()
    try:
        yield server
    finally:
        server.stop()
