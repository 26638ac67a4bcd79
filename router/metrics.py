"""The router's request metrics: what a client sees, measured where every request passes.

``Router.stream`` opens a ``RequestRecord`` per dispatched request and feeds it each output;
refusals before dispatch go to ``rejected``. Times are ``time.monotonic()``:

    arrival ─router_queue─▶ dispatch ──▶ first token ─ITL─▶ token ─ITL─▶ ... last token / end
    (Router.prepare)        (backend)    |<- TTFT ->|  (from arrival)      |<- e2e (from arrival)

Goodput: a request that finished (stop or length) with TTFT <= ``slo_ttft_s`` and time per
output token <= ``slo_itl_s`` (an unset SLO always holds). Violations count per SLO, so burn
rates divide them by the TTFT (or TPOT) histogram's count.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from engine.metrics import LATENCY_BUCKETS_S
from engine.metrics import Histogram as PlainHistogram
from engine.outputs import RequestOutput
from pdserve.metrics.build_info import BuildInfo
from pdserve.metrics.stages import TtftStages
from router.admission import Admission
from router.backend import Backend, GenerateRequest
from router.errors import ErrorKind, RequestError
from router.migration import PHASES, REASONS, MigrationStats

FINISH_REASONS = ("stop", "length", "abort", "timeout", "error")
REJECT_REASONS = ("busy", "invalid", "not_found", "conflict")
_REJECT = {
    ErrorKind.BUSY: "busy",
    ErrorKind.INVALID: "invalid",
    ErrorKind.TOO_LARGE: "invalid",
    ErrorKind.NOT_FOUND: "not_found",
    ErrorKind.CONFLICT: "conflict",
}
# Per-request token counts (prompt and output), 1 .. 128k.
_TOKEN_BUCKETS = tuple(float(2**i) for i in range(18))


class RouterMetrics:
    """One per router process; ``registry`` is what ``/metrics`` serves."""

    def __init__(
        self,
        role: str,
        model: str,
        slo_ttft_s: float | None = None,
        slo_itl_s: float | None = None,
    ) -> None:
        self.role, self.model = role, model
        self.slo_ttft_s, self.slo_itl_s = slo_ttft_s, slo_itl_s
        self.registry = CollectorRegistry()
        ProcessCollector(registry=self.registry)
        self.build_info = BuildInfo(self.registry, role, model)
        self.stages = TtftStages(role, model)
        self.registry.register(self.stages)
        self.router_queue = PlainHistogram(LATENCY_BUCKETS_S)
        self.stages.add("router_queue", self.router_queue)
        labels = {"role": role, "model": model}

        def histogram(name: str, doc: str, buckets: tuple[float, ...] = LATENCY_BUCKETS_S) -> Any:
            return Histogram(
                name, doc, list(labels), registry=self.registry, buckets=buckets
            ).labels(**labels)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, list(labels), registry=self.registry).labels(**labels)

        self.ttft = histogram(
            "pdserve_request_ttft_seconds", "Time to first token, from arrival at the router."
        )
        self.itl = histogram(
            "pdserve_request_inter_token_latency_seconds",
            "Time between consecutive token deliveries of a request.",
        )
        self.tpot = histogram(
            "pdserve_request_time_per_output_token_seconds",
            "Per finished request with 2+ tokens: (last token - first token) / (tokens - 1).",
        )
        self.e2e = histogram(
            "pdserve_request_e2e_seconds", "Arrival at the router to the request's end."
        )
        self.prompt_len = histogram(
            "pdserve_request_prompt_length_tokens", "Prompt tokens per request.", _TOKEN_BUCKETS
        )
        self.output_len = histogram(
            "pdserve_request_generation_length_tokens",
            "Generated tokens per ended request.",
            _TOKEN_BUCKETS,
        )
        self.prompt_tokens = counter(
            "pdserve_request_prompt_tokens", "Prompt tokens of dispatched requests."
        )
        self.generation_tokens = counter(
            "pdserve_request_generation_tokens", "Tokens delivered to clients."
        )
        self.goodput_requests = counter(
            "pdserve_goodput_requests", "Finished requests that met every configured SLO."
        )
        self.goodput_tokens = counter(
            "pdserve_goodput_tokens", "Generated tokens of requests that met every SLO."
        )
        finished = Counter(
            "pdserve_request_finished",
            "Dispatched requests that ended, by reason (stop, length, abort = client went "
            "away, timeout = deadline, error).",
            [*labels, "reason"],
            registry=self.registry,
        )
        self.finished = {r: finished.labels(**labels, reason=r) for r in FINISH_REASONS}
        rejected = Counter(
            "pdserve_request_rejected",
            "Requests refused before any token (busy = over --max-queue or no KV room, "
            "invalid, not_found = unknown model, conflict = a request id already in flight), "
            "by reason.",
            [*labels, "reason"],
            registry=self.registry,
        )
        self.rejected_by = {r: rejected.labels(**labels, reason=r) for r in REJECT_REASONS}
        violations = Counter(
            "pdserve_request_slo_violations",
            "Requests that missed an SLO: ttft (at the first token), itl (time per output "
            "token, at the end). Never increases for an SLO that is not configured.",
            [*labels, "slo"],
            registry=self.registry,
        )
        self.violations = {s: violations.labels(**labels, slo=s) for s in ("ttft", "itl")}

    def watch(self, admission: Admission, backend: Backend) -> None:
        """Expose the router's in-flight count and the backend's worker health."""
        self.registry.register(_RouterCollector(self, admission, backend))

    def rejected(self, error: RequestError) -> None:
        """Count a refusal sent before the request was dispatched (errors that are not
        refusals, e.g. a timeout, are counted by the request's record instead)."""
        reason = _REJECT.get(error.kind)
        if reason is not None:
            self.rejected_by[reason].inc()

    def record(self, request: GenerateRequest) -> RequestRecord:
        return RequestRecord(self, request)


class RequestRecord:
    """One dispatched request's timeline. Call ``output`` for each output the client gets,
    ``fail`` when the stream ends with an exception, ``close`` always (idempotent)."""

    def __init__(self, metrics: RouterMetrics, request: GenerateRequest) -> None:
        self._m = metrics
        now = time.monotonic()
        self._arrival = request.arrival_time
        metrics.router_queue.observe(max(0.0, now - self._arrival))
        num_prompt = len(request.prompt_token_ids or ())
        metrics.prompt_tokens.inc(num_prompt)
        metrics.prompt_len.observe(num_prompt)
        self._first: float | None = None
        self._last: float | None = None
        self._num_tokens = 0
        self._ttft_ok = True
        self._reason: str | None = None

    def output(self, out: RequestOutput) -> None:
        n = len(out.new_token_ids)
        if n:
            now = time.monotonic()
            if self._first is None:
                self._first = now
                ttft = now - self._arrival
                self._m.ttft.observe(ttft)
                if self._m.slo_ttft_s is not None and ttft > self._m.slo_ttft_s:
                    self._ttft_ok = False
                    self._m.violations["ttft"].inc()
            elif self._last is not None:
                self._m.itl.observe(now - self._last)
            self._last = now
            self._num_tokens += n
            self._m.generation_tokens.inc(n)
        if out.finished and out.finish_reason in ("stop", "length"):
            self._end(out.finish_reason)

    def fail(self, error: BaseException) -> None:
        if isinstance(error, RequestError):
            if error.kind == ErrorKind.TIMEOUT:
                self._end("timeout")
            elif self._first is None and error.kind in _REJECT:
                self._m.rejected(error)  # e.g. the decode pool had no room: refused
                self._reason = "rejected"
            else:
                self._end("error")
        elif isinstance(error, (GeneratorExit, asyncio.CancelledError)):
            self._end("abort")
        else:
            self._end("error")

    def close(self) -> None:
        if self._reason is None:
            self._end("abort")  # the consumer stopped reading without an exception here

    def _end(self, reason: str) -> None:
        if self._reason is not None:
            return
        self._reason = reason
        m = self._m
        m.finished[reason].inc()
        m.e2e.observe(time.monotonic() - self._arrival)
        m.output_len.observe(self._num_tokens)
        if reason not in ("stop", "length"):
            return
        itl_ok = True
        if self._num_tokens >= 2 and self._first is not None and self._last is not None:
            tpot = (self._last - self._first) / (self._num_tokens - 1)
            m.tpot.observe(tpot)
            if m.slo_itl_s is not None and tpot > m.slo_itl_s:
                itl_ok = False
                m.violations["itl"].inc()
        if self._ttft_ok and itl_ok:
            m.goodput_requests.inc()
            m.goodput_tokens.inc(self._num_tokens)


class _RouterCollector:
    def __init__(self, metrics: RouterMetrics, admission: Admission, backend: Backend) -> None:
        self._labels = {"role": metrics.role, "model": metrics.model}
        self._slos = {"ttft": metrics.slo_ttft_s, "itl": metrics.slo_itl_s}
        self._admission = admission
        self._backend = backend

    def collect(self) -> Iterator[Metric]:
        names, values = list(self._labels), list(self._labels.values())
        inflight = GaugeMetricFamily(
            "pdserve_router_inflight_requests",
            "Requests admitted by the router and not yet ended.",
            labels=names,
        )
        inflight.add_metric(values, self._admission.num_inflight)
        yield inflight
        limit = GaugeMetricFamily(
            "pdserve_router_max_inflight_requests",
            "The router's admission limit (--max-queue).",
            labels=names,
        )
        limit.add_metric(values, self._admission.max_inflight)
        yield limit
        healthy = GaugeMetricFamily(
            "pdserve_router_healthy_workers",
            "Workers the router can reach and route to, by pool (prefill, decode). A "
            "colocated engine counts once in each pool.",
            labels=[*names, "pool"],
        )
        for pool, n in _healthy_workers(self._backend).items():
            healthy.add_metric([*values, pool], n)
        yield healthy
        stats = getattr(self._backend, "migration_stats", None)
        if isinstance(stats, MigrationStats):
            migrations = CounterMetricFamily(
                "pdserve_migrations",
                "Requests moved to other workers after the ones serving them failed, by phase "
                "(prefill: before the attempt's first token; decode: after) and reason (stall, "
                "drain, worker_lost, worker_error).",
                labels=[*names, "phase", "reason"],
            )
            for phase in PHASES:
                for reason in REASONS:
                    migrations.add_metric(
                        [*values, phase, reason], stats.migrations[(phase, reason)]
                    )
            yield migrations
            exhausted = CounterMetricFamily(
                "pdserve_migrations_failed",
                "Requests failed because migrating them was impossible or their "
                "--migration-limit was reached.",
                labels=names,
            )
            exhausted.add_metric(values, stats.exhausted)
            yield exhausted
        slo = GaugeMetricFamily(
            "pdserve_slo_target_seconds",
            "The configured SLO targets (--slo-ttft-ms, --slo-itl-ms); absent when unset.",
            labels=[*names, "slo"],
        )
        for name, target in self._slos.items():
            if target is not None:
                slo.add_metric([*values, name], target)
        yield slo


def _healthy_workers(backend: Backend) -> dict[str, int]:
    count = getattr(backend, "healthy_workers", None)
    if callable(count):
        return dict(count())
    up = int(backend.is_healthy())
    return {"prefill": up, "decode": up}
