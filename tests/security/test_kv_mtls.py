"""The KV channel over mutual TLS (TCP), in this process: a real receiver and a real sender on
loopback. Blocks arrive byte-exact; a sender or a receiver without a release certificate is
refused at the handshake; a ticket for an endpoint outside ``--kv-allowed-peers`` is refused
before any connection; a rotated certificate is used by the next handshake."""

from __future__ import annotations

import asyncio
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from engine.kv_cache_spec import KVCacheSpec
from kv_transfer import CompletedTransfer, KVSender, ReleaseReason, create_receiver
from kv_transfer.errors import PeerLostError, PeerNotAllowedError, PeerNotTrustedError
from kv_transfer.peers import PeerPolicy
from kv_transfer.tcp import TcpConnector
from pdserve.tls import (
    RELOAD_CHECK_S,
    CertificateWatch,
    ClientTls,
    ServerTls,
    client_ssl_context,
    server_ssl_context,
)
from tests.security.certs import CertFiles, authority

SPEC = KVCacheSpec(
    num_layers=2, num_kv_heads=2, head_dim=8, block_size=4, dtype="float32", model_id="test"
)
NUM_BLOCKS = 16


@dataclass
class Owner:
    free: set[int] = field(default_factory=lambda: set(range(NUM_BLOCKS)))
    done: dict[str, str] = field(default_factory=dict)

    def take(self, n: int) -> list[int]:
        ids = sorted(self.free)[:n]
        self.free -= set(ids)
        return ids

    def on_transfer_complete(self, result: CompletedTransfer) -> None:
        self.done[result.request_id] = "complete"
        self.free |= set(result.block_ids)

    def on_reservation_released(
        self,
        request_id: str,
        block_ids: tuple[int, ...],
        reason: ReleaseReason,
        num_intact_blocks: int,
    ) -> None:
        self.done[request_id] = reason.value
        self.free |= set(block_ids)


def _pools() -> tuple[np.ndarray, np.ndarray]:
    src = np.random.default_rng(0).standard_normal(SPEC.pool_shape(NUM_BLOCKS)).astype(np.float32)
    return src, np.zeros(SPEC.pool_shape(NUM_BLOCKS), np.float32)


def _server(files: CertFiles) -> ServerTls:
    return ServerTls(files.cert, files.key, files.ca)


def _client(files: CertFiles, ca: str | None = None) -> ClientTls:
    return ClientTls(ca or files.ca, files.cert, files.key)


async def _transfer(sender: KVSender, receiver, owner: Owner, rid: str) -> None:  # type: ignore[no-untyped-def]
    ticket = receiver.reserve(rid, owner.take(3))
    transfer = await sender.open(ticket)
    await transfer.push([0, 1], [5, 6])
    await transfer.finish(42, -0.5, [2], [7])


def test_blocks_cross_mutual_tls_byte_exact_and_strangers_are_cut(tmp_path: Path) -> None:
    release, stranger = authority(tmp_path, "release"), authority(tmp_path, "stranger")
    decode, prefill = release.issue("decode"), release.issue("prefill")
    foreign, expired = stranger.issue("foreign"), release.issue("expired", expired=True)

    async def scenario() -> None:
        src, dst = _pools()
        owner = Owner()
        receiver = create_receiver(
            SPEC, dst, owner, "tcp", ssl_context=server_ssl_context(_server(decode))
        )
        await receiver.start()
        good = KVSender(SPEC, src, connectors=[TcpConnector(client_ssl_context(_client(prefill)))])
        await _transfer(good, receiver, owner, "ok")
        assert owner.done["ok"] == "complete" and len(owner.free) == NUM_BLOCKS
        np.testing.assert_array_equal(dst[[0, 1, 2]], src[[5, 6, 7]])
        await good.close()
        # Senders the receiver does not trust, and one that does not trust the receiver.
        for name, tls in (
            ("no certificate", ClientTls(release.ca_file)),
            ("another CA", _client(foreign, release.ca_file)),
            ("expired", _client(expired)),
            ("trusts another CA", _client(prefill, stranger.ca_file)),
        ):
            sender = KVSender(SPEC, src, connectors=[TcpConnector(client_ssl_context(tls))])
            with pytest.raises((PeerNotTrustedError, PeerLostError)):
                await _transfer(sender, receiver, owner, name)
            await sender.close()
            await asyncio.sleep(0.05)
        assert set(receiver.metrics.snapshot().failures) <= {"tls_handshake", "peer_lost"}
        assert receiver.metrics.snapshot().failures.get("tls_handshake", 0) >= 2
        # A plain sender gets nothing out of a TLS listener.
        plain = KVSender(SPEC, src, connectors=[TcpConnector()], timeout_s=5.0)
        with pytest.raises((PeerLostError, TimeoutError)):
            await _transfer(plain, receiver, owner, "plain")
        await plain.close()
        await asyncio.sleep(0.2)  # leases of refused reservations are released below
        for rid in ("no certificate", "another CA", "expired", "trusts another CA", "plain"):
            receiver.abort(rid)
        assert receiver.num_reservations() == 0 and len(owner.free) == NUM_BLOCKS
        await receiver.close()

    asyncio.run(asyncio.wait_for(scenario(), 60))


