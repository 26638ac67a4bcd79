"""What the client measured for one request: plain data, written verbatim to the JSON report."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

OK, FAILED, CANCELLED = "ok", "failed", "cancelled"


@dataclass
class RequestRecord:
    """Times are seconds: ``start_s`` from the start of the load point, the rest from
    ``start_s``. ``itl_s`` holds the gap before each streamed chunk after the first (a chunk
    usually carries one token). Token counts come from the server's usage report; when a
    server sends none, ``num_output_tokens`` counts chunks and ``usage_reported`` is False."""

    index: int
    start_s: float
    status: str = FAILED
    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)
    num_prompt_tokens: int | None = None
    num_output_tokens: int = 0
    num_cached_tokens: int | None = None
    num_chunks: int = 0
    usage_reported: bool = False
    has_shared_prefix: bool = False
    finish_reason: str | None = None
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        """Time per output token after the first: ``(e2e - ttft) / (output tokens - 1)``."""
        if self.ttft_s is None or self.e2e_s is None or self.num_output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.num_output_tokens - 1)

    @property
    def mean_itl_s(self) -> float | None:
        return sum(self.itl_s) / len(self.itl_s) if self.itl_s else None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(d: dict[str, Any]) -> RequestRecord:
        return RequestRecord(**d)
