"""Which network interface holds a host address (Linux), so UCX listens only there.

A UCX worker opens a TCP listener on every network device unless ``UCX_NET_DEVICES`` names
some; pdserve's hosts default to 127.0.0.1, so the KV transports must bind the same.
"""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct
from pathlib import Path

_SIOCGIFFLAGS = 0x8913
_SIOCGIFADDR = 0x8915
_IFF_LOOPBACK = 0x8
_IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


def _ioctl(name: str, request: int) -> bytes:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        return fcntl.ioctl(s.fileno(), request, struct.pack("256s", name.encode()[:15]))


def _is_loopback_interface(name: str) -> bool:
    try:
        (flags,) = struct.unpack_from("H", _ioctl(name, _SIOCGIFFLAGS), 16)
    except OSError:
        return False
    return bool(flags & _IFF_LOOPBACK)


def _ipv4_of(name: str) -> ipaddress.IPv4Address | None:
    try:
        return ipaddress.IPv4Address(_ioctl(name, _SIOCGIFADDR)[20:24])
    except OSError:  # no IPv4 address on it
        return None


def _ipv6_of(name: str) -> list[ipaddress.IPv6Address]:
    table = Path("/proc/net/if_inet6")
    if not table.exists():
        return []
    found = []
    for line in table.read_text().splitlines():
        fields = line.split()
        if len(fields) == 6 and fields[5] == name:
            found.append(ipaddress.IPv6Address(bytes.fromhex(fields[0])))
    return found


def interface_of(host: str) -> str | None:
    """The name of the interface that holds ``host`` (an address or a name), or None for a
    wildcard host (0.0.0.0, ::, ""), which means every interface. Raises ValueError when no
    interface of this machine has the address."""
    if host in ("", "*"):
        return None
    addresses: set[_IPAddress] = {
        ipaddress.ip_address(str(info[4][0]).split("%")[0])
        for info in socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    }
    if any(a.is_unspecified for a in addresses):
        return None
    names = [name for _, name in socket.if_nameindex()]
    for name in names:
        if any(a.is_loopback for a in addresses) and _is_loopback_interface(name):
            return name  # 127.0.0.0/8 and ::1 all live on the loopback interface
        mine: list[_IPAddress] = [*_ipv6_of(name)]
        v4 = _ipv4_of(name)
        if v4 is not None:
            mine.append(v4)
        if addresses & set(mine):
            return name
    raise ValueError(f"no network interface of this machine has the address of {host!r}")
