"""The control plane's Redis client: every read and write the workers and routers make, each
one bounded in time, returning plain data.

Any Redis failure raises ``ControlPlaneUnavailable`` (``redis_call``); callers keep serving on
what they last knew and try again.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import redis.asyncio as aioredis

from control_plane import lua
from control_plane.keys import Keyspace
from control_plane.kv_events import KVEventBatch
from control_plane.load_report import LoadReport
from control_plane.redis_call import ConnectionLost, call_once
from control_plane.worker_info import WorkerInfo, WorkerState

T = TypeVar("T")

EVENTS_MAXLEN = 10_000
KV_STREAM_MAXLEN = 20_000
MAX_BLOCK_S = 1.0  # the longest a blocking stream read waits for news


@dataclass(frozen=True)
class MembershipEvent:
    stream_id: bytes
    type: str  # "join" | "draining" | "serving" | "leave"
    worker_id: str
    epoch: int


@dataclass(frozen=True)
class MemberListing:
    """One re-list: the registry's time, every worker whose lease is live, and the dataset's
    generation (a random value set once: a new one means Redis lost its data)."""

    now: float
    members: list[WorkerInfo]
    generation: str


@dataclass(frozen=True)
class StreamedKVBatch:
    stream_id: bytes
    batch: KVEventBatch


class RedisStore:
    """One connection pool to the control plane's Redis. Use from one event loop."""

    def __init__(
        self,
        url: str,
        cluster: str = "default",
        timeout_s: float = 0.5,
    ) -> None:
        self.url = url
        self.keys = Keyspace(cluster)
        self.timeout_s = timeout_s
        self._redis: Any = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s,
            socket_connect_timeout=timeout_s,
            retry_on_timeout=False,
            health_check_interval=0,
        )
        # Blocking stream reads wait on their own connections, whose socket timeout covers
        # the block; every other call keeps the short one.
        self._blocking: Any = aioredis.Redis.from_url(
            url,
            socket_timeout=timeout_s + MAX_BLOCK_S,
            socket_connect_timeout=timeout_s,
            retry_on_timeout=False,
            health_check_interval=0,
        )
        self._register = self._redis.register_script(lua.REGISTER)
        self._heartbeat = self._redis.register_script(lua.HEARTBEAT)
        self._set_state = self._redis.register_script(lua.SET_STATE)
        self._unregister = self._redis.register_script(lua.UNREGISTER)
        self._publish_kv = self._redis.register_script(lua.PUBLISH_KV)
        self._select = self._redis.register_script(lua.SELECT_AND_RESERVE)
        self._release = self._redis.register_script(lua.RELEASE_PENDING)

    async def close(self) -> None:
        await self._redis.aclose()
        await self._blocking.aclose()

    async def _run(self, make: Callable[[], Awaitable[T]], *, repeatable: bool = False) -> T:
        """Make and await one Redis call (``call_once``: bounded by the clients' timeouts).

        A connection Redis closed while it sat in the pool (a restart, a ``CLIENT KILL``, an
        idle timeout) fails the call that takes it. Then every idle pooled connection goes (the
        others were most likely closed too), and a ``repeatable`` call (a read, or a write
        whose second run changes nothing more) is made once more, on a fresh connection; any
        other call fails once and the caller's next one goes through."""
        try:
            return await call_once(make(), self.url)
        except ConnectionLost:
            await self._drop_idle_connections()
            if not repeatable:
                raise
        return await self._run(make)  # the one repeat, itself not repeated

    async def _drop_idle_connections(self) -> None:
        for client in (self._redis, self._blocking):
            await client.connection_pool.disconnect(inuse_connections=False)

    async def now(self) -> float:
        """Redis's clock, in seconds."""
        sec, usec = await self._run(self._redis.time, repeatable=True)
        return float(sec) + float(usec) / 1e6

    # ------------------------------------------------------------------ worker side
    async def register(self, info: WorkerInfo, lease_s: float) -> tuple[int, float]:
        """Register ``info`` under a new epoch, above ``info.epoch``; returns ``(epoch,
        registry time)``."""
        fields = {k: v for k, v in info.to_fields().items() if k != "epoch"}
        k = self.keys
        epoch, now_ms = await self._run(
            lambda: self._register(
                keys=[k.epoch(info.worker_id), k.worker(info.worker_id), k.members, k.events],
                args=[
                    info.worker_id,
                    int(lease_s * 1000),
                    EVENTS_MAXLEN,
                    info.epoch,
                    *_pairs(fields),
                ],
            )
        )
        return int(epoch), now_ms / 1000.0

    async def heartbeat(
        self, worker_id: str, epoch: int, lease_s: float, load: LoadReport | None = None
    ) -> int:
        """Renew the lease (and store ``load``); returns lua.OK, lua.GONE or lua.FENCED."""
        k = self.keys
        args: list[Any] = [epoch, worker_id, int(lease_s * 1000)]
        if load is not None:
            args += _pairs(load.to_fields())
        code, _ = await self._run(
            lambda: self._heartbeat(
                keys=[k.worker(worker_id), k.members, k.load(worker_id)], args=args
            ),
            repeatable=True,  # it only renews the lease and overwrites the report
        )
        return int(code)

    async def set_state(self, worker_id: str, epoch: int, state: WorkerState) -> int:
        k = self.keys
        code, _ = await self._run(
            lambda: self._set_state(
                keys=[k.worker(worker_id), k.events],
                args=[epoch, worker_id, state.value, EVENTS_MAXLEN],
            )
        )
        return int(code)

    async def unregister(self, worker_id: str, epoch: int) -> int:
        k = self.keys
        code, _ = await self._run(
            lambda: self._unregister(
                keys=[k.worker(worker_id), k.members, k.events, k.load(worker_id)],
                args=[epoch, worker_id, EVENTS_MAXLEN],
            ),
            repeatable=True,  # a second run finds the member gone (lua.GONE)
        )
        return int(code)

    async def publish_kv(self, worker_id: str, epoch: int, batch: KVEventBatch) -> int:
        k = self.keys
        code, _ = await self._run(
            lambda: self._publish_kv(
                keys=[k.worker(worker_id), k.kv(worker_id)],
                args=[
                    epoch,
                    KV_STREAM_MAXLEN,
                    batch.first_seq,
                    batch.last_seq,
                    batch.encode_events(),
                ],
            )
        )
        return int(code)

    # ------------------------------------------------------------------ router side
    async def list_members(self) -> tuple[float, list[WorkerInfo]]:
        """``(registry time, every worker whose lease is live)``; drops expired members."""
        listing = await self.listing()
        return listing.now, listing.members

    async def listing(self) -> MemberListing:
        """``list_members`` with the dataset's generation, read in the same round trip (the
        first caller after Redis lost its data sets a new one)."""
        k = self.keys

        def first() -> Awaitable[list[Any]]:
            pipe = self._redis.pipeline(transaction=False)
            pipe.time()
            pipe.zrangebyscore(k.members, "-inf", "+inf", withscores=True)
            pipe.set(k.generation, secrets.token_hex(8), nx=True)  # only where none is
            pipe.get(k.generation)
            return pipe.execute()  # type: ignore[no-any-return]

        (sec, usec), members, _, generation = await self._run(first, repeatable=True)
        now = float(sec) + float(usec) / 1e6
        live = [(m.decode(), score / 1000.0) for m, score in members if score / 1000.0 > now]
        expired = [m for m, score in members if score / 1000.0 <= now]

        def second() -> Awaitable[list[Any]]:
            pipe = self._redis.pipeline(transaction=False)
            for worker_id, _ in live:
                pipe.hgetall(k.worker(worker_id))
            if expired:
                pipe.zrem(k.members, *expired)
            return pipe.execute()  # type: ignore[no-any-return]

        records = await self._run(second, repeatable=True) if live or expired else []
        infos: list[WorkerInfo] = []
        for (_, deadline), record in zip(live, records, strict=False):
            if not record:
                continue  # the hash expired between the two reads
            fields = {a.decode(): b.decode() for a, b in record.items()}
            try:
                infos.append(WorkerInfo.from_fields(fields, lease_deadline=deadline))
            except ValueError:
                continue  # a record another version wrote; ignore rather than crash
        return MemberListing(now, infos, generation.decode())

    async def read_events(
        self, last_id: bytes, block_s: float, count: int = 1000
    ) -> list[MembershipEvent]:
        """Membership events after ``last_id`` (``b"$"``: only new ones), waiting up to
        ``block_s`` for the first."""
        block_s = min(block_s, MAX_BLOCK_S)
        block_ms = max(1, int(block_s * 1000))
        reply = await self._run(
            lambda: self._blocking.xread({self.keys.events: last_id}, count=count, block=block_ms),
            repeatable=True,
        )
        out: list[MembershipEvent] = []
        for _, entries in reply or []:
            for stream_id, f in entries:
                out.append(
                    MembershipEvent(
                        stream_id=stream_id,
                        type=f[b"type"].decode(),
                        worker_id=f[b"worker_id"].decode(),
                        epoch=int(f[b"epoch"]),
                    )
                )
        return out

    async def last_event_id(self) -> bytes:
        """The id of the newest membership event (b"0-0" when none): read after this."""
        info = await self._run(
            lambda: self._redis.xrevrange(self.keys.events, count=1), repeatable=True
        )
        return info[0][0] if info else b"0-0"

    async def read_loads(self, worker_ids: Sequence[str]) -> tuple[float, dict[str, LoadReport]]:
        """``(registry time, latest load report of each worker that has one)``."""

        def reads() -> Awaitable[list[Any]]:
            pipe = self._redis.pipeline(transaction=False)
            pipe.time()
            for w in worker_ids:
                pipe.hgetall(self.keys.load(w))
            return pipe.execute()  # type: ignore[no-any-return]

        replies = await self._run(reads, repeatable=True)
        sec, usec = replies[0]
        now = float(sec) + float(usec) / 1e6
        loads: dict[str, LoadReport] = {}
        for w, record in zip(worker_ids, replies[1:], strict=True):
            if record:
                try:
                    loads[w] = LoadReport.from_fields(
                        {a.decode(): b.decode() for a, b in record.items()}
                    )
                except ValueError:
                    continue
        return now, loads

    async def read_kv(
        self, positions: dict[str, bytes], block_s: float, count: int = 1000
    ) -> list[tuple[str, StreamedKVBatch]]:
        """KV batches after each worker's stream position (``b"0-0"``: from the start)."""
        if not positions:
            await asyncio.sleep(block_s)
            return []
        streams = {self.keys.kv(w): pos for w, pos in positions.items()}
        block_s = min(block_s, MAX_BLOCK_S)
        reply = await self._run(
            lambda: self._blocking.xread(streams, count=count, block=max(1, int(block_s * 1000))),
            repeatable=True,
        )
        by_key = {self.keys.kv(w): w for w in positions}
        out: list[tuple[str, StreamedKVBatch]] = []
        for key, entries in reply or []:
            worker_id = by_key[key.decode() if isinstance(key, bytes) else key]
            for stream_id, f in entries:
                events = KVEventBatch.decode_events(f[b"events"])
                batch = KVEventBatch(worker_id, int(f[b"gen"]), int(f[b"first"]), events)
                out.append((worker_id, StreamedKVBatch(stream_id, batch)))
        return out

    async def kv_stream_end(self, worker_id: str) -> bytes:
        """The id of the newest entry of the worker's KV stream (b"0-0" when empty)."""
        last = await self._run(
            lambda: self._redis.xrevrange(self.keys.kv(worker_id), count=1), repeatable=True
        )
        return last[0][0] if last else b"0-0"

    async def select_and_reserve(
        self,
        request_id: str,
        num_blocks: int,
        candidates: Sequence[tuple[str, float]],
        ttl_s: float,
        pending_weight: float,
        visible_after_s: float = 0.5,
    ) -> tuple[str | None, dict[str, int]]:
        """Pick the cheapest candidate ``(worker id, cost)`` that still has room for
        ``num_blocks`` once every router's sends it may not have seen yet are counted (sent
        after its last report, or less than ``visible_after_s`` before it), and record this
        send there. Returns ``(chosen or None, pending blocks per candidate)``."""
        k = self.keys
        keys: list[str] = []
        for w, _ in candidates:
            keys += [k.load(w), k.pending(w), k.pending_blocks(w)]
        args: list[Any] = [
            request_id,
            num_blocks,
            int(ttl_s * 1000),
            pending_weight,
            int(visible_after_s * 1000),
        ]
        args += [repr(float(c)) for _, c in candidates]
        reply = await self._run(lambda: self._select(keys=keys, args=args))
        index = int(reply[0])
        pending = {w: int(p) for (w, _), p in zip(candidates, reply[1:], strict=True)}
        return (candidates[index - 1][0] if index > 0 else None), pending

    async def release_pending(self, worker_id: str, request_id: str) -> None:
        k = self.keys
        await self._run(
            lambda: self._release(
                keys=[k.pending(worker_id), k.pending_blocks(worker_id)], args=[request_id]
            ),
            repeatable=True,  # removing a send twice removes it once
        )


def _pairs(fields: dict[str, str]) -> list[str]:
    out: list[str] = []
    for key, value in fields.items():
        out += [key, value]
    return out
