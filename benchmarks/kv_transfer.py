"""KV transfer bandwidth per transport, beside a raw memcpy and a raw socket copy of the same bytes.

    python benchmarks/kv_transfer.py                       # every available transport
    python benchmarks/kv_transfer.py --transports tcp --repeats 3 --max-mib 64

Rows:
* ``64 KiB`` ... ``256 MiB``: one push of that many contiguous 64 KiB blocks + the final message.
* ``smollm2 2k``: one realistic request, a 2,048-token prompt of the SmolLM2-135M shape
  (30 layers, 3 KV heads, head_dim 64, fp32, block 16: 128 blocks of 720 KiB = 90 MiB) pushed
  in 4 chunks of 512 tokens, scattered block ids on both sides (as a block manager hands out).

The decode worker (receiver) runs in a spawned process; the prefill side (sender) in this one.
A transfer's time runs from ``open`` to the decode side's answer to the final message, so it
includes the handshake check, every ack and the completion bookkeeping. GB/s = 1e9 bytes/s;
each cell is the median of the repeats. Baselines: ``memcpy`` = numpy copy between two buffers
in this process; ``socket`` = blocking ``sendall``/``recv_into`` of the same bytes over
loopback TCP to another process (same socket options as the TCP transport), timed to its 1-byte
reply. On a shared machine the figures move a lot between runs: compare columns of one run.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import platform
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine.kv_cache_spec import KVCacheSpec
from kv_transfer import (
    CompletedTransfer,
    KVSender,
    ReleaseReason,
    ReservationTicket,
    available_transports,
    create_receiver,
)
from protos.pdserve.v1 import kv_transfer_pb2 as pb

KIB = 1 << 10
MIB = 1 << 20
# One block = 64 KiB: 1 layer x K,V x 16 tokens x 8 heads x 64 dims x fp32.
BLOCK_SPEC = KVCacheSpec(1, 8, 64, 16, "float32", "bench-64k")
SMOLLM2_SPEC = KVCacheSpec(30, 3, 64, 16, "float32", "HuggingFaceTB/SmolLM2-135M")
SIZES = [64 * KIB, 1 * MIB, 16 * MIB, 64 * MIB, 256 * MIB]
PROMPT_TOKENS = 2048
CHUNK_TOKENS = 512


class _Owner:
    def __init__(self) -> None:
        self.done: dict[str, asyncio.Event] = {}

    def on_transfer_complete(self, result: CompletedTransfer) -> None:
        pass

    def on_reservation_released(
        self,
        request_id: str,
        block_ids: tuple[int, ...],
        reason: ReleaseReason,
        num_intact_blocks: int,
    ) -> None:
        print(f"decode: {request_id} released: {reason.value}", file=sys.stderr)


def _decode_main(conn: Any, transport: str, spec: KVCacheSpec, num_blocks: int) -> None:
    async def main() -> None:
        pool = np.zeros(spec.pool_shape(num_blocks), np.float32)
        receiver = create_receiver(spec, pool, _Owner(), transport, default_lease_s=120.0)
        await receiver.start()
        conn.send(receiver.endpoint)
        loop = asyncio.get_running_loop()
        while (message := await loop.run_in_executor(None, conn.recv)) is not None:
            request_id, block_ids = message
            conn.send(receiver.reserve(request_id, block_ids).to_proto().SerializeToString())
        await receiver.close()

    asyncio.run(main())


class _Decode:
    def __init__(self, transport: str, spec: KVCacheSpec, num_blocks: int) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_decode_main, args=(child, transport, spec, num_blocks))
        self.process.start()
        if not self.conn.poll(120):
            raise TimeoutError("decode worker did not start")
        self.endpoint = self.conn.recv()

    def reserve(self, request_id: str, block_ids: list[int]) -> ReservationTicket:
        self.conn.send((request_id, block_ids))
        if not self.conn.poll(60):
            raise TimeoutError("decode worker did not reserve")
        return ReservationTicket.from_proto(pb.KVReservation.FromString(self.conn.recv()))

    def close(self) -> None:
        self.conn.send(None)
        self.process.join(30)
        if self.process.is_alive():
            self.process.kill()


async def _run_transfer(
    sender: KVSender, ticket: ReservationTicket, src_ids: list[int], chunk_blocks: int
) -> float:
    n = len(ticket.block_ids)
    start = time.perf_counter()
    transfer = await sender.open(ticket)
    chunks = [list(range(k, min(n, k + chunk_blocks))) for k in range(0, n, chunk_blocks)]
    # Chunks are pushed as tasks (as a prefill worker overlaps them with compute).
    for chunk in chunks[:-1]:
        transfer.push(chunk, [src_ids[i] for i in chunk])
    last = chunks[-1]
    await transfer.finish(1, -0.5, last, [src_ids[i] for i in last])
    return time.perf_counter() - start


def _inproc_transfers(
    spec: KVCacheSpec, src: np.ndarray, plans: list[tuple[list[int], list[int], int]], repeats: int
) -> list[float]:
    async def main() -> list[float]:
        num_blocks = max(max(dst) for _, dst, _ in plans) + 1
        dst_pool = np.zeros(spec.pool_shape(num_blocks), np.float32)
        receiver = create_receiver(spec, dst_pool, _Owner(), "inproc", default_lease_s=120.0)
        await receiver.start()
        sender = KVSender(spec, src)
        times = []
        for r in range(repeats):
            for k, (src_ids, dst_ids, chunk) in enumerate(plans):
                ticket = receiver.reserve(f"r{r}-{k}", dst_ids)
                times.append(await _run_transfer(sender, ticket, src_ids, chunk))
        await sender.close()
        await receiver.close()
        return times

    return asyncio.run(main())


def _network_transfers(
    transport: str,
    spec: KVCacheSpec,
    src: np.ndarray,
    plans: list[tuple[list[int], list[int], int]],
    repeats: int,
) -> list[float]:
    num_blocks = max(max(dst) for _, dst, _ in plans) + 1
    decode = _Decode(transport, spec, num_blocks)

    async def main() -> list[float]:
        sender = KVSender(spec, src)
        times = []
        for r in range(repeats):
            for k, (src_ids, dst_ids, chunk) in enumerate(plans):
                ticket = await asyncio.to_thread(decode.reserve, f"r{r}-{k}", dst_ids)
                times.append(await _run_transfer(sender, ticket, src_ids, chunk))
        await sender.close()
        return times

    try:
        return asyncio.run(main())
    finally:
        decode.close()


def _memcpy(num_bytes: int, repeats: int) -> list[float]:
    src = np.random.default_rng(0).integers(0, 255, num_bytes, dtype=np.uint8)
    dst = np.empty_like(src)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - start)
    return times


def _tune(sock: socket.socket) -> None:
    # The same options as the TCP transport, so the baseline is a fair one.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)


def _socket_sink(port_conn: Any, num_bytes: int, repeats: int) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port_conn.send(listener.getsockname()[1])
    sock, _ = listener.accept()
    _tune(sock)
    view = memoryview(bytearray(num_bytes))
    for _ in range(repeats):
        got = 0
        while got < num_bytes:
            got += sock.recv_into(view[got:])
        sock.sendall(b"k")
    sock.close()


def _raw_socket(num_bytes: int, repeats: int) -> list[float]:
    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    process = ctx.Process(target=_socket_sink, args=(child, num_bytes, repeats))
    process.start()
    port = conn.recv()
    sock = socket.create_connection(("127.0.0.1", port))
    _tune(sock)
    data = np.random.default_rng(0).integers(0, 255, num_bytes, dtype=np.uint8)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        sock.sendall(data.data)
        sock.recv(1)
        times.append(time.perf_counter() - start)
    sock.close()
    process.join(30)
    return times


def _plans(spec: KVCacheSpec, num_blocks: int, scattered: bool, chunk_blocks: int) -> tuple:
    rng = np.random.default_rng(7)
    if scattered:
        src_ids = [int(b) for b in rng.permutation(2 * num_blocks)[:num_blocks]]
        dst_ids = [int(b) for b in rng.permutation(2 * num_blocks)[:num_blocks]]
    else:
        src_ids = list(range(num_blocks))
        dst_ids = list(range(num_blocks))
    return src_ids, dst_ids, chunk_blocks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transports", nargs="*", default=available_transports())
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-mib", type=int, default=256)
    args = parser.parse_args(argv)

    rows: list[tuple[str, int, KVCacheSpec, tuple]] = []
    for size in SIZES:
        if size <= args.max_mib * MIB:
            n = size // BLOCK_SPEC.bytes_per_block
            label = f"{size // MIB} MiB" if size >= MIB else f"{size // KIB} KiB"
            rows.append((label, size, BLOCK_SPEC, _plans(BLOCK_SPEC, n, False, n)))
    num_blocks = PROMPT_TOKENS // SMOLLM2_SPEC.block_size
    chunk = CHUNK_TOKENS // SMOLLM2_SPEC.block_size
    rows.append(
        (
            "smollm2 2k",
            num_blocks * SMOLLM2_SPEC.bytes_per_block,
            SMOLLM2_SPEC,
            _plans(SMOLLM2_SPEC, num_blocks, True, chunk),
        )
    )

    columns = ["memcpy", "socket", *args.transports]
    print(
        f"# {platform.node()} {platform.machine()} cpus={os.cpu_count()} "
        f"python={platform.python_version()} repeats={args.repeats} "
        f"load={os.getloadavg()[0]:.1f} GLIBC_TUNABLES={os.environ.get('GLIBC_TUNABLES', '')!r} "
        f"UCXPY_PROGRESS_MODE={os.environ.get('UCXPY_PROGRESS_MODE', '')!r}"
    )
    print(f"| payload | bytes | {' | '.join(c + ' GB/s' for c in columns)} |")
    print("|---|---:|" + "---:|" * len(columns))
    for label, size, spec, plan in rows:
        src_ids = plan[0]
        src = np.random.default_rng(1).standard_normal(
            spec.pool_shape(max(src_ids) + 1), dtype=np.float32
        )
        cells = []
        for column in columns:
            # One untimed warm-up (connection, handshake, UCX endpoint), then the repeats.
            if column == "memcpy":
                times = _memcpy(size, args.repeats + 1)[1:]
            elif column == "socket":
                times = _raw_socket(size, args.repeats + 1)[1:]
            elif column == "inproc":
                times = _inproc_transfers(spec, src, [plan], args.repeats + 1)[1:]
            else:
                times = _network_transfers(column, spec, src, [plan], args.repeats + 1)[1:]
            cells.append(f"{size / statistics.median(times) / 1e9:.2f}")
        print(f"| {label} | {size} | {' | '.join(cells)} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
