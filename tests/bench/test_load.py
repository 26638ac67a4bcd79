"""Closed and open loops over a scripted client: every request sent once, concurrency honoured,
the duration cap, and the runner's warm-up and sweep stop."""

from __future__ import annotations

import asyncio
import math

import pytest

from pdserve.bench.config import BenchConfig
from pdserve.bench.load import CLOSED, OPEN, LoadPoint, run_point
from pdserve.bench.records import OK, RequestRecord
from pdserve.bench.workload import BenchRequest


class FakeClient:
    """Answers each request after ``delay_s`` with scripted timings; counts requests in flight.
    ``slow_from`` (number of sends) makes every later request miss a 100 ms TTFT target."""

    def __init__(self, delay_s: float = 0.0, slow_from: int | None = None) -> None:
        self.delay_s = delay_s
        self.slow_from = slow_from
        self.in_flight = 0
        self.max_in_flight = 0
        self.sent: list[int] = []

    async def model_name(self) -> str:
        return "fake"

    async def send(self, request: BenchRequest, t0: float) -> RequestRecord:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.sent.append(request.index)
        try:
            await asyncio.sleep(self.delay_s)
        finally:
            self.in_flight -= 1
        slow = self.slow_from is not None and len(self.sent) > self.slow_from
        return RequestRecord(
            index=request.index,
            start_s=0.0,
            status=OK,
            ttft_s=1.0 if slow else 0.01,
            e2e_s=1.0 if slow else 0.02,
            itl_s=[0.01],
            num_prompt_tokens=len(request.prompt_token_ids or ()),
            num_output_tokens=request.max_tokens,
        )

    async def aclose(self) -> None:
        pass


def reqs(n: int) -> list[BenchRequest]:
    return [BenchRequest(i, (1, 2, 3), None, 2) for i in range(n)]


@pytest.mark.parametrize("concurrency", [1, 3, 50])
def test_closed_loop_sends_each_request_once_at_most_n_in_flight(concurrency: int) -> None:
    client = FakeClient(delay_s=0.005)
    result = asyncio.run(run_point(client, reqs(20), LoadPoint(CLOSED, concurrency)))
    assert sorted(client.sent) == list(range(20))
    assert [r.index for r in result.records] == list(range(20))
    assert client.max_in_flight == min(concurrency, 20)


def test_open_loop_sends_in_arrival_order() -> None:
    client = FakeClient()
    result = asyncio.run(run_point(client, reqs(30), LoadPoint(OPEN, 2000.0), seed=1))
    assert client.sent == list(range(30)) and len(result.records) == 30


def test_open_loop_max_concurrency() -> None:
    client = FakeClient(delay_s=0.01)
    load = LoadPoint(OPEN, math.inf, max_concurrency=4)
    asyncio.run(run_point(client, reqs(16), load))
    assert client.max_in_flight == 4 and len(client.sent) == 16


def test_duration_cap_stops_sending_but_finishes_in_flight() -> None:
    client = FakeClient(delay_s=0.05)
    result = asyncio.run(run_point(client, reqs(1000), LoadPoint(CLOSED, 2), duration_s=0.0))
    assert len(result.records) == 0
    result = asyncio.run(run_point(client, reqs(1000), LoadPoint(OPEN, 0.001), duration_s=0.01))
    assert result.records == []  # the first arrival (mean 1000 s away) is past the cap


def test_load_point_validation_and_labels() -> None:
    for kind, value in (("closed", 0), ("closed", 1.5), ("open", 0), ("poisson", 1)):
        with pytest.raises(ValueError):
            LoadPoint(kind, value)
    assert LoadPoint(CLOSED, 4).label == "concurrency 4"
    assert (
        LoadPoint(OPEN, 2.5).label == "rate 2.5/s" and LoadPoint(OPEN, math.inf).label == "rate inf"
    )


def test_runner_warms_up_and_stops_the_sweep_at_the_first_missed_slo(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pdserve.bench import runner

    client = FakeClient(slow_from=2 + 2 * 8)  # warm-up and two points fast, then slow
    monkeypatch.setattr(runner, "make_client", lambda _target: client)
    config = BenchConfig.from_dict(
        {
            "workload": {"num_requests": 8, "prompt_len": "fixed:4", "output_len": "fixed:3"},
            "load": {"kind": "closed", "concurrency": [1, 2, 4, 8], "warmup_requests": 2},
            "slo": {"targets": "ttft=100ms"},
        }
    )
    result = asyncio.run(runner.run_bench(config))
    assert len(client.sent) == 2 + 3 * 8  # the 4th point never ran
    assert [p.is_slo_held for p in result.points] == [True, True, False]
    assert result.capacity == LoadPoint(CLOSED, 2)
    assert all(len(p.result.records) == 8 for p in result.points)
    assert result.points[0].summary.total_output_tokens == 24
