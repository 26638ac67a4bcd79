"""The simulation config: the cluster to simulate plus ``pdserve bench``'s own workload, load,
SLO and bursts tables (the same keys, parsed by ``pdserve.bench.config``), so one file
describes both a real benchmark and its simulation. TOML (or JSON)::

    [cluster]     mode (disaggregated | colocated), pool sizes, profile, KV transport
    [router]      policy and its options, load view, what happens when decode is full
    [prefill] [decode] [colocated]   each pool's engine flags (+ an optional profile)
    [placement]   optional: which workers share CPU cores (processor sharing)
    [arrivals]    optional: poisson | gamma (cv) | a recorded trace, for the open loop
    [sim]         records (full | compact | auto), seed, exact-steps switch
    [workload] [load] [slo] [bursts]   exactly as ``pdserve bench --config``
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any, Literal

from pdserve.bench.config import BenchConfig
from pdserve.plan.router_model import LOAD_VIEWS
from pdserve.plan.worker_settings import WorkerSettings
from router.routing import POLICY_NAMES

Mode = Literal["disaggregated", "colocated"]


@dataclass(frozen=True)
class ClusterConfig:
    mode: Mode = "disaggregated"
    num_prefill: int = 1
    num_decode: int = 1
    num_colocated: int = 1
    profile: str = "cpu-1core-135m"  # a shipped profile's name or a profile file
    transport: str = "tcp"  # a key of the profile's transfer table

    def __post_init__(self) -> None:
        if self.mode not in ("disaggregated", "colocated"):
            raise ValueError(f"cluster.mode must be disaggregated or colocated, got {self.mode!r}")
        if self.mode == "disaggregated" and (self.num_prefill < 1 or self.num_decode < 1):
            raise ValueError("cluster: disaggregated needs num_prefill >= 1 and num_decode >= 1")
        if self.mode == "colocated" and self.num_colocated < 1:
            raise ValueError("cluster: colocated needs num_colocated >= 1")

    @property
    def num_workers(self) -> int:
        if self.mode == "colocated":
            return self.num_colocated
        return self.num_prefill + self.num_decode


@dataclass(frozen=True)
class RouterConfig:
    policy: str = "least_loaded"
    options: dict[str, float] = field(default_factory=dict)  # the policy's constructor args
    load_view: str = "polled"  # exact | polled | reported (pdserve.plan.router_model)
    load_interval_s: float = 0.1
    on_full: str = "next"  # decode refused the reservation: next | fail
    candidates: int = 0  # > 0: a random sample of this many workers per pool per decision
    dispatch_s: float | None = None  # None: the profile's overhead.dispatch_s

    def __post_init__(self) -> None:
        if self.policy not in POLICY_NAMES:
            raise ValueError(f"router.policy must be one of {', '.join(POLICY_NAMES)}")
        if self.load_view not in LOAD_VIEWS:
            raise ValueError(f"router.load_view must be one of {', '.join(LOAD_VIEWS)}")
        if self.on_full not in ("next", "fail"):
            raise ValueError("router.on_full must be next or fail")
        if self.candidates < 0:
            raise ValueError("router.candidates must be >= 0")


@dataclass(frozen=True)
class PoolConfig:
    settings: WorkerSettings = field(default_factory=WorkerSettings)
    profile: str | None = None  # None: the cluster's


@dataclass(frozen=True)
class CoreGroupConfig:
    cores: float
    workers: tuple[str, ...]  # worker names: prefill-0, decode-1, colocated-0, ...


@dataclass(frozen=True)
class ArrivalsConfig:
    process: str = "poisson"  # poisson | gamma (open loop)
    cv: float = 1.0  # gamma: coefficient of variation of the gaps
    trace: str | None = None  # a pdserve bench results.json (or --out folder) to replay
    trace_point: int = 0

    def __post_init__(self) -> None:
        if self.process not in ("poisson", "gamma"):
            raise ValueError("arrivals.process must be poisson or gamma")
        if self.cv <= 0:
            raise ValueError("arrivals.cv must be > 0")


@dataclass(frozen=True)
class SimSettings:
    records: str = "auto"  # full (bench records, every gap) | compact (histograms) | auto
    seed: int = 0
    fast: bool = True  # decode runs (False: every step exact; same result, slower)
    num_samples: int = 200  # queue/usage samples over the run (the time-series plots)
    max_time_s: float | None = None  # stop here even if requests are left (None: 10 x load)

    def __post_init__(self) -> None:
        if self.records not in ("auto", "full", "compact"):
            raise ValueError("sim.records must be auto, full or compact")


@dataclass(frozen=True)
class SimConfig:
    bench: BenchConfig = field(default_factory=BenchConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    prefill: PoolConfig = field(
        default_factory=lambda: PoolConfig(WorkerSettings(max_num_batched_tokens=4096))
    )
    decode: PoolConfig = field(default_factory=PoolConfig)
    colocated: PoolConfig = field(default_factory=PoolConfig)
    placement: tuple[CoreGroupConfig, ...] = ()
    arrivals: ArrivalsConfig = field(default_factory=ArrivalsConfig)
    sim: SimSettings = field(default_factory=SimSettings)

    def to_dict(self) -> dict[str, Any]:
        d = self.bench.to_dict()
        del d["target"], d["server"]
        d.update(
            cluster=asdict(self.cluster),
            router=asdict(self.router),
            arrivals=asdict(self.arrivals),
            sim=asdict(self.sim),
        )
        for name in ("prefill", "decode", "colocated"):
            pool: PoolConfig = getattr(self, name)
            d[name] = {**asdict(pool.settings), "profile": pool.profile}
        if self.placement:
            d["placement"] = {"groups": [asdict(g) for g in self.placement]}
        return d

    @staticmethod
    def from_dict(d: dict[str, Any]) -> SimConfig:
        """Unknown tables or keys are errors, as in ``pdserve bench`` configs."""
        bench_tables = {k: v for k, v in d.items() if k in ("workload", "load", "slo", "bursts")}
        made: dict[str, Any] = {"bench": BenchConfig.from_dict(bench_tables)}
        simple = {
            "cluster": ClusterConfig,
            "router": RouterConfig,
            "arrivals": ArrivalsConfig,
            "sim": SimSettings,
        }
        for name, values in d.items():
            if name in bench_tables:
                continue
            if not isinstance(values, dict):
                raise ValueError(f"[{name}] must be a table")
            if name in simple:
                made[name] = _build(simple[name], values, name)
            elif name in ("prefill", "decode", "colocated"):
                values = dict(values)
                profile = values.pop("profile", None)
                made[name] = PoolConfig(_build(WorkerSettings, values, name), profile)
            elif name == "placement":
                _known(values, {"groups"}, name)
                made[name] = tuple(
                    CoreGroupConfig(float(g["cores"]), tuple(g["workers"]))
                    for g in values.get("groups", [])
                )
            else:
                raise ValueError(f"unknown config table [{name}]")
        config = SimConfig(**made)
        config.bench.validate()
        return config


def _known(values: dict[str, Any], known: set[str], table: str) -> None:
    bad = sorted(set(values) - known)
    if bad:
        raise ValueError(f"[{table}]: unknown key(s) {', '.join(bad)}")


def _build(cls: Any, values: dict[str, Any], table: str) -> Any:
    _known(values, {f.name for f in fields(cls)}, table)
    return cls(**values)
