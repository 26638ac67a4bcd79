"""One benchmark run: warm-up, then each load point in turn until the SLO breaks."""

from __future__ import annotations

import asyncio
import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from pdserve.bench.bursts import run_bursts
from pdserve.bench.client import BenchClient
from pdserve.bench.config import BenchConfig, TargetConfig
from pdserve.bench.load import CLOSED, LoadPoint, PointResult, run_point
from pdserve.bench.metrics import Slo, Summary, summarize
from pdserve.bench.records import RequestRecord
from pdserve.bench.workload import PromptRenderer, generate_requests

WARMUP_REPLICA = -1  # warm-up prompts share no tokens with any point's prompts


@dataclass(frozen=True)
class BurstsReport:
    """The background bursts of one load point (summarized over the point's duration)."""

    records: list[RequestRecord]
    summary: Summary


@dataclass
class PointReport:
    result: PointResult
    summary: Summary
    is_slo_held: bool | None  # None without an SLO
    bursts: BurstsReport | None = None  # None without background bursts


@dataclass
class BenchResult:
    config: BenchConfig
    model: str
    started_at: str
    machine: dict[str, str | int | None]
    num_warmup: int
    points: list[PointReport]

    @property
    def capacity(self) -> LoadPoint | None:
        """The highest load whose point held the SLO (points run in the given order and stop
        at the first miss); None without an SLO or when the first point missed it."""
        held = [p.result.load for p in self.points if p.is_slo_held]
        return max(held, key=lambda lp: lp.value) if held else None


class Progress:
    """What the runner reports while it works (the CLI draws a bar; tests pass nothing)."""

    def start(self, label: str, total: int) -> None: ...

    def advance(self, record: RequestRecord) -> None: ...

    def stop(self) -> None: ...


def make_client(target: TargetConfig) -> BenchClient:
    renderer = PromptRenderer(target.tokenizer)
    if target.url.startswith("grpc://"):
        from pdserve.bench.grpc_client import GrpcClient

        if target.api != "completions":
            raise ValueError("gRPC targets take prompts, not chat messages: drop api = chat")
        return GrpcClient(
            target.url.removeprefix("grpc://"),
            model=target.model,
            prompt_format=target.prompt_format,
            renderer=renderer,
            ignore_eos=target.ignore_eos,
            temperature=target.temperature,
            timeout_s=target.request_timeout_s,
        )
    from pdserve.bench.openai_client import OpenAIClient

    key = os.environ.get(target.api_key_env) if target.api_key_env else None
    return OpenAIClient(
        target.url,
        api=target.api,
        model=target.model,
        api_key=key,
        prompt_format=target.prompt_format,
        renderer=renderer,
        ignore_eos=target.ignore_eos,
        temperature=target.temperature,
        extra_body=target.extra_body,
        timeout_s=target.request_timeout_s,
    )


async def run_bench(
    config: BenchConfig,
    progress: Progress | None = None,
    log: Callable[[str], None] = lambda _s: None,
) -> BenchResult:
    """Runs every load point of ``config`` against its target and returns all records."""
    config.validate()
    show = progress or Progress()
    spec = config.workload.spec()
    slo = config.slo.slo()
    burst_spec = config.bursts.spec()
    client = make_client(config.target)
    try:
        try:
            model = await client.model_name()
        except Exception as e:  # the first contact: say where, not a traceback
            raise RuntimeError(f"cannot reach {config.target.url}: {type(e).__name__}: {e}") from e
        result = BenchResult(
            config=config,
            model=model,
            started_at=datetime.now(UTC).isoformat(timespec="seconds"),
            machine=_machine(),
            num_warmup=config.load.warmup_requests,
            points=[],
        )
        if config.load.warmup_requests > 0:
            warm = generate_requests(spec, WARMUP_REPLICA)[: config.load.warmup_requests]
            warm = [replace(r, cancel_after_tokens=None) for r in warm]
            show.start("warm-up", len(warm))
            start = time.perf_counter()
            await run_point(client, warm, LoadPoint(CLOSED, len(warm)), on_done=show.advance)
            show.stop()
            log(f"warm-up: {len(warm)} requests in {time.perf_counter() - start:.1f}s")
        for i, load in enumerate(config.load.points()):
            requests = generate_requests(spec, replica=i)
            show.start(load.label, len(requests))
            stop_bursts = asyncio.Event()
            bursts = None
            if burst_spec is not None:
                bursts = asyncio.create_task(run_bursts(client, burst_spec, spec, i, stop_bursts))
            try:
                point = await run_point(
                    client,
                    requests,
                    load,
                    seed=spec.seed,
                    duration_s=config.load.duration_s,
                    on_done=show.advance,
                )
            finally:
                stop_bursts.set()
                burst_records = None if bursts is None else await bursts
            show.stop()
            summary = summarize(point.records, point.duration_s, slo)
            held = None
            if summary.slo_attainment is not None:
                held = summary.slo_attainment >= config.slo.min_attainment
            burst_report = None
            if burst_records is not None:
                burst_summary = summarize(burst_records, point.duration_s, Slo())
                burst_report = BurstsReport(burst_records, burst_summary)
                log(f"{load.label}: {len(burst_records)} burst requests in the background")
            result.points.append(PointReport(point, summary, held, burst_report))
            log(
                f"{load.label}: {summary.num_completed}/{summary.num_requests} completed, "
                f"{summary.output_token_throughput:.1f} output tok/s"
                + ("" if held is None else f", SLO {'held' if held else 'missed'}")
            )
            if held is False:
                break
        return result
    finally:
        await client.aclose()


def _machine() -> dict[str, str | int | None]:
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
    }
