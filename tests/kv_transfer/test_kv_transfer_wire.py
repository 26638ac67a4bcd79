"""Ticket, handshake fingerprint, framing helpers, transport choice; and a stalled TCP writer."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
from pathlib import Path

import numpy as np
import pytest
from kv_harness import SPEC, DecodeState

from engine.block_hash import hash_block_tokens
from engine.kv_cache_spec import segment_runs
from kv_transfer import KVTransferError, ReservationTicket, resolve_transport
from kv_transfer.compatibility import PROTOCOL_VERSION, compatibility_of, incompatibility
from kv_transfer.tcp import TcpReceiver, _read_frame, parse_endpoint
from kv_transfer.tcp_stream import SocketStream
from kv_transfer.wire import encode_frame
from protos.pdserve.v1 import kv_transfer_pb2 as pb


def test_segment_runs_cut_where_either_pool_is_discontiguous():
    assert segment_runs([7, 8, 9, 3, 4], [20, 21, 5, 6, 7]) == [2, 1, 2]
    assert segment_runs([1, 2, 3], [4, 5, 6]) == [3]
    assert segment_runs([], []) == []


def test_incompatibility_names_every_differing_field():
    local = compatibility_of(SPEC)
    assert incompatibility(local, compatibility_of(SPEC)) is None
    remote = compatibility_of(dataclasses.replace(SPEC, dtype="bfloat16", model_id="other"))
    message = incompatibility(local, remote)
    assert message is not None
    assert "dtype: 'float32' != 'bfloat16'" in message and "model_id" in message
    newer = compatibility_of(SPEC)
    newer.protocol_version = PROTOCOL_VERSION + 1
    assert "protocol_version" in (incompatibility(local, newer) or "")


def test_ticket_round_trips_and_skips_only_matching_cached_hashes():
    hashes = hash_block_tokens(list(range(12)), 4)
    ticket = ReservationTicket(
        request_id="r",
        endpoint="tcp://127.0.0.1:1",
        token=b"t" * 16,
        block_ids=(5, 1, 9),
        cached_blocks={0: hashes[0]},
        lease_s=2.5,
        compatibility=compatibility_of(SPEC),
    )
    again = ReservationTicket.from_proto(
        pb.KVReservation.FromString(ticket.to_proto().SerializeToString())
    )
    assert again == ticket
    assert ticket.blocks_to_send(hashes) == [1, 2]
    with pytest.raises(KVTransferError, match="decode holds block 0"):
        ticket.blocks_to_send(hash_block_tokens(list(range(1, 13)), 4))


def test_transport_choice():
    assert resolve_transport("tcp") == "tcp"
    assert resolve_transport("auto") in ("ucx", "tcp")
    with pytest.raises(ValueError, match="unknown transport"):
        resolve_transport("carrier-pigeon")
    assert parse_endpoint("tcp://127.0.0.1:5555") == ("127.0.0.1", 5555)


def test_tcp_write_stalled_at_lease_expiry_is_cut_and_never_applied_after_release(aio):
    """A sender that stops half way through a payload: the lease expires, the receiver cuts the
    connection, and only then are the blocks released (so no byte lands in reused pages)."""

    async def scenario() -> None:
        pool = np.zeros(SPEC.pool_shape(8), np.float32)
        state = DecodeState(8)
        receiver = TcpReceiver(SPEC, pool, state, default_lease_s=0.3)
        await receiver.start()
        ticket = receiver.reserve("stall", [2, 3])
        state.owned["stall"] = [2, 3]
        state.free = [0, 1, 4, 5, 6, 7]
        loop = asyncio.get_running_loop()
        sock = socket.socket()
        sock.setblocking(False)
        await loop.sock_connect(sock, parse_endpoint(receiver.endpoint))
        hello = pb.KVHello(compatibility=compatibility_of(SPEC))
        await loop.sock_sendall(sock, encode_frame(pb.KVFrame(seq=1, hello=hello)))
        assert (await _read_frame(SocketStream(sock))).hello_reply.status == pb.KV_STATUS_OK
        push = pb.KVPush(
            request_id="stall",
            token=ticket.token,
            block_indices=[0, 1],
            block_ids=[2, 3],
            payload_bytes=2 * SPEC.bytes_per_block,
            segment_blocks=[2],
        )
        await loop.sock_sendall(sock, encode_frame(pb.KVFrame(seq=2, push=push)))
        await loop.sock_sendall(sock, b"\x01" * (SPEC.bytes_per_block // 2))  # then stall
        event = state._event("stall")
        await asyncio.wait_for(event.wait(), 5.0)
        assert state.outcomes["stall"][0] == "expired"
        assert receiver.num_reservations() == 0 and len(state.free) == 8
        # The connection was cut: the rest of the payload has nowhere to go.
        with pytest.raises((ConnectionError, OSError)):
            for _ in range(64):
                await loop.sock_sendall(sock, b"\x02" * (1 << 16))
                await asyncio.sleep(0)
            await _read_frame(SocketStream(sock))
        sock.close()
        assert receiver.metrics.snapshot().failures == {"expired": 1}
        await receiver.close()

    aio.run(scenario(), timeout=30)


def test_importing_kv_transfer_loads_neither_ucxx_nor_torch():
    """UCX must be initialised after any fork, in the process that uses it; and a worker that
    passes numpy pools should not pay for torch."""
    import subprocess
    import sys

    code = (
        "import sys, kv_transfer, kv_transfer.ucx, kv_transfer.tcp\n"
        "kv_transfer.create_receiver\n"
        "assert 'ucxx' not in sys.modules, 'ucxx imported'\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
    )
    root = str(Path(__file__).resolve().parents[2])
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
