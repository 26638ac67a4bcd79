"""Every Redis key the control plane uses, in one place.

    {p}:epoch:{id}          INCR counter: the worker id's registration epoch (never expires)
    {p}:worker:{id}         HASH  WorkerInfo fields; PEXPIRE = the lease
    {p}:members             ZSET  worker id -> lease deadline (ms, Redis clock)
    {p}:events              STREAM membership events (join, drain, leave), capped
    {p}:load:{id}           HASH  the latest LoadReport + timestamp_ms; PEXPIRE = the lease
    {p}:kv:{id}             STREAM KV event batches of the worker, capped
    {p}:pending:{id}        ZSET  request id -> dispatch time (ms): routers' in-flight sends
    {p}:pending_blocks:{id} HASH  request id -> blocks it will need on the worker
    {p}:generation          STRING random, set once (NX): a new value means Redis lost its data

``p`` is ``pdserve:<cluster>``: several pdserve releases can share one Redis.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Keyspace:
    cluster: str = "default"

    @property
    def prefix(self) -> str:
        return f"pdserve:{self.cluster}"

    def epoch(self, worker_id: str) -> str:
        return f"{self.prefix}:epoch:{worker_id}"

    def worker(self, worker_id: str) -> str:
        return f"{self.prefix}:worker:{worker_id}"

    @property
    def members(self) -> str:
        return f"{self.prefix}:members"

    @property
    def events(self) -> str:
        return f"{self.prefix}:events"

    def load(self, worker_id: str) -> str:
        return f"{self.prefix}:load:{worker_id}"

    def kv(self, worker_id: str) -> str:
        return f"{self.prefix}:kv:{worker_id}"

    def pending(self, worker_id: str) -> str:
        return f"{self.prefix}:pending:{worker_id}"

    def pending_blocks(self, worker_id: str) -> str:
        return f"{self.prefix}:pending_blocks:{worker_id}"

    @property
    def generation(self) -> str:
        return f"{self.prefix}:generation"
