"""The simulated requests: ``pdserve bench``'s workload, load and bursts, by the same rules.

* Lengths and shared-prefix choices come from the same seeded streams as
  ``pdserve.bench.workload.generate_requests`` (without drawing token ids, which a simulation
  never needs), so a simulated run and a real ``pdserve bench`` run of one config see the same
  requests (tests/plan pins this).
* Open-loop send times are ``pdserve.bench.arrivals.poisson_arrival_times`` (the very
  function bench uses), or gamma-distributed gaps with a given coefficient of variation
  (bursty traffic: cv > 1), or the send times of a recorded run (a trace).
* Closed loop: ``concurrency`` clients, each sending its next request when the last ends.
* Bursts: ``size`` requests every ``interval_s`` from ``start_s`` while the foreground runs.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pdserve.bench.arrivals import poisson_arrival_times
from pdserve.bench.bursts import BurstSpec
from pdserve.bench.workload import WorkloadSpec, generate_requests
from pdserve.plan.sim_request import SimRequest

PREFIX_GROUP = 0  # bench workloads have one shared prefix


def _rng(seed: int, stream: str) -> random.Random:
    return random.Random(f"{seed}/{stream}")  # the streams of pdserve.bench.workload


def request_shapes(spec: WorkloadSpec) -> list[tuple[int, int, bool]]:
    """(prompt tokens, output tokens, shares the prefix) per request, in order: what
    ``generate_requests(spec)`` would send."""
    if spec.cancel_fraction > 0:
        raise ValueError("workload.cancel_fraction: the simulator does not model cancels")
    if spec.prompts_file:
        shapes = []
        for r in generate_requests(spec):
            if r.prompt_token_ids is None:
                raise ValueError(
                    "workload.prompts_file: the simulator needs prompt_token_ids (a text "
                    "prompt's length depends on the tokenizer)"
                )
            shapes.append((len(r.prompt_token_ids), r.max_tokens, False))
        return shapes
    len_rng, out_rng = _rng(spec.seed, "prompt_len"), _rng(spec.seed, "output_len")
    share_rng = _rng(spec.seed, "prefix")
    prefix = spec.shared_prefix_len
    out = []
    for _ in range(spec.num_requests):
        num_prompt = spec.prompt_len.sample(len_rng)
        num_output = spec.output_len.sample(out_rng)
        shared = prefix > 0 and share_rng.random() < spec.shared_prefix_fraction
        if shared:
            num_prompt = prefix + max(num_prompt - prefix, 1)
        out.append((num_prompt, num_output, shared))
    return out


def make_requests(
    spec: WorkloadSpec, first_index: int = 0, is_burst: bool = False
) -> list[SimRequest]:
    return [
        SimRequest(
            first_index + i,
            0.0,
            p,
            o,
            PREFIX_GROUP if shared else -1,
            spec.shared_prefix_len if shared else 0,
            is_burst,
        )
        for i, (p, o, shared) in enumerate(request_shapes(spec))
    ]


def gamma_arrival_times(rate: float, cv: float, num: int, seed: int) -> list[float]:
    """Send times with gamma-distributed gaps: mean ``1 / rate``, coefficient of variation
    ``cv`` (1 = Poisson; > 1 = bursty)."""
    if rate <= 0 or cv <= 0:
        raise ValueError("gamma arrivals need rate > 0 and cv > 0")
    if math.isinf(rate):
        return [0.0] * num
    shape = 1.0 / (cv * cv)
    scale = 1.0 / (rate * shape)
    rng = random.Random(f"{seed}/arrivals-gamma")
    t, times = 0.0, []
    for _ in range(num):
        t += rng.gammavariate(shape, scale)
        times.append(t)
    return times


@dataclass(frozen=True)
class TraceRequest:
    start_s: float
    num_prompt: int
    num_output: int
    has_shared_prefix: bool


def load_trace(path: Path, point: int = 0) -> list[TraceRequest]:
    """The requests of one load point of a ``pdserve bench`` results.json (or its --out
    folder), as sent: send time, prompt and output tokens (completed ones; failed requests
    carry no output count and are left out)."""
    if path.is_dir():
        path = path / "results.json"
    data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    points = data.get("points") or []
    if not 0 <= point < len(points):
        raise ValueError(f"{path}: no load point {point} (has {len(points)})")
    out = []
    for r in points[point]["records"]:
        if r.get("status") != "ok" or not r.get("num_prompt_tokens"):
            continue
        out.append(
            TraceRequest(
                float(r["start_s"]),
                int(r["num_prompt_tokens"]),
                max(1, int(r["num_output_tokens"])),
                bool(r.get("has_shared_prefix", False)),
            )
        )
    if not out:
        raise ValueError(f"{path}: load point {point} has no completed request to replay")
    out.sort(key=lambda r: r.start_s)
    return out


def open_loop_times(process: str, rate: float, cv: float, num: int, seed: int) -> list[float]:
    if process == "poisson":
        return poisson_arrival_times(rate, num, seed)
    if process == "gamma":
        return gamma_arrival_times(rate, cv, num, seed)
    raise ValueError(f"arrival process must be poisson or gamma, got {process!r}")


def burst_requests(spec: BurstSpec, workload: WorkloadSpec, burst: int) -> list[SimRequest]:
    """Burst ``burst``'s requests (bench's ``burst_requests`` shapes: the same lengths each
    burst, the foreground's seed)."""
    shape = WorkloadSpec(
        num_requests=spec.size,
        prompt_len=spec.prompt_len,
        output_len=spec.output_len,
        seed=workload.seed,
    )
    return make_requests(shape, first_index=burst * spec.size, is_burst=True)
