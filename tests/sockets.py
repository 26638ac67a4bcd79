"""TCP ports for the tests: free ports to hand to the processes they start, and the sockets a
process listens on, read from /proc (Linux), for the binding tests."""

from __future__ import annotations

import ipaddress
import os
from pathlib import Path

from pdserve import ports

_LISTEN = "0A"


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports that are free now, for processes the test starts to listen on:
    pdserve's own draw (``pdserve.ports``), below the kernel's ephemeral range. A port from
    ``bind(0)`` is an ephemeral one, and between this call and the process binding it any
    outgoing connection on the machine may be given it (a chart test's decode pod lost its
    metrics port so, in a fresh CI run: "Address already in use")."""
    return ports.free_ports(n)


def free_port() -> int:
    return ports.free_port()


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
