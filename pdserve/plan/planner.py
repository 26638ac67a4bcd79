"""The planner: for a workload and SLOs, the pool split and engine limits with the most
goodput per worker, at each total size.

Goodput of a configuration = the highest open-loop request rate at which the simulated run
still holds the SLO for ``min_attainment`` of its requests (``pdserve bench``'s capacity),
found by doubling then bisecting the rate. Goodput per worker = that rate / workers.

Sizes: up to ``unit_max`` workers every split is simulated at its real size. Past it, the
router spreads requests over identical workers, so a cluster of k copies of a unit holds k
times the unit's rate: splits are searched on a unit of ``unit_max`` workers, scaled to the
size, and the best is then simulated at its full size at the scaled rate (``verified``: the
attainment that full run reached). The colocated baseline is searched the same way.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from pdserve.bench.config import BenchConfig, LoadConfig
from pdserve.plan.profile_format import Profile
from pdserve.plan.sim_config import ClusterConfig, PoolConfig, SimConfig
from pdserve.plan.simulate import PointSim, simulate_point


@dataclass(frozen=True)
class Candidate:
    mode: str  # disaggregated | colocated
    num_prefill: int
    num_decode: int
    max_num_seqs: int
    chunk_tokens: int  # prefill's (or colocated's) max_num_batched_tokens

    @property
    def num_workers(self) -> int:
        return self.num_prefill + self.num_decode

    @property
    def label(self) -> str:
        shape = (
            f"{self.num_decode} colocated"
            if self.mode == "colocated"
            else f"{self.num_prefill}P{self.num_decode}D"
        )
        return f"{shape} seqs={self.max_num_seqs} chunk={self.chunk_tokens}"


@dataclass
class Evaluation:
    candidate: Candidate
    rate: float  # requests/s the candidate holds the SLO at (0: not even the lowest)
    point: PointSim | None  # the simulated run at that rate
    num_sims: int
    scale: int = 1  # the candidate is a unit; the cluster is this many copies
    verified: float | None = None  # attainment of the full-size run at rate x scale

    @property
    def num_workers(self) -> int:
        return self.candidate.num_workers * self.scale

    @property
    def total_rate(self) -> float:
        return self.rate * self.scale

    @property
    def per_worker(self) -> float:
        return self.total_rate / self.num_workers


def configure(base: SimConfig, c: Candidate, rate: float, num_requests: int) -> SimConfig:
    """``base`` with the candidate's pools and one open-loop point at ``rate``."""
    if c.mode == "colocated":
        cluster = replace(base.cluster, mode="colocated", num_colocated=c.num_decode)
        colocated = PoolConfig(
            replace(
                base.colocated.settings,
                max_num_seqs=c.max_num_seqs,
                max_num_batched_tokens=c.chunk_tokens,
            ),
            base.colocated.profile,
        )
        return _with(base, cluster, bench_for(base, rate, num_requests), colocated=colocated)
    cluster = replace(
        base.cluster, mode="disaggregated", num_prefill=c.num_prefill, num_decode=c.num_decode
    )
    prefill = PoolConfig(
        replace(base.prefill.settings, max_num_batched_tokens=c.chunk_tokens), base.prefill.profile
    )
    decode = PoolConfig(
        replace(base.decode.settings, max_num_seqs=c.max_num_seqs), base.decode.profile
    )
    return _with(base, cluster, bench_for(base, rate, num_requests), prefill=prefill, decode=decode)


def bench_for(base: SimConfig, rate: float, num_requests: int) -> BenchConfig:
    return replace(
        base.bench,
        workload=replace(base.bench.workload, num_requests=num_requests),
        load=LoadConfig(
            kind="open",
            rates=[rate],
            duration_s=None,
            max_concurrency=base.bench.load.max_concurrency,
        ),
    )


def _with(
    base: SimConfig,
    cluster: ClusterConfig,
    bench: BenchConfig,
    prefill: PoolConfig | None = None,
    decode: PoolConfig | None = None,
    colocated: PoolConfig | None = None,
) -> SimConfig:
    return replace(
        base,
        bench=bench,
        cluster=cluster,
        sim=replace(base.sim, records="compact"),
        prefill=prefill or base.prefill,
        decode=decode or base.decode,
        colocated=colocated or base.colocated,
    )


@dataclass(frozen=True)
class SearchSettings:
    requests_per_worker: int = 40  # requests per simulated run, per worker
    min_requests: int = 200
    min_duration_s: float = 60.0  # and at least this much traffic (a burst is not a load)
    bisect_steps: int = 6
    unit_max: int = 32  # sizes above: search a unit this big and scale


def find_rate(
    base: SimConfig,
    profiles: dict[str, Profile],
    c: Candidate,
    settings: SearchSettings,
    start_rate: float,
) -> Evaluation:
    """The highest rate (within 1/2^bisect_steps of the bracket) at which ``c`` holds."""
    need = base.bench.slo.min_attainment
    sims = 0

    def run(rate: float) -> PointSim:
        nonlocal sims
        sims += 1
        config = configure(base, c, rate, num_requests(settings, c, rate))
        load = config.bench.load.points()[0]
        return simulate_point(config, profiles, load)

    def holds(p: PointSim) -> bool:
        a = p.summary.slo_attainment
        return a is not None and a >= need and p.summary.num_failed == 0

    lo, lo_point, hi = 0.0, None, start_rate
    while True:  # bracket: double until it misses
        p = run(hi)
        if not holds(p):
            break
        lo, lo_point, hi = hi, p, hi * 2
        if sims > 30:
            break
    if lo == 0.0:  # shrink until it holds (or give up: the SLO is out of reach)
        while sims < 12:
            hi_miss = hi
            hi /= 4
            p = run(hi)
            if holds(p):
                lo, lo_point, hi = hi, p, hi_miss
                break
        if lo == 0.0:
            return Evaluation(c, 0.0, None, sims)
    for _ in range(settings.bisect_steps):
        mid = (lo + hi) / 2
        p = run(mid)
        if holds(p):
            lo, lo_point = mid, p
        else:
            hi = mid
    return Evaluation(c, lo, lo_point, sims)


