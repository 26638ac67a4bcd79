"""Cost-model fitting: known coefficients come back from seeded noisy samples; the
non-negative solver is exact; profiles round-trip and refuse typos."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest

from pdserve.plan.calibrate import parse_step_metrics, parse_transfers, refit, step_factor
from pdserve.plan.cost_model import StepCost
from pdserve.plan.fit import fit_step_cost, fit_swap, fit_transfer, nonneg_lstsq
from pdserve.plan.profile_format import Profile, StepSample, SwapSample, load_profile, save_profile
from pdserve.plan.step_shape import StepShape
from tests.plan.conftest import make_profile

TRUE = StepCost(
    base_s=0.04,
    per_token_s=0.002,
    per_seq_s=0.001,
    per_sampled_s=0.0,
    per_context_token_s=3e-6,
    per_attention_pair_s=2e-8,
)


def samples(seed: int, noise: float) -> list[StepSample]:
    rng = random.Random(seed)
    out = []
    for n in (16, 64, 256, 512, 1024):  # prefills
        out.append(StepShape.of([(n, 0, True)]))
    for n, c in ((64, 512), (256, 1536)):  # over a cached prefix
        out.append(StepShape.of([(n, c, True)]))
    for b, ctx in itertools.product((1, 4, 16, 64), (64, 256, 1024)):  # decodes
        out.append(StepShape.of([(1, ctx, True)] * b))
    out.append(StepShape.of([(1, 256, True)] * 8 + [(128, 0, True)]))  # mixed
    return [
        StepSample(f"s{i}", s, TRUE.seconds(s) * (1 + rng.uniform(-noise, noise)))
        for i, s in enumerate(out)
    ]


def test_exact_samples_give_the_coefficients_back() -> None:
    cost, report = fit_step_cost(
        samples(0, 0.0),
        use=("base_s", "per_token_s", "per_seq_s", "per_context_token_s", "per_attention_pair_s"),
    )
    for name in (
        "base_s",
        "per_token_s",
        "per_seq_s",
        "per_context_token_s",
        "per_attention_pair_s",
    ):
        assert getattr(cost, name) == pytest.approx(getattr(TRUE, name), rel=1e-6), name
    assert report.max_rel_error < 1e-9
    assert cost.fit["num_points"] == len(samples(0, 0.0))


def test_noisy_samples_fit_within_the_noise_and_never_go_negative() -> None:
    s = samples(3, 0.05)
    cost, report = fit_step_cost(s)
    assert report.median_rel_error < 0.05 and report.max_rel_error < 0.12
    assert all(
        v >= 0
        for v in (
            cost.base_s,
            cost.per_token_s,
            cost.per_seq_s,
            cost.per_sampled_s,
            cost.per_context_token_s,
            cost.per_attention_pair_s,
        )
    )
    for x in s:  # predictions within noise of the truth
        assert cost.seconds(x.shape) == pytest.approx(TRUE.seconds(x.shape), rel=0.1)
    again, _ = fit_step_cost(samples(3, 0.05))
    assert again == cost  # a seed fixes the fit


def test_nonneg_lstsq_is_the_constrained_optimum() -> None:
    rng = np.random.default_rng(5)
    a = rng.normal(size=(30, 4))
    b = a @ np.array([1.0, -2.0, 0.5, 0.0]) + rng.normal(scale=0.1, size=30)
    x = nonneg_lstsq(a, b)
    assert (x >= 0).all()
    best = float(np.sum((a @ x - b) ** 2))
    for _ in range(2000):  # no feasible point does better
        y = np.abs(x + rng.normal(scale=0.3, size=4)) * (rng.random(4) > 0.2)
        assert float(np.sum((a @ y - b) ** 2)) >= best - 1e-9


def test_transfer_and_swap_lines() -> None:
    sizes = [65536, 1 << 20, 16 << 20, 64 << 20]
    t = fit_transfer(sizes, [0.0004 + s / 3e9 for s in sizes])
    assert t.latency_s == pytest.approx(0.0004, rel=1e-6)
    assert t.bytes_per_s == pytest.approx(3e9, rel=1e-6)
    fitted = parse_transfers([f"tcp:{s}:{0.0004 + s / 3e9}" for s in sizes])["tcp"]
    assert fitted.bytes_per_s == pytest.approx(3e9, rel=1e-6)
    with pytest.raises(ValueError, match="NAME:BYTES:SECONDS"):
        parse_transfers(["tcp:12"])
    sw = fit_swap([SwapSample(n, 0.001 + n * 1e-4, 0.001 + n * 1e-4) for n in (1, 16, 256)])
    assert sw.per_block_s == pytest.approx(1e-4, rel=1e-6) and sw.seconds(0) == 0.0


def test_profile_round_trip_refit_and_typos(tmp_path: Path) -> None:
    p = make_profile()
    p = Profile(**{**p.__dict__, "step_samples": tuple(samples(1, 0.02))})
    path = tmp_path / "p.json"
    save_profile(p, path)
    back = load_profile(path)
    assert back.step == p.step and back.kv == p.kv and back.step_samples == p.step_samples
    r = refit(back, ["base_s", "per_token_s"], 0)
    assert r.step.per_seq_s == 0.0 and r.step.base_s > 0
    data = json.loads(path.read_text())
    data["step"]["per_tokn_s"] = 1.0
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="per_tokn_s"):
        load_profile(path)
    with pytest.raises(ValueError, match="shipped"):
        load_profile("no-such-profile")


def test_metrics_histograms_give_the_mean_step() -> None:
    text = "\n".join(
        [
            "# TYPE pdserve_engine_step_seconds histogram",
            'pdserve_engine_step_seconds_bucket{model="m",le="+Inf"} 100',
            'pdserve_engine_step_seconds_sum{model="m"} 12.5',
            'pdserve_engine_step_seconds_count{model="m"} 100',
            'pdserve_engine_step_tokens_sum{model="m"} 3200',
            'pdserve_engine_step_tokens_count{model="m"} 100',
            'pdserve_engine_step_requests_sum{model="m"} 800',
            'pdserve_engine_step_requests_count{model="m"} 100',
        ]
    )
    w = parse_step_metrics(text, "u")
    got, want = step_factor(TRUE, w, 100.0)
    assert got == pytest.approx(0.125)
    assert want == pytest.approx(TRUE.seconds(StepShape(32, 8, 8, 800, 0.0)))
    with pytest.raises(ValueError, match="not an engine"):
        parse_step_metrics("up 1\n", "u")
