"""Router request metrics for scripted request timelines: TTFT, ITL, TPOT, finish and reject
reasons, SLO violations and goodput."""

from __future__ import annotations

import asyncio
import time

import pytest

from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from router.backend import GenerateRequest
from router.errors import ErrorKind, RequestError
from router.metrics import RouterMetrics

L = {"role": "router", "model": "m"}


def out(tokens: list[int], new: list[int], reason: str | None = None) -> RequestOutput:
    return RequestOutput(
        request_id="r",
        prompt_token_ids=[1, 2, 3],
        token_ids=tokens,
        text="",
        new_token_ids=new,
        new_text="",
        finished=reason is not None,
        finish_reason=reason,
    )


def request(arrival: float) -> GenerateRequest:
    return GenerateRequest("r", SamplingParams(), prompt_token_ids=[1, 2, 3], arrival_time=arrival)


def value(m: RouterMetrics, name: str, **labels: str) -> float:
    v = m.registry.get_sample_value(name, {**L, **labels})
    assert v is not None, f"{name}{labels} not exported"
    return v


def test_timeline_goodput_and_violations(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    m = RouterMetrics("router", "m", slo_ttft_s=0.5, slo_itl_s=0.1)

    # Fast: dispatched 10 ms after arrival, first token at 0.3 s, then every 50 ms.
    rec = m.record(request(arrival=99.99))
    for i, t in enumerate((100.3, 100.35, 100.4)):
        clock[0] = t
        rec.output(out(list(range(i + 1)), [i], "length" if i == 2 else None))
    rec.close()
    assert value(m, "pdserve_request_ttft_stage_seconds_count", stage="router_queue") == 1
    assert value(m, "pdserve_request_ttft_seconds_sum") == pytest.approx(0.31)
    assert value(m, "pdserve_request_inter_token_latency_seconds_count") == 2
    assert value(m, "pdserve_request_time_per_output_token_seconds_sum") == pytest.approx(0.05)
    assert value(m, "pdserve_request_e2e_seconds_sum") == pytest.approx(0.41)
    assert value(m, "pdserve_request_finished_total", reason="length") == 1
    assert value(m, "pdserve_goodput_requests_total") == 1
    assert value(m, "pdserve_goodput_tokens_total") == 3
    assert value(m, "pdserve_request_prompt_tokens_total") == 3
    assert value(m, "pdserve_request_generation_tokens_total") == 3

    # Slow first token (1 s > 0.5 s), then 0.2 s per token (> 0.1 s): misses both SLOs.
    clock[0] = 200.0
    rec = m.record(request(arrival=200.0))
    for i, t in enumerate((201.0, 201.2, 201.4)):
        clock[0] = t
        rec.output(out(list(range(i + 1)), [i], "stop" if i == 2 else None))
    rec.close()
    assert value(m, "pdserve_request_slo_violations_total", slo="ttft") == 1
    assert value(m, "pdserve_request_slo_violations_total", slo="itl") == 1
    assert value(m, "pdserve_request_finished_total", reason="stop") == 1
    assert value(m, "pdserve_goodput_requests_total") == 1  # unchanged
    assert value(m, "pdserve_request_ttft_seconds_count") == 2


def test_end_reasons() -> None:
    m = RouterMetrics("router", "m")
    now = time.monotonic()
    cases: list[tuple[BaseException | None, str]] = [
        (RequestError(ErrorKind.TIMEOUT, "late"), "timeout"),
        (RequestError(ErrorKind.INTERNAL, "boom"), "error"),
        (RequestError(ErrorKind.UNAVAILABLE, "worker gone"), "error"),
        (asyncio.CancelledError(), "abort"),
        (GeneratorExit(), "abort"),
        (None, "abort"),  # the consumer stopped reading
    ]
    for error, _ in cases:
        rec = m.record(request(now))
        rec.output(out([7], [7]))
        if error is not None:
            rec.fail(error)
        rec.close()
        rec.close()  # idempotent
    assert value(m, "pdserve_request_finished_total", reason="timeout") == 1
    assert value(m, "pdserve_request_finished_total", reason="error") == 2
    assert value(m, "pdserve_request_finished_total", reason="abort") == 3
    assert value(m, "pdserve_goodput_requests_total") == 0

    # Refused before any token: counted as rejected, not finished.
    rec = m.record(request(now))
    rec.fail(RequestError(ErrorKind.BUSY, "no KV room"))
    rec.close()
    m.rejected(RequestError(ErrorKind.INVALID, "bad"))
    m.rejected(RequestError(ErrorKind.NOT_FOUND, "no such model"))
    m.rejected(RequestError(ErrorKind.TIMEOUT, "not a refusal"))
    assert value(m, "pdserve_request_rejected_total", reason="busy") == 1
    assert value(m, "pdserve_request_rejected_total", reason="invalid") == 1
    assert value(m, "pdserve_request_rejected_total", reason="not_found") == 1
    assert value(m, "pdserve_request_finished_total", reason="abort") == 3
