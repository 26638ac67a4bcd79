"""The run-config file: everything that decides a benchmark's numbers, so one command
(``pdserve bench --config FILE``) reproduces a run. TOML (or JSON) with six tables::

    [target]    # where and how requests go
    [workload]  # what is sent (seeded)
    [load]      # how fast: closed loop or open loop, a sweep when several values
    [slo]       # goodput targets; a sweep stops at the first point that misses them
    [bursts]    # optional: background bursts of long prompts during every load point
    [server]    # optional: the command that starts the server, and free-form notes

Command-line flags override the file; the effective config is written next to the results.
"""

from __future__ import annotations

import json
import math
import tomllib
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from pdserve.bench.bursts import BurstSpec
from pdserve.bench.distributions import LengthDist
from pdserve.bench.load import CLOSED, OPEN, LoadPoint
from pdserve.bench.metrics import Slo
from pdserve.bench.workload import WorkloadSpec


@dataclass
class TargetConfig:
    url: str = "http://127.0.0.1:8000/v1"  # OpenAI base URL, or grpc://HOST:PORT
    api: str = "completions"  # completions | chat (OpenAI only)
    model: str | None = None  # default: the server's first model
    api_key_env: str | None = None  # name of an environment variable holding a bearer key
    tokenizer: str | None = None  # HF folder/name to render token-id prompts as text
    prompt_format: str = "auto"  # auto (token ids where the API takes them) | text
    ignore_eos: bool = True  # so every request generates exactly its output length
    temperature: float = 0.0
    extra_body: dict[str, Any] = field(default_factory=dict)  # merged into every JSON body
    request_timeout_s: float = 600.0


@dataclass
class WorkloadConfig:
    num_requests: int = 64
    prompt_len: str = "uniform:32:512"
    output_len: str = "uniform:16:256"
    seed: int = 0
    shared_prefix_len: int = 0
    shared_prefix_fraction: float = 0.0
    cancel_fraction: float = 0.0
    prompts_file: str | None = None
    token_id_low: int = 10
    token_id_high: int = 500

    def spec(self) -> WorkloadSpec:
        d = asdict(self)
        d["prompt_len"] = LengthDist.parse(self.prompt_len)
        d["output_len"] = LengthDist.parse(self.output_len)
        return WorkloadSpec(**d)


@dataclass
class LoadConfig:
    kind: str = CLOSED  # closed | open
    concurrency: list[int] = field(default_factory=lambda: [8])  # closed: one point per value
    rates: list[float] = field(default_factory=lambda: [1.0])  # open: requests/s per point
    max_concurrency: int | None = None  # open loop: cap on requests in flight
    duration_s: float | None = None  # per point: no request starts after this
    warmup_requests: int = 2  # sent before the first point, not recorded

    def points(self) -> list[LoadPoint]:
        if self.kind == CLOSED:
            return [LoadPoint(CLOSED, c) for c in self.concurrency]
        if self.kind == OPEN:
            return [LoadPoint(OPEN, float(r), self.max_concurrency) for r in self.rates]
        raise ValueError(f"load.kind must be closed or open, got {self.kind!r}")


@dataclass
class SloConfig:
    targets: str | None = None  # "ttft=500ms,itl=50ms" (keys ttft, itl, tpot, e2e)
    min_attainment: float = 0.9  # a point holds the SLO when this share of requests meet it

    def slo(self) -> Slo:
        return Slo.parse(self.targets)


@dataclass
class BurstsConfig:
    size: int = 0  # requests per burst; 0 = no bursts
    interval_s: float = 5.0  # between bursts
    start_s: float = 1.0  # the first burst, from the start of each load point
    prompt_len: str = "fixed:1024"
    output_len: str = "fixed:1"  # prefill-heavy: a burst is mostly prompt

    def spec(self) -> BurstSpec | None:
        if self.size < 0:
            raise ValueError("bursts.size must be >= 0")
        if self.size == 0:
            return None
        return BurstSpec(
            self.size,
            self.interval_s,
            self.start_s,
            LengthDist.parse(self.prompt_len),
            LengthDist.parse(self.output_len),
        )


@dataclass
class ServerConfig:
    command: str | None = None  # started before and stopped after the run when set
    ready_timeout_s: float = 300.0
    info: dict[str, Any] = field(default_factory=dict)  # recorded as given: dtype, engine...


@dataclass
class BenchConfig:
    target: TargetConfig = field(default_factory=TargetConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    load: LoadConfig = field(default_factory=LoadConfig)
    slo: SloConfig = field(default_factory=SloConfig)
    bursts: BurstsConfig = field(default_factory=BurstsConfig)
    server: ServerConfig = field(default_factory=ServerConfig)

    def validate(self) -> None:
        """Raises ValueError for any value the run would trip over later."""
        self.workload.spec()
        self.load.points()
        self.slo.slo()
        self.bursts.spec()
        if self.target.api not in ("completions", "chat"):
            raise ValueError(f"target.api must be completions or chat, got {self.target.api!r}")
        if self.target.prompt_format not in ("auto", "text"):
            raise ValueError("target.prompt_format must be auto or text")
        if not 0.0 <= self.slo.min_attainment <= 1.0:
            raise ValueError("slo.min_attainment must be in [0, 1]")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> BenchConfig:
        """Unknown tables or keys are errors (a typo must not silently change a run)."""
        made: dict[str, Any] = {}
        classes: dict[str, type] = {
            "target": TargetConfig,
            "workload": WorkloadConfig,
            "load": LoadConfig,
            "slo": SloConfig,
            "bursts": BurstsConfig,
            "server": ServerConfig,
        }
        for name, values in d.items():
            if name not in classes:
                raise ValueError(f"unknown config table [{name}]")
            if not isinstance(values, dict):
                raise ValueError(f"[{name}] must be a table")
            cls = classes[name]
            known = {f.name for f in fields(cls)}
            bad = sorted(set(values) - known)
            if bad:
                raise ValueError(f"[{name}]: unknown key(s) {', '.join(bad)}")
            made[name] = cls(**values)
        return BenchConfig(**made)


def load_config(path: Path) -> dict[str, Any]:
    """The raw tables of a ``.toml`` or ``.json`` config file."""
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
    else:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"{path}: the config must be a table")
    return data


def merge(base: dict[str, Any], overrides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``base`` tables with ``overrides``' non-None values on top (a new dict)."""
    out = {k: dict(v) for k, v in base.items()}
    for table, values in overrides.items():
        for key, value in values.items():
            if value is not None:
                out.setdefault(table, {})[key] = value
    return out


def to_toml(config: BenchConfig) -> str:
    """The config as TOML (``None`` values are left out: they mean "the default")."""
    lines = ["# pdserve bench run config: `pdserve bench --config THIS_FILE` reruns it", ""]
    for table, values in config.to_dict().items():
        lines.append(f"[{table}]")
        lines += [f"{k} = {_toml_value(v)}" for k, v in values.items() if v is not None]
        lines.append("")
    return "\n".join(lines)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and math.isinf(v):
        return "inf" if v > 0 else "-inf"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # a JSON string is a valid TOML basic string
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        items = (f"{json.dumps(str(k))} = {_toml_value(x)}" for k, x in v.items() if x is not None)
        return "{" + ", ".join(items) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")