def test_a_ticket_outside_the_allowed_peers_is_refused_before_connecting(tmp_path: Path) -> None:
    async def scenario() -> None:
        src, dst = _pools()
        owner = Owner()
        receiver = create_receiver(SPEC, dst, owner, "tcp")
        await receiver.start()
        accepted: list[object] = []
        core_hello = receiver.core.hello

        def hello(message: Any) -> Any:
            accepted.append(message)
            return core_hello(message)

        receiver.core.hello = hello  # type: ignore[method-assign,assignment]
        elsewhere = PeerPolicy.parse(["tcp://127.0.0.1:1", "10.9.0.0/16"])
        sender = KVSender(SPEC, src, peers=elsewhere)
        ticket = receiver.reserve("r", owner.take(2))
        with pytest.raises(PeerNotAllowedError, match="not one of this prefill worker's"):
            await sender.open(ticket)
        assert accepted == []  # no connection was made
        assert sender.metrics.snapshot().failures == {"PeerNotAllowedError": 1}
        allowed = KVSender(SPEC, src, peers=PeerPolicy.parse([receiver.endpoint]))
        transfer = await allowed.open(ticket)
        await transfer.finish(1, 0.0, [0, 1], [3, 4])
        assert owner.done["r"] == "complete" and len(owner.free) == NUM_BLOCKS
        await sender.close()
        await allowed.close()
        await receiver.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_peer_policy_entries() -> None:
    policy = PeerPolicy.parse(["tcp://decode-0:7100, 10.1.2.3:7000", "decode-1", "10.8.0.0/16"])
    assert policy.allows("tcp://decode-0:7100")
    assert not policy.allows("tcp://decode-0:7101")
    assert policy.allows("tcp://10.1.2.3:7000") and not policy.allows("tcp://10.1.2.3:7001")
    assert policy.allows("tcp://decode-1:1234")
    assert policy.allows("tcp://10.8.200.1:5") and not policy.allows("tcp://10.9.0.1:5")
    assert not policy.allows("ucx://00ff") and not policy.allows("inproc://decode-1")
    assert PeerPolicy.parse(["ucx://00ff"]).allows("ucx://00ff")
    with pytest.raises(ValueError, match="no network"):
        PeerPolicy.parse(["10.0.0.0/99"])


def test_a_rotated_receiver_certificate_is_used_by_the_next_handshake(tmp_path: Path) -> None:
    """The receiver's certificate files are replaced (as Kubernetes does with a Secret); the
    watch reloads them; a sender that trusts only the new CA now connects."""
    old, new = authority(tmp_path, "old"), authority(tmp_path, "new")
    served = old.issue("decode")
    live = ServerTls(str(tmp_path / "tls.crt"), str(tmp_path / "tls.key"), old.ca_file)
    shutil.copy(served.cert, live.cert_file)
    shutil.copy(served.key, live.key_file)
    prefill = old.issue("prefill")
    trusts_new = ClientTls(new.ca_file, prefill.cert, prefill.key)

    async def scenario() -> None:
        src, dst = _pools()
        owner = Owner()
        watch = CertificateWatch()
        ctx = watch.add(server_ssl_context(live), live)
        receiver = create_receiver(SPEC, dst, owner, "tcp", ssl_context=ctx)
        await receiver.start()
        sender = KVSender(SPEC, src, connectors=[TcpConnector(client_ssl_context(trusts_new))])
        with pytest.raises(PeerNotTrustedError):
            await _transfer(sender, receiver, owner, "before")
        receiver.abort("before")
        rotated = new.issue("decode-rotated")
        shutil.copy(rotated.cert, live.cert_file)
        shutil.copy(rotated.key, live.key_file)
        await asyncio.sleep(RELOAD_CHECK_S + 0.1)
        assert watch.check() == 1
        await _transfer(sender, receiver, owner, "after")
        assert owner.done["after"] == "complete" and len(owner.free) == NUM_BLOCKS
        await sender.close()
        await receiver.close()

    asyncio.run(asyncio.wait_for(scenario(), 30))