def num_requests(settings: SearchSettings, c: Candidate, rate: float) -> int:
    return int(
        max(
            settings.min_requests,
            settings.requests_per_worker * c.num_workers,
            math.ceil(rate * settings.min_duration_s),
        )
    )


def splits(n: int, max_seqs: Sequence[int], chunks: Sequence[int]) -> list[Candidate]:
    """Every P:D split of ``n`` workers (P = 1..n-1) with every limit pair."""
    return [
        Candidate("disaggregated", p, n - p, s, k)
        for p in range(1, n)
        for s in max_seqs
        for k in chunks
    ]


def colocated(n: int, max_seqs: Sequence[int], chunks: Sequence[int]) -> list[Candidate]:
    return [Candidate("colocated", 0, n, s, k) for s in max_seqs for k in chunks]


def search_size(
    base: SimConfig,
    profiles: dict[str, Profile],
    num_workers: int,
    max_seqs: Sequence[int],
    chunks: Sequence[int],
    settings: SearchSettings = SearchSettings(),
    log: Callable[[str], None] = lambda _s: None,
) -> tuple[list[Evaluation], list[Evaluation]]:
    """(disaggregated evaluations best first, colocated ones best first) at this size."""
    unit = num_workers if num_workers <= settings.unit_max else settings.unit_max
    scale = 1 if unit == num_workers else num_workers / unit
    # Coarse first: the per-worker rate of a 1P1D-ish guess seeds every bracket.
    guess = 0.25 * unit
    results: dict[str, list[Evaluation]] = {"disaggregated": [], "colocated": []}
    seen_rate = guess
    step = max(1, unit // 16)  # large units: every step-th split, then refine around the best
    cands = [
        c for c in splits(unit, max_seqs, chunks) if c.num_prefill % step == 0 or c.num_prefill == 1
    ]
    cands += colocated(unit, max_seqs, chunks)
    for c in cands:
        ev = find_rate(base, profiles, c, settings, seen_rate)
        if ev.rate > 0:
            seen_rate = ev.rate
        results[c.mode].append(ev)
        log(f"  {c.label}: {ev.rate:.3f} req/s ({ev.num_sims} runs)")
    if step > 1 and results["disaggregated"]:
        best = max(results["disaggregated"], key=lambda e: e.rate).candidate
        done = {e.candidate for e in results["disaggregated"]}
        for p in range(max(1, best.num_prefill - step + 1), min(unit, best.num_prefill + step)):
            c = replace(best, num_prefill=p, num_decode=unit - p)
            if c not in done:
                ev = find_rate(base, profiles, c, settings, seen_rate)
                results["disaggregated"].append(ev)
                log(f"  {c.label}: {ev.rate:.3f} req/s ({ev.num_sims} runs)")
    out = []
    for mode in ("disaggregated", "colocated"):
        evs = sorted(results[mode], key=lambda e: -e.rate)
        if scale != 1:
            evs = [_scaled(e, num_workers) for e in evs]
        out.append(evs)
    return out[0], out[1]


def _scaled(e: Evaluation, num_workers: int) -> Evaluation:
    """A unit's evaluation as a cluster of ``num_workers``: the split scaled (rounded, at
    least one of each), the rate scaled by the same factor."""
    c = e.candidate
    f = num_workers / c.num_workers
    if c.mode == "colocated":
        big = replace(c, num_decode=num_workers)
    else:
        p = min(num_workers - 1, max(1, round(c.num_prefill * f)))
        big = replace(c, num_prefill=p, num_decode=num_workers - p)
    return Evaluation(big, e.rate * f, e.point, e.num_sims)


def verify(
    base: SimConfig, profiles: dict[str, Profile], e: Evaluation, settings: SearchSettings
) -> Evaluation:
    """Simulate ``e`` at its full size and rate; records the attainment reached."""
    c = e.candidate
    config = configure(base, c, e.rate, num_requests(settings, c, e.rate))
    p = simulate_point(config, profiles, config.bench.load.points()[0])
    e.verified = p.summary.slo_attainment
    e.point = p
    return e


def per_dollar(e: Evaluation, price_per_hour: float) -> float | None:
    """Requests per dollar at the SLO (None without a price)."""
    if price_per_hour <= 0:
        return None
    return e.total_rate * 3600.0 / (price_per_hour * e.num_workers)


def default_limits(base: SimConfig) -> tuple[list[int], list[int]]:
    return [base.decode.settings.max_num_seqs], [base.prefill.settings.max_num_batched_tokens]


__all__ = [
    "Candidate",
    "Evaluation",
    "SearchSettings",
    "configure",
    "find_rate",
    "search_size",
    "verify",
]
