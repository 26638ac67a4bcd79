"""Free TCP ports for the servers pdserve starts itself (a local redis-server, the workers of
``pdserve serve`` when no port is given).

A port from ``bind(0)`` is an ephemeral one: between the call and the child binding it, any
outgoing connection on the machine may be handed the same port, and the child fails with
"Address already in use". These ports are drawn below the kernel's ephemeral range instead,
where only another listener can take one, and each is checked with a bind first.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_SPAN = 12_000  # how far below the ephemeral range the ports are drawn


def ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768 elsewhere)."""
    try:
        return int(_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports that ``host`` can bind now, below the ephemeral range."""
    low = ephemeral_low()
    draw = random.SystemRandom()
    ports: list[int] = []
    for _ in range(1000 * n):
        port = draw.randrange(max(1024, low - _SPAN), low)
        if port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        ports.append(port)
        if len(ports) == n:
            return ports
    raise RuntimeError(f"no {n} free TCP ports on {host} below {low}")


def free_port(host: str = "127.0.0.1") -> int:
    (port,) = free_ports(1, host)
    return port
