"""The worker model: decode runs give exactly what step-by-step simulation gives, every block
has an owner after every step, and a seed fixes the result. Random small clusters with
chunked prefill, prefix groups, tight KV (preemption by swap and recompute), every policy."""

from __future__ import annotations

import random
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from pdserve.plan import engine_model
from pdserve.plan.profile_format import Profile
from pdserve.plan.sim_config import SimConfig
from pdserve.plan.simulate import SimResult, simulate
from tests.plan.conftest import config_dict, make_profile


def random_config(seed: int) -> tuple[dict[str, Any], Profile]:
    rng = random.Random(seed)
    colocated = rng.random() < 0.4
    pool = {
        "max_num_batched_tokens": rng.choice([128, 512, 2048]),
        "max_num_seqs": rng.choice([4, 16, 128]),
        "num_kv_blocks": rng.choice([96, 200, 1000]),
        "num_host_blocks": rng.choice([0, 40, 400]),
        "preemption_mode": rng.choice(["auto", "swap", "recompute"]),
        "swap_threshold_tokens": rng.choice([0, 256]),
        "max_prefill_tokens_with_decodes": rng.choice([0, 24, 512]),
    }
    cluster: dict[str, Any] = {"profile": "test-cpu"}
    tables: dict[str, dict[str, Any]] = {}
    if colocated:
        cluster.update(mode="colocated", num_colocated=rng.randint(1, 3))
        tables["colocated"] = pool
    else:
        cluster.update(num_prefill=rng.randint(1, 2), num_decode=rng.randint(1, 3))
        tables["decode"] = pool
        tables["prefill"] = {"max_num_batched_tokens": rng.choice([256, 4096])}
    policy = rng.choice(["round_robin", "least_loaded", "kv_aware"])
    options = {}
    if policy != "kv_aware" and rng.random() < 0.3:
        options["local_prefill_max_tokens"] = 128
    load: dict[str, Any]
    if rng.random() < 0.5:
        load = {"kind": "closed", "concurrency": [rng.choice([2, 8, 24])]}
    else:
        load = {"kind": "open", "rates": [rng.choice([1.0, 4.0, 20.0])]}
    d = config_dict(
        cluster=cluster,
        router={
            "policy": policy,
            "options": options,
            "load_view": rng.choice(["exact", "polled", "reported"]),
        },
        workload={
            "num_requests": 40,
            "prompt_len": rng.choice(["uniform:16:700", "lognormal:200:0.8:1200"]),
            "output_len": rng.choice(["uniform:1:60", "lognormal:40:1.0:300"]),
            "shared_prefix_len": rng.choice([0, 100, 300]),
            "shared_prefix_fraction": 0.6,
            "seed": seed,
        },
        load=load,
        sim={"records": "full"},
        **tables,
    )
    d["load"] = load
    return d, make_profile()


def run(d: dict[str, Any], profile: Profile, fast: bool) -> SimResult:
    d = {**d, "sim": {**d["sim"], "fast": fast}}
    return simulate(SimConfig.from_dict(d), {"test-cpu": profile})


@contextmanager
def checking_integrity() -> Iterator[list[int]]:
    """Runs ``check_integrity`` on every worker at every step boundary."""
    wake = engine_model.EngineModel._wake
    seen = [0]

    def checked(self: engine_model.EngineModel) -> None:
        self.check_integrity()
        seen[0] += 1
        wake(self)

    engine_model.EngineModel._wake = checked  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        engine_model.EngineModel._wake = wake  # type: ignore[method-assign]


def records_of(r: SimResult) -> list[tuple[Any, ...]]:
    recs = r.points[0].records or []
    return [
        (x.index, x.status, x.num_output_tokens, x.ttft_s, x.e2e_s, tuple(x.itl_s)) for x in recs
    ]


