"""A worker's load at one moment, published a few times a second.

``seq`` grows by one per report of a worker process (a router ignores a report older than the
one it holds); ``timestamp`` is the registry's clock (Redis ``TIME``) when the report was stored,
so every router judges staleness against the same clock whatever host it runs on.
"""

from __future__ import annotations

from dataclasses import dataclass

STALE_AFTER_S = 1.0  # a report older than this is not trusted (the router's own counts are)


@dataclass(frozen=True)
class LoadReport:
    worker_id: str
    epoch: int
    seq: int
    timestamp: float  # registry clock, seconds
    num_blocks: int
    num_free_blocks: int
    num_running_requests: int
    num_waiting_requests: int
    num_queued_prefill_tokens: int = 0
    step_time_s: float = 0.0  # recent mean engine step time

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    def age(self, now: float) -> float:
        return max(0.0, now - self.timestamp)

    def is_stale(self, now: float, stale_after_s: float = STALE_AFTER_S) -> bool:
        return self.age(now) > stale_after_s

    def to_fields(self) -> dict[str, str]:
        return {
            "worker_id": self.worker_id,
            "epoch": str(self.epoch),
            "seq": str(self.seq),
            "num_blocks": str(self.num_blocks),
            "num_free_blocks": str(self.num_free_blocks),
            "num_running_requests": str(self.num_running_requests),
            "num_waiting_requests": str(self.num_waiting_requests),
            "num_queued_prefill_tokens": str(self.num_queued_prefill_tokens),
            "step_time_s": repr(self.step_time_s),
        }

    @classmethod
    def from_fields(cls, f: dict[str, str]) -> LoadReport:
        """Inverse of ``to_fields`` plus the ``timestamp_ms`` the registry stamped."""
        try:
            return cls(
                worker_id=f["worker_id"],
                epoch=int(f["epoch"]),
                seq=int(f["seq"]),
                timestamp=int(f["timestamp_ms"]) / 1000.0,
                num_blocks=int(f["num_blocks"]),
                num_free_blocks=int(f["num_free_blocks"]),
                num_running_requests=int(f["num_running_requests"]),
                num_waiting_requests=int(f["num_waiting_requests"]),
                num_queued_prefill_tokens=int(f.get("num_queued_prefill_tokens", 0)),
                step_time_s=float(f.get("step_time_s", 0.0)),
            )
        except KeyError as e:
            raise ValueError(f"{e.args[0]}: missing from the load report") from e
