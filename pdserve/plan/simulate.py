"""Run a simulation: the load points of a config, each on a fresh simulated cluster, into the
same ``Summary`` (and, with full records, the same ``BenchResult``) as ``pdserve bench``.

Per load point: the clients (closed loop, open loop or a trace, as bench drives them, plus
background bursts), the cluster, periodic samples of every pool (queues, KV usage), and at
the end each pool's utilisation (busy time over wall time, per worker).
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import dataclass, field, replace
from pathlib import Path

from pdserve.bench.load import CLOSED, LoadPoint, PointResult
from pdserve.bench.metrics import Slo, Summary
from pdserve.bench.records import RequestRecord
from pdserve.bench.runner import BenchResult, BurstsReport, PointReport
from pdserve.plan.cluster import Cluster, Recorder
from pdserve.plan.events import EventLoop
from pdserve.plan.profile_format import Profile, load_profile
from pdserve.plan.recorder import CompactRecorder, FullRecorder
from pdserve.plan.sim_config import SimConfig
from pdserve.plan.sim_request import SimRequest
from pdserve.plan.workload_gen import burst_requests, load_trace, make_requests, open_loop_times

FULL_RECORDS_MAX = 20_000  # records = "auto": full records up to this many requests


@dataclass
class PoolStats:
    role: str
    num_workers: int
    utilisation: float  # mean over the pool's workers of busy time / duration
    num_steps: int
    num_tokens: int
    num_preemptions: int
    num_swapped_blocks: int
    transfer_bytes: int = 0


@dataclass
class Samples:
    """The pools over time (``t`` in seconds from the point's start)."""

    t: list[float] = field(default_factory=list)
    waiting: dict[str, list[int]] = field(default_factory=dict)  # per pool: waiting requests
    running: dict[str, list[int]] = field(default_factory=dict)  # per pool: in the batch
    kv_usage: dict[str, list[float]] = field(default_factory=dict)  # per pool: used / blocks
    queued_prefill_tokens: list[int] = field(default_factory=list)


@dataclass
class PointSim:
    load: LoadPoint
    summary: Summary
    bursts: Summary | None
    records: list[RequestRecord] | None  # full records only
    burst_records: list[RequestRecord] | None
    pools: list[PoolStats]
    samples: Samples
    duration_s: float
    wall_s: float
    num_events: int
    num_requests: int
    is_slo_held: bool | None


@dataclass
class SimResult:
    config: SimConfig
    profile: Profile
    points: list[PointSim]

    def bench_result(self) -> BenchResult:
        """The run as ``pdserve bench`` would report it (for its tables, JSON and plots)."""
        c = self.config.cluster
        shape = (
            f"{c.num_colocated} colocated"
            if c.mode == "colocated"
            else f"{c.num_prefill}P{c.num_decode}D"
        )
        bench = replace(
            self.config.bench,
            target=replace(self.config.bench.target, url=f"sim://{shape} {self.profile.name}"),
        )
        points = []
        for p in self.points:
            result = PointResult(p.load, p.records or [], p.duration_s)
            bursts = None
            if p.bursts is not None:
                bursts = BurstsReport(p.burst_records or [], p.bursts)
            points.append(PointReport(result, p.summary, p.is_slo_held, bursts))
        return BenchResult(
            config=bench,
            model=self.profile.model.name or self.profile.name,
            started_at="simulated",
            machine={"simulator": "pdserve plan", "profile": self.profile.name},
            num_warmup=0,
            points=points,
        )


def load_profiles(config: SimConfig, base: Path | None = None) -> dict[str, Profile]:
    """Every profile the config names (cluster's and pools'), by the name used there."""
    names = {config.cluster.profile}
    for pool in (config.prefill, config.decode, config.colocated):
        if pool.profile:
            names.add(pool.profile)
    out = {}
    for name in names:
        path = Path(name)
        if base is not None and not path.is_absolute() and (base / path).exists():
            path = base / path
        out[name] = load_profile(path if path.exists() else name)
    return out


def simulate(
    config: SimConfig, profiles: dict[str, Profile] | None = None, all_points: bool = False
) -> SimResult:
    """Every load point (stopping after the first that misses the SLO, as bench does,
    unless ``all_points``)."""
    profiles = profiles or load_profiles(config)
    slo = config.bench.slo.slo()
    points = []
    for i, load in enumerate(config.bench.load.points()):
        p = simulate_point(config, profiles, load, i)
        if p.summary.slo_attainment is not None:
            p.is_slo_held = p.summary.slo_attainment >= config.bench.slo.min_attainment
        points.append(p)
        if p.is_slo_held is False and not all_points:
            break
    del slo
    return SimResult(config, profiles[config.cluster.profile], points)


class _Clients:
    """Sends the point's requests as bench's load model would."""

    def __init__(
        self,
        cluster: Cluster,
        loop: EventLoop,
        config: SimConfig,
        load: LoadPoint,
        requests: list[SimRequest],
        times: list[float] | None,
    ) -> None:
        self.cluster = cluster
        self.loop = loop
        self.pending = deque(requests)
        self.deadline = config.bench.load.duration_s
        self.in_flight = 0
        self.unfinished = 0
        self.limit = int(load.value) if load.kind == CLOSED else load.max_concurrency
        self.stream_s = cluster.profile.overhead.stream_s
        self.sent: list[SimRequest] = []
        self.held: deque[SimRequest] = deque()  # open loop: over max_concurrency, waiting
        self.num_bursts_in_flight = 0
        self.to_arrive = 0  # open loop: send times still ahead
        if times is None:  # closed loop: `limit` clients, each sending in turn
            for _ in range(min(self.limit or 1, len(self.pending))):
                self._next()
        else:
            for req, at in zip(requests, times, strict=True):
                if self.deadline is not None and at >= self.deadline:
                    break
                loop.at(at, self._arrive, req)
                self.to_arrive += 1
            self.pending.clear()

    def _next(self, _arg: object = None) -> None:
        if not self.pending:
            return
        if self.deadline is not None and self.loop.now >= self.deadline:
            self.pending.clear()
            return
        self._send(self.pending.popleft())

    def _arrive(self, req: SimRequest) -> None:
        self.to_arrive -= 1
        if self.limit and self.in_flight >= self.limit:
            self.held.append(req)  # the semaphore of bench's open loop
            return
        self._send(req)

    def _send(self, req: SimRequest) -> None:
        self.in_flight += 1
        self.unfinished += 1
        self.sent.append(req)
        self.cluster.send(req)

    def done(self, req: SimRequest) -> None:
        if req.is_burst:
            self.num_bursts_in_flight -= 1
            return
        self.in_flight -= 1
        self.unfinished -= 1
        when = self.stream_s  # the client learns of the end one hop later
        if self.pending:  # closed loop
            self.loop.after(when, self._next)
        elif self.held:
            self.loop.after(when, self._release_held)

    def _release_held(self, _arg: object = None) -> None:
        if self.held and (not self.limit or self.in_flight < self.limit):
            self._send(self.held.popleft())

    @property
    def is_done(self) -> bool:
        """The foreground is over (bursts stop being sent from here)."""
        return self.unfinished == 0 and not self.pending and not self.held and not self.to_arrive


def simulate_point(
    config: SimConfig, profiles: dict[str, Profile], load: LoadPoint, point: int = 0
) -> PointSim:
    started = time.perf_counter()
    loop = EventLoop()
    spec = config.bench.workload.spec()
    burst_spec = config.bench.bursts.spec()
    trace = None
    if config.arrivals.trace:
        trace = load_trace(Path(config.arrivals.trace), config.arrivals.trace_point)
        requests = [
            SimRequest(
                i,
                0.0,
                r.num_prompt,
                r.num_output,
                0 if r.has_shared_prefix else -1,
                spec.shared_prefix_len if r.has_shared_prefix else 0,
            )
            for i, r in enumerate(trace)
        ]
    else:
        requests = make_requests(spec)
    full = config.sim.records == "full" or (
        config.sim.records == "auto" and len(requests) <= FULL_RECORDS_MAX
    )
    stream_s = profiles[config.cluster.profile].overhead.stream_s
    rec: Recorder = FullRecorder(stream_s) if full else CompactRecorder(stream_s)
    burst_rec: Recorder = FullRecorder(stream_s) if full else CompactRecorder(stream_s)
    clients: list[_Clients] = []
    cluster = Cluster(config, profiles, loop, rec, burst_rec, lambda r: clients[0].done(r))
    if trace is not None:
        times: list[float] | None = [r.start_s for r in trace]
    elif load.kind == CLOSED:
        times = None
    else:
        times = open_loop_times(
            config.arrivals.process, load.value, config.arrivals.cv, len(requests), spec.seed
        )
    clients.append(_Clients(cluster, loop, config, load, requests, times))
    client = clients[0]
    if burst_spec is not None:
        _schedule_bursts(loop, cluster, client, burst_spec, spec)
    samples = Samples()
    _Sampler(loop, cluster, samples, client, _sample_interval(load, len(requests), config))
    horizon = config.sim.max_time_s
    if horizon is None:
        last = max(times) if times else 0.0
        horizon = 10 * last + 36_000.0
    while (
        not loop.is_empty
        and loop.now <= horizon
        and not (client.is_done and client.num_bursts_in_flight == 0)
    ):
        loop.run(until=min(horizon, loop.now + 60.0))
    loop.run(until=loop.now)  # what is due now (the last finish's followers)
    end = loop.now
    for req in client.sent:
        if req.finish_s < 0:
            req.fail(end, "unfinished when the simulation stopped")
            rec.done(req)
    slo: Slo = config.bench.slo.slo()
    duration = max((r.finish_s for r in client.sent), default=0.0) + stream_s
    summary = rec.summary(duration, slo)
    bursts = burst_rec.summary(duration, Slo()) if burst_spec is not None else None
    pools = _pool_stats(cluster, duration)
    return PointSim(
        load=load,
        summary=summary,
        bursts=bursts,
        records=rec.records if isinstance(rec, FullRecorder) else None,
        burst_records=burst_rec.records if isinstance(burst_rec, FullRecorder) else None,
        pools=pools,
        samples=samples,
        duration_s=duration,
        wall_s=time.perf_counter() - started,
        num_events=loop.num_events,
        num_requests=len(client.sent),
        is_slo_held=None,
    )


def _schedule_bursts(
    loop: EventLoop, cluster: Cluster, client: _Clients, spec: object, workload: object
) -> None:
    from pdserve.bench.bursts import BurstSpec
    from pdserve.bench.workload import WorkloadSpec

    assert isinstance(spec, BurstSpec) and isinstance(workload, WorkloadSpec)

    def burst(n: int) -> None:
        if client.is_done:
            return
        for req in burst_requests(spec, workload, n):
            client.num_bursts_in_flight += 1
            cluster.send(req)
        loop.after(spec.interval_s, burst, n + 1)

    loop.at(spec.start_s, burst, 0)


def _sample_interval(load: LoadPoint, n: int, config: SimConfig) -> float:
    if load.kind != CLOSED and not math.isinf(load.value):
        expected = n / load.value
        if config.bench.load.duration_s:
            expected = min(expected, config.bench.load.duration_s)
        return max(expected / max(1, config.sim.num_samples), 1e-3)
    return 0.25  # closed loop: halved in density whenever the samples double (see _Sampler)


class _Sampler:
    def __init__(
        self,
        loop: EventLoop,
        cluster: Cluster,
        samples: Samples,
        client: _Clients,
        interval_s: float,
    ) -> None:
        self.loop = loop
        self.cluster = cluster
        self.s = samples
        self.client = client
        self.interval = interval_s
        self.cap = 2 * max(1, cluster.config.sim.num_samples)
        roles = ["prefill", "decode"] if cluster.prefill else ["colocated"]
        for role in roles:
            samples.waiting[role], samples.running[role], samples.kv_usage[role] = [], [], []
        self.roles = roles
        loop.at(0.0, self.sample)

    def sample(self, _arg: object = None) -> None:
        s, c = self.s, self.cluster
        s.t.append(self.loop.now)
        for role in self.roles:
            pool = c.pool_of(role)
            s.waiting[role].append(sum(len(w.waiting) + len(w.ready) for w in pool))
            s.running[role].append(sum(len(w.running) for w in pool))
            blocks = sum(w.pool.num_blocks for w in pool)
            s.kv_usage[role].append(sum(w.pool.num_in_use for w in pool) / blocks)
        s.queued_prefill_tokens.append(sum(c.queued_tokens.values()))
        if len(s.t) >= self.cap:  # keep every other sample, sample half as often
            s.t = s.t[::2]
            for counts in (s.waiting, s.running):
                for k in counts:
                    counts[k] = counts[k][::2]
            for k in s.kv_usage:
                s.kv_usage[k] = s.kv_usage[k][::2]
            s.queued_prefill_tokens = s.queued_prefill_tokens[::2]
            self.interval *= 2
        if not self.client.is_done:
            self.loop.after(self.interval, self.sample)


def _pool_stats(cluster: Cluster, duration: float) -> list[PoolStats]:
    out = []
    roles = ["prefill", "decode"] if cluster.prefill else ["colocated"]
    for role in roles:
        pool = cluster.pool_of(role)
        out.append(
            PoolStats(
                role=role,
                num_workers=len(pool),
                utilisation=sum(w.busy_s for w in pool) / max(duration, 1e-9) / len(pool),
                num_steps=sum(w.num_steps_run for w in pool),
                num_tokens=sum(w.num_tokens_computed for w in pool),
                num_preemptions=sum(w.num_preemptions for w in pool),
                num_swapped_blocks=sum(w.num_swapped_blocks for w in pool),
                transfer_bytes=sum(cluster.links[w.name].num_bytes for w in pool)
                if role == "decode"
                else 0,
            )
        )
    return out
