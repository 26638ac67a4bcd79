"""What a worker is: identity, role, addresses, model fingerprint, capacity, state.

Stored in Redis as a flat hash of strings (``to_fields`` / ``from_fields``), so an operator can
read it with ``redis-cli HGETALL``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, replace
from typing import Literal

WorkerRole = Literal["prefill", "decode"]
ROLES: tuple[WorkerRole, ...] = ("prefill", "decode")


class WorkerState(enum.Enum):
    SERVING = "serving"
    DRAINING = "draining"  # finishing in-flight work; routers send it nothing new


@dataclass(frozen=True)
class ModelFingerprint:
    """What must match for two workers to exchange KV and share a prefix index."""

    model: str  # the served model name
    architecture: str
    dtype: str
    block_size: int
    num_layers: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0

    def mismatch(self, other: ModelFingerprint) -> str | None:
        """A sentence naming the first field that differs, or None when compatible."""
        for name in (
            "model",
            "architecture",
            "dtype",
            "block_size",
            "num_layers",
            "num_kv_heads",
            "head_dim",
        ):
            mine, theirs = getattr(self, name), getattr(other, name)
            if mine != theirs:
                return f"{name} differs: {mine!r} here, {theirs!r} there"
        return None


@dataclass(frozen=True)
class WorkerInfo:
    worker_id: str
    role: WorkerRole
    grpc_address: str  # host:port of its PrefillWorker / DecodeWorker service
    fingerprint: ModelFingerprint
    num_blocks: int  # KV capacity
    epoch: int = 0  # set by the registry at registration
    kv_endpoint: str = ""  # decode: where prefill workers push KV
    transport: str = ""  # decode: the KV transport of kv_endpoint
    state: WorkerState = WorkerState.SERVING
    lease_deadline: float = field(default=0.0, compare=False)  # registry clock, s; 0 = none

    def with_state(self, state: WorkerState) -> WorkerInfo:
        return replace(self, state=state)

    def to_fields(self) -> dict[str, str]:
        fp = self.fingerprint
        return {
            "worker_id": self.worker_id,
            "role": self.role,
            "grpc_address": self.grpc_address,
            "num_blocks": str(self.num_blocks),
            "epoch": str(self.epoch),
            "kv_endpoint": self.kv_endpoint,
            "transport": self.transport,
            "state": self.state.value,
            "model": fp.model,
            "architecture": fp.architecture,
            "dtype": fp.dtype,
            "block_size": str(fp.block_size),
            "num_layers": str(fp.num_layers),
            "num_kv_heads": str(fp.num_kv_heads),
            "head_dim": str(fp.head_dim),
        }

    @classmethod
    def from_fields(cls, f: dict[str, str], lease_deadline: float = 0.0) -> WorkerInfo:
        """Inverse of ``to_fields``; raises ValueError (naming the field) for a bad record."""
        try:
            role = f["role"]
            if role not in ROLES:
                raise ValueError(f"role: unknown role {role!r}")
            return cls(
                worker_id=f["worker_id"],
                role=role,  # type: ignore[arg-type]
                grpc_address=f["grpc_address"],
                num_blocks=int(f["num_blocks"]),
                epoch=int(f["epoch"]),
                kv_endpoint=f.get("kv_endpoint", ""),
                transport=f.get("transport", ""),
                state=WorkerState(f.get("state", "serving")),
                fingerprint=ModelFingerprint(
                    model=f["model"],
                    architecture=f["architecture"],
                    dtype=f["dtype"],
                    block_size=int(f["block_size"]),
                    num_layers=int(f.get("num_layers", 0)),
                    num_kv_heads=int(f.get("num_kv_heads", 0)),
                    head_dim=int(f.get("head_dim", 0)),
                ),
                lease_deadline=lease_deadline,
            )
        except KeyError as e:
            raise ValueError(f"{e.args[0]}: missing from the worker record") from e