def assert_same(a: list[tuple[Any, ...]], b: list[tuple[Any, ...]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x[:3] == y[:3], (x[:3], y[:3])
        for u, v in zip(x[3:5], y[3:5], strict=True):
            assert (u is None) == (v is None) and (u is None or abs(u - v) < 1e-6), (x, y)
        assert len(x[5]) == len(y[5])
        assert all(abs(g - h) < 1e-6 for g, h in zip(x[5], y[5], strict=True))


@pytest.mark.parametrize("seed", range(16))
def test_decode_runs_match_exact_steps(seed: int) -> None:
    d, profile = random_config(seed)
    with checking_integrity() as seen:
        exact = run(d, profile, fast=False)
        fast = run(d, profile, fast=True)
    assert seen[0] > 0
    assert_same(records_of(fast), records_of(exact))
    assert fast.points[0].num_events <= exact.points[0].num_events
    s = fast.points[0].summary
    assert s.num_completed + s.num_failed == 40


def test_preemption_happens_and_every_request_completes() -> None:
    d = config_dict(
        cluster={"mode": "colocated", "num_colocated": 1},
        colocated={"num_kv_blocks": 64, "num_host_blocks": 64, "max_num_batched_tokens": 256},
        workload={
            "num_requests": 30,
            "prompt_len": "uniform:100:300",
            "output_len": "uniform:100:200",
        },
        load={"kind": "closed", "concurrency": [12]},
        sim={"records": "full"},
    )
    with checking_integrity():
        r = simulate(SimConfig.from_dict(d), {"test-cpu": make_profile()})
    p = r.points[0]
    assert p.summary.num_completed == 30
    pool = p.pools[0]
    assert pool.num_preemptions > 0 and pool.num_swapped_blocks > 0
    for rec in p.records or []:
        assert len(rec.itl_s) == rec.num_output_tokens - 1


def test_same_seed_same_result_other_seed_other_result() -> None:
    d, profile = random_config(3)
    a, b = records_of(run(d, profile, True)), records_of(run(d, profile, True))
    assert a == b
    d["workload"]["seed"] = 99
    assert records_of(run(d, profile, True)) != a


@pytest.mark.parametrize("mode", ["disaggregated", "colocated"])
def test_admit_overhead_delays_a_transferred_prompt_only(mode: str) -> None:
    """``overhead.admit_s`` (KV landed -> decode admits) moves a lone request's first token
    and end by exactly that much on a disaggregated cluster, and not at all colocated."""
    from dataclasses import replace

    from pdserve.plan.profile_format import Overhead

    cluster: dict[str, Any] = {"profile": "test-cpu"}
    if mode == "colocated":
        cluster.update(mode="colocated", num_colocated=1)
    d = config_dict(
        cluster=cluster,
        workload={"num_requests": 1, "prompt_len": "uniform:200:200", "output_len": "uniform:8:8"},
        load={"kind": "closed", "concurrency": [1]},
        sim={"records": "full"},
    )
    base = make_profile()
    late = replace(base, overhead=Overhead(base.overhead.dispatch_s, 0.25, base.overhead.stream_s))
    (a,) = records_of(simulate(SimConfig.from_dict(d), {"test-cpu": base}))
    (b,) = records_of(simulate(SimConfig.from_dict(d), {"test-cpu": late}))
    shift = 0.25 if mode == "disaggregated" else 0.0
    assert b[3] - a[3] == pytest.approx(shift) and b[4] - a[4] == pytest.approx(shift)
    assert b[5] == pytest.approx(a[5])


def test_an_imported_prompt_streams_its_first_token_at_the_end_of_the_step_it_joins() -> None:
    """As the engine does (imports at a step's start, outputs at its end): a lone
    disaggregated request's first token goes out one decode step after its KV landed,
    together with its second; with one output token it goes out when the KV lands."""
    profile = make_profile()

    def lone(num_output: int) -> tuple[Any, ...]:
        d = config_dict(
            workload={
                "num_requests": 1,
                "prompt_len": "uniform:200:200",
                "output_len": f"uniform:{num_output}:{num_output}",
            },
            load={"kind": "closed", "concurrency": [1]},
            sim={"records": "full"},
        )
        (rec,) = records_of(simulate(SimConfig.from_dict(d), {"test-cpu": profile}))
        return rec

    one, eight = lone(1), lone(8)
    assert eight[3] - one[3] == pytest.approx(profile.step.decode_seconds(1, 201))
    assert eight[5][0] == 0.0 and all(g > 0 for g in eight[5][1:])
