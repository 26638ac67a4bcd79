"""Choosing a transport: configuration names one, ``"auto"`` takes UCX when ucxx is installed.

receiver = create_receiver(spec, kv_pool, owner, transport="auto")   # decode worker
sender = KVSender(spec, kv_pool)        # prefill worker: speaks every available scheme
"""

from __future__ import annotations

import importlib.util
import ssl
from typing import Any

from engine.kv_cache_spec import KVCacheSpec
from kv_transfer.metrics import TransferMetrics
from kv_transfer.receiver import DEFAULT_LEASE_S, ReceiverBase
from kv_transfer.reservations import ReservationOwner
from kv_transfer.transport import Connector

TRANSPORTS = ("ucx", "tcp", "inproc")


def is_ucx_available() -> bool:
    """True when the optional ``pdserve[ucx]`` extra (ucxx) is installed. Does not import it:
    UCX must be initialised only after any fork."""
    return importlib.util.find_spec("ucxx") is not None


def available_transports() -> list[str]:
    return [t for t in TRANSPORTS if t != "ucx" or is_ucx_available()]


def resolve_transport(transport: str = "auto") -> str:
    """``"auto"`` -> ``"ucx"`` if installed else ``"tcp"``; any other name is checked."""
    if transport == "auto":
        return "ucx" if is_ucx_available() else "tcp"
    if transport not in TRANSPORTS:
        raise ValueError(f"unknown transport {transport!r}; choose from {TRANSPORTS} or 'auto'")
    if transport == "ucx" and not is_ucx_available():
        raise ValueError("transport 'ucx' needs ucxx: pip install 'pdserve[ucx]'")
    return transport


def create_receiver(
    spec: KVCacheSpec,
    pool: Any,
    owner: ReservationOwner,
    transport: str = "auto",
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    name: str | None = None,
    metrics: TransferMetrics | None = None,
    default_lease_s: float = DEFAULT_LEASE_S,
    ssl_context: ssl.SSLContext | None = None,
) -> ReceiverBase:
    """The decode worker's receiver for ``transport``; call ``await receiver.start()`` on the
    event loop that will serve it. ``host``: the interface it listens on (TCP and UCX);
    ``port`` applies to TCP, ``name`` to in-process. ``ssl_context`` (TCP only: mutual TLS
    on every KV connection) makes any other transport an error: UCX and in-process
    connections carry no certificate."""
    kind = resolve_transport(transport)
    if ssl_context is not None and kind != "tcp":
        raise ValueError(f"KV transport {kind!r} cannot authenticate its peers; with TLS use tcp")
    common: dict[str, Any] = {"metrics": metrics, "default_lease_s": default_lease_s}
    if kind == "tcp":
        from kv_transfer.tcp import TcpReceiver

        return TcpReceiver(
            spec, pool, owner, host=host, port=port, ssl_context=ssl_context, **common
        )
    if kind == "inproc":
        from kv_transfer.inproc import InprocReceiver

        return InprocReceiver(spec, pool, owner, name=name, **common)
    from kv_transfer.ucx import UcxReceiver

    return UcxReceiver(spec, pool, owner, host=host, **common)


def default_connectors(host: str = "127.0.0.1") -> list[Connector]:
    """A connector for every available scheme (UCX is initialised lazily, on first connect;
    its listener, which receivers connect back to, is kept on ``host``'s interface)."""
    from kv_transfer.inproc import InprocConnector
    from kv_transfer.tcp import TcpConnector

    connectors: list[Connector] = [TcpConnector(), InprocConnector()]
    if is_ucx_available():
        from kv_transfer.ucx import UcxConnector

        connectors.append(UcxConnector(host))
    return connectors


async def release_transports() -> None:
    """Stop the process-wide machinery of the transports (UCX's notifier thread, without
    which the process cannot exit). Call once at exit, after closing every receiver and
    sender; a no-op for transports never used."""
    if is_ucx_available():
        import sys

        ucx = sys.modules.get("kv_transfer.ucx")
        if ucx is not None:
            await ucx.release()
