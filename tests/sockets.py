"""TCP ports for the tests: free ports to hand to the processes they start, and the sockets a
process listens on, read from /proc (Linux), for the binding tests."""

from __future__ import annotations

import ipaddress
import os
import random
import socket
from pathlib import Path

_LISTEN = "0A"


def _ephemeral_low() -> int:
    """The first port of the kernel's ephemeral range (Linux; 32768 elsewhere)."""
    path = Path("/proc/sys/net/ipv4/ip_local_port_range")
    return int(path.read_text().split()[0]) if path.exists() else 32768


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports that are free now, drawn below the ephemeral range, for a process
    the test starts to listen on. A port from ``bind(0)`` is an ephemeral one, and between this
    call and the process binding it any outgoing connection on the machine may be given it (a
    chart test's decode pod lost its metrics port so, in a fresh CI run: "Address already in
    use"); below the range only another listener can take it."""
    low = _ephemeral_low()
    draw = random.SystemRandom()
    ports: list[int] = []
    while len(ports) < n:
        port = draw.randrange(max(1024, low - 12_000), low)
        if port in ports:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        ports.append(port)
    return ports


def free_port() -> int:
    (port,) = free_ports(1)
    return port


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes


def _address(hex_address: str) -> str:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    # /proc prints the address as host-order 32-bit words.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return f"{ipaddress.ip_address(words)}:{int(port, 16)}"


def listening_addresses(pid: int) -> list[str]:
    """``host:port`` of every TCP socket ``pid`` listens on (IPv4 and IPv6)."""
    inodes = _socket_inodes(pid)
    found = []
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == _LISTEN and fields[9] in inodes:
                found.append(_address(fields[1]))
    return found


def is_loopback(address: str) -> bool:
    """For ``host:port``; an IPv4-mapped IPv6 address (gRPC's dual-stack sockets) counts as
    the IPv4 address it maps."""
    ip = ipaddress.ip_address(address.rsplit(":", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback
