"""Free TCP ports for the servers pdserve starts itself (a local redis-server, the workers of
``pdserve serve`` when no port is given).

A port from ``bind(0)`` is an ephemeral one: between the call and the child binding it, any
outgoing connection on the machine may be handed the same port, and the child fails with
"Address already in use". These ports are drawn below the kernel's ephemeral range instead,
where only another listener can take one, and each is checked with a bind first.

Two draws that run at once (the tests run in parallel; two ``pdserve serve`` may start
together) can still pick the same free port, and the slower child loses it. So each drawn port
is also reserved for ``HOLD_S`` seconds, machine-wide, by a file created exclusively under
``$TMPDIR/pdserve-ports``: a draw skips a port another draw reserved until the reservation is
stale, by which time its child has bound it (and the bind check skips it) or never will.
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
import time
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_SPAN = 12_000  # how far below the ephemeral range the ports are drawn
HOLD_S = 120.0  # how long a drawn port stays reserved against other draws


class _Reservations:
    """The machine-wide claims on drawn ports: one file per port, checked and written under
    an exclusive lock on the folder, so that two draws never both claim a port."""

    def __init__(self) -> None:
        self.folder: Path | None = Path(tempfile.gettempdir()) / "pdserve-ports"
        try:
            self.folder.mkdir(exist_ok=True)
            self._lock = os.open(self.folder / ".lock", os.O_CREAT | os.O_RDWR, 0o666)
        except OSError:
            self.folder = None  # no reservations possible here: the bind check stands alone

    def __enter__(self) -> _Reservations:
        if self.folder is not None:
            fcntl.flock(self._lock, fcntl.LOCK_EX)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.folder is not None:
            fcntl.flock(self._lock, fcntl.LOCK_UN)
            os.close(self._lock)

    def claim(self, port: int) -> bool:
        """False while another draw's claim on ``port`` is fresh (younger than ``HOLD_S``)."""
        if self.folder is None:
            return True
        path = self.folder / str(port)
        try:
            if time.time() - path.stat().st_mtime < HOLD_S:
                return False
        except FileNotFoundError:
            pass
        try:
            path.touch()  # touching a stale claim makes it fresh again
        except OSError:
            pass  # cannot write the claim: the bind check stands alone
        return True


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768 elsewhere)."""
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports that ``host`` can bind now, below the ephemeral range, each one
    reserved against other draws for ``HOLD_S`` seconds."""
    low = ephemeral_low()
    draw = random.SystemRandom()
    ports: list[int] = []
    with _Reservations() as reservations:
        for _ in range(1000 * n):
            port = draw.randrange(max(1024, low - _SPAN), low)
            if port in ports:
                continue
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
            if not reservations.claim(port):
                continue
            ports.append(port)
            if len(ports) == n:
                return ports
    raise RuntimeError(f"no {n} free TCP ports on {host} below {low}")


def free_port(host: str = "127.0.0.1") -> int:
    (port,) = free_ports(1, host)
    return port
