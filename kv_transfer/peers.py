"""Which decode endpoints a prefill worker pushes KV to (``--kv-allowed-peers``).

A ticket names the endpoint the prefill worker connects to and writes the prompt's KV into;
whoever hands it a ticket picks that endpoint. ``PeerPolicy`` limits it to the release's
decode workers. Entries, any mix:

    tcp://10.0.3.7:7100   one endpoint exactly (any scheme, e.g. a ucx:// address too)
    10.0.3.7:7100         host and port of a tcp:// endpoint
    10.0.3.7, decode-0    a host, any port
    10.0.0.0/16           a network (IPv4 or IPv6), any port

Host names are compared as written (no DNS lookup at check time: the ticket's host must be
the name or address listed).

With a control plane (Redis), ``RegisteredPeers`` admits the KV endpoints of the cluster's
registered decode workers too, listed as they come and go: a worker that is not part of the
cluster cannot be named in a ticket even with no ``--kv-allowed-peers``.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from kv_transfer.errors import PeerNotAllowedError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
logger = logging.getLogger(__name__)


class PeerGate(Protocol):
    """What a ``KVSender`` asks before it connects to a ticket's endpoint."""

    async def admits(self, endpoint: str) -> bool: ...

    def refusal(self, endpoint: str) -> PeerNotAllowedError: ...


def _host_port(endpoint: str) -> tuple[str, int | None] | None:
    """``tcp://host:port`` -> ``(host, port)``; None for other schemes (a ucx:// endpoint is a
    worker address, an inproc:// one a name in this process: only exact entries match)."""
    scheme, sep, rest = endpoint.partition("://")
    if not sep or scheme != "tcp":
        return None
    host, sep, port = rest.rpartition(":")
    if not sep or not port.isdigit():
        return rest.strip("[]").lower(), None
    return host.strip("[]").lower(), int(port)


@dataclass(frozen=True)
class PeerPolicy:
    endpoints: frozenset[str]
    host_ports: frozenset[tuple[str, int]]
    hosts: frozenset[str]
    networks: tuple[Network, ...]

    @classmethod
    def parse(cls, entries: Iterable[str]) -> PeerPolicy:
        """Raises ``ValueError`` naming a malformed entry."""
        endpoints: set[str] = set()
        host_ports: set[tuple[str, int]] = set()
        hosts: set[str] = set()
        networks: list[Network] = []
        for raw in entries:
            for entry in (e.strip() for e in raw.split(",")):
                if not entry:
                    continue
                if "://" in entry:
                    endpoints.add(entry)
                elif "/" in entry:
                    try:
                        networks.append(ipaddress.ip_network(entry, strict=False))
                    except ValueError:
                        raise ValueError(f"--kv-allowed-peers: {entry!r} is no network") from None
                else:
                    parsed = _host_port(f"tcp://{entry}")
                    assert parsed is not None
                    host, port = parsed
                    if not host:
                        raise ValueError(f"--kv-allowed-peers: {entry!r} names no host")
                    if port is None:
                        hosts.add(host)
                    else:
                        host_ports.add((host, port))
        return cls(frozenset(endpoints), frozenset(host_ports), frozenset(hosts), tuple(networks))

    def allows(self, endpoint: str) -> bool:
        if endpoint in self.endpoints:
            return True
        parsed = _host_port(endpoint)
        if parsed is None:
            return False
        host, port = parsed
        if host in self.hosts or (port is not None and (host, port) in self.host_ports):
            return True
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return False
        return any(address in net for net in self.networks)

    def check(self, endpoint: str) -> None:
        if not self.allows(endpoint):
            raise self.refusal(endpoint)

    async def admits(self, endpoint: str) -> bool:
        return self.allows(endpoint)

    def refusal(self, endpoint: str) -> PeerNotAllowedError:
        return PeerNotAllowedError(
            f"the ticket's KV endpoint {endpoint[:80]!r} is not one of this prefill "
            "worker's decode workers (--kv-allowed-peers); refusing to connect"
        )


class RegisteredPeers:
    """Admits ``static``'s endpoints and those ``list_endpoints()`` returns: the KV endpoints
    of the registered decode workers. The list is re-read when older than ``max_age_s`` and
    on an endpoint it does not hold (a decode worker that just registered); callers that
    arrive while a read is under way wait for that one (one read at a time). While the
    registry cannot be read, the last list stands."""

    def __init__(
        self,
        list_endpoints: Callable[[], Awaitable[frozenset[str]]],
        static: PeerPolicy | None = None,
        max_age_s: float = 2.0,
    ) -> None:
        self._list = list_endpoints
        self._static = static
        self._max_age_s = max_age_s
        self._known: frozenset[str] = frozenset()
        self._read_at = -float("inf")  # monotonic: when the last read began
        self._reading: asyncio.Future[bool] | None = None

    async def admits(self, endpoint: str) -> bool:
        if self._static is not None and self._static.allows(endpoint):
            return True
        arrived = time.monotonic()
        if arrived - self._read_at <= self._max_age_s and endpoint in self._known:
            return True
        # Decide on a read that began after this call: one under way since before it may
        # predate the registration of the worker the ticket names.
        while self._read_at < arrived:
            if not await self._refreshed():
                break  # the registry is unreachable: the last list stands
        return endpoint in self._known

    async def _refreshed(self) -> bool:
        if self._reading is None:
            self._reading = asyncio.ensure_future(self._refresh())
        reading = self._reading
        try:
            return await asyncio.shield(reading)
        finally:
            if reading.done() and self._reading is reading:
                self._reading = None

    async def _refresh(self) -> bool:
        started = time.monotonic()
        try:
            self._known = await self._list()
        except Exception as e:  # the registry is unreachable: keep the last list
            logger.warning("cannot list the registered decode workers (%s): keeping the last", e)
            return False
        self._read_at = started
        return True

    def refusal(self, endpoint: str) -> PeerNotAllowedError:
        also = " or --kv-allowed-peers" if self._static is not None else ""
        return PeerNotAllowedError(
            f"the ticket's KV endpoint {endpoint[:80]!r} is not a registered decode worker's"
            f"{also}; refusing to connect"
        )
