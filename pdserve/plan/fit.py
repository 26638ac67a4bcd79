"""Fitting cost models to measurements: numbers in, coefficients out (numpy, no torch).

Step time: non-negative least squares of ``StepCost``'s linear model over the measured steps,
in relative error (each row divided by its measured time: a 5 ms decode step and a 2 s
prefill count alike). The non-negative optimum is the best unconstrained least-squares fit
over some subset of the regressors whose coefficients all come out >= 0; with six
regressors we try every subset (64 small solves) and keep the best, which is exact and
needs no solver library.

Transfer and swap: ``latency + size x per_unit`` by the same method on (size, seconds).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from pdserve.plan.cost_model import COEFFICIENTS, StepCost, SwapCost, TransferCost
from pdserve.plan.profile_format import StepSample, SwapSample


@dataclass(frozen=True)
class FitReport:
    """How well a fit explains its points: relative errors |predicted/measured - 1|."""

    num_points: int
    median_rel_error: float
    max_rel_error: float
    worst_label: str


def nonneg_lstsq(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """argmin ||a x - b|| subject to x >= 0, for a few columns (every subset tried)."""
    n = a.shape[1]
    best: tuple[float, np.ndarray] = (math.inf, np.zeros(n))
    for k in range(n + 1):
        for cols in itertools.combinations(range(n), k):
            x = np.zeros(n)
            if cols:
                sub, *_ = np.linalg.lstsq(a[:, cols], b, rcond=None)
                if (sub < 0).any():
                    continue
                x[list(cols)] = sub
            r = float(np.sum((a @ x - b) ** 2))
            if r < best[0] - 1e-18:
                best = (r, x)
    return best[1]


def fit_step_cost(
    samples: Sequence[StepSample],
    roofline_tokens: int = 0,
    use: Sequence[str] = COEFFICIENTS,
) -> tuple[StepCost, FitReport]:
    """The step model that best explains ``samples`` (``use``: the coefficients allowed to be
    non-zero; the others stay 0)."""
    if not samples:
        raise ValueError("no step samples to fit")
    unknown = sorted(set(use) - set(COEFFICIENTS))
    if unknown:
        raise ValueError(f"unknown coefficient(s) {', '.join(unknown)}")
    probe = StepCost(roofline_tokens=roofline_tokens)
    cols = [COEFFICIENTS.index(c) for c in use]
    rows = np.array([probe.features(s.shape) for s in samples], dtype=np.float64)[:, cols]
    y = np.array([s.seconds for s in samples], dtype=np.float64)
    if (y <= 0).any():
        raise ValueError("step samples must have positive times")
    # Scale columns to O(1) so the solver's rank decisions are fair, then undo it.
    scale = np.maximum(np.abs(rows).max(axis=0), 1e-30)
    x = nonneg_lstsq(rows / scale / y[:, None], np.ones_like(y)) / scale
    coef: dict[str, Any] = dict.fromkeys(COEFFICIENTS, 0.0)
    for name, v in zip(use, x, strict=True):
        coef[name] = float(v)
    fitted = StepCost(roofline_tokens=roofline_tokens, **coef)
    report = step_fit_report(fitted, samples)
    fit = {
        "method": "non-negative least squares, relative error",
        "num_points": report.num_points,
        "median_rel_error": round(report.median_rel_error, 4),
        "max_rel_error": round(report.max_rel_error, 4),
        "worst": report.worst_label,
    }
    return replace(fitted, fit=fit), report


def step_fit_report(cost: StepCost, samples: Sequence[StepSample]) -> FitReport:
    errors = [abs(cost.seconds(s.shape) / s.seconds - 1.0) for s in samples]
    worst = int(np.argmax(errors))
    return FitReport(
        len(samples), float(np.median(errors)), float(errors[worst]), samples[worst].label
    )


def _fit_line(sizes: Sequence[float], seconds: Sequence[float]) -> tuple[float, float]:
    """(intercept, slope) >= 0 of seconds over size, relative error."""
    if len(sizes) != len(seconds) or not sizes:
        raise ValueError("need matching, non-empty sizes and times")
    y = np.asarray(seconds, dtype=np.float64)
    if (y <= 0).any():
        raise ValueError("times must be positive")
    x = np.asarray(sizes, dtype=np.float64)
    scale = max(float(x.max()), 1e-30)
    a = np.stack([np.ones_like(x), x / scale], axis=1) / y[:, None]
    c = nonneg_lstsq(a, np.ones_like(y))
    return float(c[0]), float(c[1] / scale)


def fit_transfer(num_bytes: Sequence[float], seconds: Sequence[float]) -> TransferCost:
    latency, per_byte = _fit_line(num_bytes, seconds)
    return TransferCost(latency_s=latency, bytes_per_s=0.0 if per_byte <= 0 else 1.0 / per_byte)


def fit_swap(samples: Sequence[SwapSample]) -> SwapCost:
    """One model for both directions (the simulator charges a swap by its blocks)."""
    sizes = [float(s.num_blocks) for s in samples for _ in (0, 1)]
    times = [t for s in samples for t in (s.out_s, s.in_s)]
    latency, per_block = _fit_line(sizes, times)
    return SwapCost(latency_s=latency, per_block_s=per_block)
