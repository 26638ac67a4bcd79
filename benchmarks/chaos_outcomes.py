"""How the chaos benchmark judges one request, and the table it prints.

Every request is greedy with EOS ignored, so an uninterrupted run is known in advance: the
reference's token ids (HF ``generate``) and its text (those ids through the engine's own
incremental detokenizer). What a client saw is then exactly one of:

- completed: ``finish_reason == "length"`` and the reference's tokens (gRPC) or text (HTTP);
- failed: the server said why (a gRPC status, an HTTP error status, an SSE error event);
- hung: no answer within the benchmark's per-request deadline (``Outcome`` is ``None``);
- corrupted: the server said it finished, but the output is not the reference's;
- truncated: the answer ended with neither a finish reason nor an error (for an HTTP stream:
  also one without ``[DONE]``), i.e. silently;
- cancelled: the client gave up on purpose (a fault of the benchmark's own).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from enum import StrEnum

from tests.faults.clients import Outcome


class Verdict(StrEnum):
    COMPLETED = "completed"
    FAILED = "failed"
    HUNG = "hung"
    CORRUPTED = "corrupted"
    TRUNCATED = "truncated"
    CANCELLED = "cancelled"


API_GRPC, API_HTTP_STREAM, API_HTTP = "grpc", "http-stream", "http"


@dataclass(frozen=True)
class Reference:
    """An uninterrupted greedy run of one prompt."""

    prompt: list[int]
    max_tokens: int
    token_ids: list[int]
    text: str


def classify(out: Outcome | None, api: str, ref: Reference) -> Verdict:
    """The verdict on what one client saw (``None``: nothing within the deadline)."""
    if out is None:
        return Verdict.HUNG
    if out.cancelled:
        return Verdict.CANCELLED
    if out.error is not None:
        return Verdict.FAILED
    if out.finish_reason is None or (api == API_HTTP_STREAM and not out.done):
        return Verdict.TRUNCATED
    if out.finish_reason != "length":  # EOS is ignored: only the length ends a request
        return Verdict.CORRUPTED
    if api == API_GRPC:
        same = out.token_ids == ref.token_ids
    else:
        same = out.text == ref.text
    return Verdict.COMPLETED if same else Verdict.CORRUPTED


@dataclass
class Tally:
    """Verdicts counted, with the server's error messages grouped (first 120 characters)."""

    verdicts: Counter[Verdict] = field(default_factory=Counter)
    errors: Counter[str] = field(default_factory=Counter)

    @property
    def sent(self) -> int:
        return sum(self.verdicts.values())

    def add(self, verdict: Verdict, out: Outcome | None) -> None:
        self.verdicts[verdict] += 1
        if verdict is Verdict.FAILED and out is not None and out.error is not None:
            self.errors[out.error[:120]] += 1

    def table(self, migrated: int = 0) -> str:
        """One row of counts: the figures the issue asks for."""
        v = self.verdicts
        done_share = 100.0 * v[Verdict.COMPLETED] / self.sent if self.sent else 0.0
        header = (
            "| sent | completed | failed (clear error) | hung | corrupted "
            "| silently truncated | migrated |"
        )
        row = (
            f"| {self.sent} | {v[Verdict.COMPLETED]} ({done_share:.2f}%) | {v[Verdict.FAILED]} "
            f"| {v[Verdict.HUNG]} | {v[Verdict.CORRUPTED]} | {v[Verdict.TRUNCATED]} "
            f"| {migrated} |"
        )
        return "\n".join([header, "|---|---|---|---|---|---|---|", row])
