"""The chaos benchmark's verdict on one client's outcome, and the table it prints."""

from __future__ import annotations

import pytest

from benchmarks.chaos_outcomes import (
    API_GRPC,
    API_HTTP,
    API_HTTP_STREAM,
    Reference,
    Tally,
    Verdict,
    classify,
)
from tests.faults.clients import Outcome

REF = Reference(prompt=[5, 6, 7], max_tokens=3, token_ids=[10, 11, 12], text=" a b c")


@pytest.mark.parametrize(
    ("api", "out", "verdict"),
    [
        (API_GRPC, None, Verdict.HUNG),
        (API_GRPC, Outcome(token_ids=[10, 11, 12], finish_reason="length"), Verdict.COMPLETED),
        (API_GRPC, Outcome(token_ids=[10, 11, 13], finish_reason="length"), Verdict.CORRUPTED),
        (API_GRPC, Outcome(token_ids=[10, 11], finish_reason="length"), Verdict.CORRUPTED),
        (API_GRPC, Outcome(token_ids=[10, 11, 12], finish_reason="stop"), Verdict.CORRUPTED),
        (API_GRPC, Outcome(token_ids=[10]), Verdict.TRUNCATED),
        (API_GRPC, Outcome(token_ids=[10], error="UNAVAILABLE: stalled"), Verdict.FAILED),
        (API_GRPC, Outcome(token_ids=[10], cancelled=True), Verdict.CANCELLED),
        (API_HTTP_STREAM, Outcome(text=" a b c", finish_reason="length", done=True),
         Verdict.COMPLETED),
        # Every token and a finish reason, but the stream closed before [DONE].
        (API_HTTP_STREAM, Outcome(text=" a b c", finish_reason="length"), Verdict.TRUNCATED),
        (API_HTTP_STREAM, Outcome(text=" a", done=True), Verdict.TRUNCATED),
        (API_HTTP_STREAM, Outcome(text=" a", error="service_unavailable: x", done=True),
         Verdict.FAILED),
        (API_HTTP, Outcome(text=" a b c", finish_reason="length", status=200), Verdict.COMPLETED),
        (API_HTTP, Outcome(text=" a b", finish_reason="length", status=200), Verdict.CORRUPTED),
        (API_HTTP, Outcome(status=503, error='{"error": {}}'), Verdict.FAILED),
    ],
)  # fmt: skip
def test_classify(api: str, out: Outcome | None, verdict: Verdict) -> None:
    assert classify(out, api, REF) is verdict


def test_tally_counts_and_groups_errors() -> None:
    tally = Tally()
    for verdict, out in [
        (Verdict.COMPLETED, Outcome()),
        (Verdict.COMPLETED, Outcome()),
        (Verdict.FAILED, Outcome(error="UNAVAILABLE: worker died")),
        (Verdict.FAILED, Outcome(error="UNAVAILABLE: worker died")),
        (Verdict.HUNG, None),
    ]:
        tally.add(verdict, out)
    assert tally.sent == 5
    assert tally.errors == {"UNAVAILABLE: worker died": 2}
    row = tally.table(migrated=0).splitlines()[-1]
    assert row == "| 5 | 2 (40.00%) | 2 | 1 | 0 | 0 | 0 |"
