"""Making a profile from measurement: ``pdserve plan calibrate``.

    engine    time real engine steps over a grid (``calibrate_engine``, imports torch), fit the
              step model and the swap model, save the profile with its raw samples
    refit     re-fit a profile's own samples (other coefficients, a roofline) without
              measuring again
    metrics   check (and rescale) a profile against a running system: the engines'
              /metrics step histograms give each worker's mean step time and mean step
              shape; the profile's prediction at that shape against the measured mean is the
              system's factor (contention, threads, a slower host), applied with --rescale

Transfer and overhead entries come from ``--transfer NAME:BYTES:SECONDS`` points (e.g.
``python benchmarks/kv_transfer.py``'s table) and ``--overhead key=seconds``.
"""

from __future__ import annotations

import datetime
import platform
import re
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from pdserve.plan.cost_model import COEFFICIENTS, StepCost, SwapCost, TransferCost
from pdserve.plan.fit import fit_step_cost, fit_swap, fit_transfer, step_fit_report
from pdserve.plan.profile_format import (
    Device,
    KvCapacity,
    ModelInfo,
    Overhead,
    Profile,
    StepSample,
    SwapSample,
)
from pdserve.plan.step_shape import StepShape


def parse_transfers(points: Sequence[str]) -> dict[str, TransferCost]:
    """``NAME:BYTES:SECONDS`` points, fitted per transport name."""
    by: dict[str, tuple[list[float], list[float]]] = {}
    for p in points:
        parts = p.split(":")
        if len(parts) != 3:
            raise ValueError(f"--transfer {p!r}: want NAME:BYTES:SECONDS")
        name, size, secs = parts[0], float(parts[1]), float(parts[2])
        by.setdefault(name, ([], []))
        by[name][0].append(size)
        by[name][1].append(secs)
    return {k: fit_transfer(s, t) for k, (s, t) in by.items()}


def parse_overhead(items: Sequence[str]) -> Overhead:
    values: dict[str, float] = {}
    for item in items:
        key, _, v = item.partition("=")
        if key not in ("dispatch_s", "admit_s", "stream_s") or not v:
            raise ValueError(f"--overhead {item!r}: want dispatch_s|admit_s|stream_s=SECONDS")
        values[key] = float(v)
    return Overhead(**values)


def profile_from_samples(
    name: str,
    steps: Sequence[StepSample],
    swaps: Sequence[SwapSample],
    model: ModelInfo,
    kv: KvCapacity,
    device: Device,
    transfer: dict[str, TransferCost],
    overhead: Overhead,
    measured: dict[str, Any],
    use: Sequence[str] = COEFFICIENTS,
    roofline_tokens: int = 0,
    description: str = "",
) -> Profile:
    step, _ = fit_step_cost(steps, roofline_tokens, use)
    swap = fit_swap(swaps) if swaps else SwapCost()
    return Profile(
        name=name,
        description=description,
        step=step,
        transfer=transfer,
        swap=swap,
        device=device,
        model=model,
        kv=kv,
        overhead=overhead,
        measured=measured,
        step_samples=tuple(steps),
        swap_samples=tuple(swaps),
    )


def refit(profile: Profile, use: Sequence[str], roofline_tokens: int) -> Profile:
    if not profile.step_samples:
        raise ValueError(f"profile {profile.name!r} has no samples to re-fit")
    step, _ = fit_step_cost(profile.step_samples, roofline_tokens, use)
    swap = fit_swap(profile.swap_samples) if profile.swap_samples else profile.swap
    return replace(profile, step=step, swap=swap)


def machine_info() -> dict[str, Any]:
    import os

    cpu = ""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return {
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "host": platform.node(),
    }


def today() -> str:
    return datetime.date.today().isoformat()


# ------------------------------------------------------------------ /metrics check
@dataclass(frozen=True)
class WorkerSteps:
    """One worker's step histograms' sums and counts, from its /metrics."""

    url: str
    num_steps: float
    step_seconds_sum: float
    step_tokens_sum: float
    step_requests_sum: float


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+([-+0-9.eEinfNa]+)")


def parse_step_metrics(text: str, url: str = "") -> WorkerSteps:
    """Sums and counts of the engine's step histograms (``*_step_seconds``,
    ``*_step_tokens``, ``*_step_requests``) in Prometheus text."""
    values: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        name = m.group(1)
        for kind in ("step_seconds", "step_tokens", "step_requests"):
            for suffix in ("_sum", "_count"):
                if name.endswith(kind + suffix):
                    key = kind + suffix
                    values[key] = values.get(key, 0.0) + float(m.group(3))
    need = ("step_seconds_count", "step_seconds_sum", "step_tokens_sum", "step_requests_sum")
    missing = [k for k in need if k not in values]
    if missing:
        raise ValueError(f"{url or 'metrics'}: no {', '.join(missing)} (not an engine's /metrics?)")
    return WorkerSteps(
        url,
        values["step_seconds_count"],
        values["step_seconds_sum"],
        values["step_tokens_sum"],
        values["step_requests_sum"],
    )


def fetch_metrics(url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as r:
        body: bytes = r.read()
    return body.decode("utf-8")


def step_factor(cost: StepCost, w: WorkerSteps, mean_context: float) -> tuple[float, float]:
    """(measured mean step, predicted mean step) for a worker: the prediction is the model at
    the mean step's shape (exact for the linear terms; ``mean_context``: the KV each request
    of a step reads, the one thing the histograms do not carry)."""
    if w.num_steps <= 0:
        raise ValueError(f"{w.url}: no steps yet")
    tokens = w.step_tokens_sum / w.num_steps
    seqs = w.step_requests_sum / w.num_steps
    shape = StepShape(round(tokens), round(seqs), round(seqs), round(seqs * mean_context), 0.0)
    return w.step_seconds_sum / w.num_steps, cost.seconds(shape)


__all__ = [
    "WorkerSteps",
    "fetch_metrics",
    "machine_info",
    "parse_overhead",
    "parse_step_metrics",
    "parse_transfers",
    "profile_from_samples",
    "refit",
    "step_factor",
    "step_fit_report",
]
