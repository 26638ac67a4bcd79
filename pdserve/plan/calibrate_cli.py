"""``pdserve plan calibrate {engine,refit,metrics}``: profiles from measurement."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from pdserve.plan.cost_model import COEFFICIENTS


def add_calibrate_parser(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="fit a profile from measurement (docs/planning.md)")
    csub = p.add_subparsers(dest="calibrate_command", required=True)

    e = csub.add_parser(
        "engine",
        help="time real engine steps over a grid in this process and fit a profile",
    )
    e.add_argument("--model", required=True, help="Hugging Face model folder")
    e.add_argument("--out", type=Path, required=True, help="profile file to write")
    e.add_argument("--name", required=True, help="the profile's name")
    e.add_argument("--device", default="cpu")
    e.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    e.add_argument("--cpus", default="", help="pin to these CPUs, e.g. 0 (like taskset)")
    e.add_argument("--quick", action="store_true", help="a small grid (smoke runs)")
    e.add_argument("--max-decode-tokens", type=int, default=None, help="cap on B x L")
    e.add_argument("--repeats", type=int, default=None)
    _add_common(e)

    r = csub.add_parser("refit", help="re-fit a profile's own samples")
    r.add_argument("profile", type=Path)
    r.add_argument("--out", type=Path, required=True)
    _add_fit_args(r)

    m = csub.add_parser(
        "metrics",
        help="compare a profile with running engines' /metrics step histograms (and rescale)",
    )
    m.add_argument("profile")
    m.add_argument("--url", action="append", required=True, help="a worker's /metrics URL")
    m.add_argument(
        "--mean-context",
        type=float,
        default=256.0,
        help="mean KV tokens a request of a step reads (the workload's)",
    )
    m.add_argument(
        "--rescale",
        type=Path,
        default=None,
        help="write the profile with its step model scaled by the measured factor",
    )


def _add_fit_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--use",
        default=",".join(COEFFICIENTS),
        help="the step coefficients the fit may use (others stay 0)",
    )
    p.add_argument("--roofline-tokens", type=int, default=0)


def _add_common(p: argparse.ArgumentParser) -> None:
    _add_fit_args(p)
    p.add_argument(
        "--transfer",
        action="append",
        default=[],
        metavar="NAME:BYTES:SECONDS",
        help="a measured KV transfer (repeat; fitted per transport)",
    )
    p.add_argument(
        "--overhead",
        action="append",
        default=[],
        metavar="KEY=SECONDS",
        help="dispatch_s, admit_s or stream_s",
    )
    p.add_argument("--num-kv-blocks", type=int, default=4096)
    p.add_argument("--num-host-blocks", type=int, default=0)
    p.add_argument("--description", default="")


def run_calibrate(a: argparse.Namespace) -> int:
    try:
        if a.calibrate_command == "engine":
            return _engine(a)
        if a.calibrate_command == "refit":
            return _refit(a)
        return _metrics(a)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _engine(a: argparse.Namespace) -> int:
    from dataclasses import replace

    from pdserve.plan.calibrate import (
        machine_info,
        parse_overhead,
        parse_transfers,
        profile_from_samples,
        today,
    )
    from pdserve.plan.calibrate_engine import EngineGrid, build_engine, measure_engine
    from pdserve.plan.profile_format import Device, KvCapacity, ModelInfo, save_profile

    grid = EngineGrid.quick() if a.quick else EngineGrid()
    if a.max_decode_tokens:
        grid = replace(grid, max_decode_tokens=a.max_decode_tokens)
    if a.repeats:
        grid = replace(grid, repeats=a.repeats)
    cpus = {int(x) for x in a.cpus.split(",") if x.strip()} or None
    engine = build_engine(a.model, a.threads, cpus, grid, device=a.device)
    m = measure_engine(engine, grid, log=lambda s: print(s, file=sys.stderr, flush=True))
    spec = engine.kv_spec
    model = ModelInfo(Path(a.model).name, spec.block_size, spec.bytes_per_block // spec.block_size)
    kind = "cpu" if a.device == "cpu" else "gpu"
    info = machine_info()
    profile = profile_from_samples(
        a.name,
        m.steps,
        m.swaps,
        model,
        KvCapacity(a.num_kv_blocks, a.num_host_blocks),
        Device(kind, a.threads if kind == "cpu" else 0, info["cpu"] if kind == "cpu" else a.device),
        parse_transfers(a.transfer),
        parse_overhead(a.overhead),
        {
            "command": "pdserve plan calibrate engine " + " ".join(sys.argv[4:]),
            "date": today(),
            "machine": info,
        },
        [c for c in a.use.split(",") if c],
        a.roofline_tokens,
        a.description,
    )
    save_profile(profile, a.out)
    print(json.dumps(profile.step.to_json(), indent=1))
    return 0


def _refit(a: argparse.Namespace) -> int:
    from pdserve.plan.calibrate import refit
    from pdserve.plan.profile_format import load_profile, save_profile

    p = refit(load_profile(a.profile), [c for c in a.use.split(",") if c], a.roofline_tokens)
    save_profile(p, a.out)
    print(json.dumps(p.step.to_json(), indent=1))
    return 0


def _metrics(a: argparse.Namespace) -> int:
    from dataclasses import fields, replace

    from pdserve.plan.calibrate import fetch_metrics, parse_step_metrics, step_factor
    from pdserve.plan.cost_model import StepCost
    from pdserve.plan.profile_format import load_profile, save_profile

    profile = load_profile(a.profile)
    measured = predicted = 0.0
    for url in a.url:
        w = parse_step_metrics(fetch_metrics(url), url)
        got, want = step_factor(profile.step, w, a.mean_context)
        print(
            f"{url}: {w.num_steps:.0f} steps, mean {got * 1000:.2f} ms, profile predicts "
            f"{want * 1000:.2f} ms at the mean shape (x{got / want:.3f})"
        )
        measured += got * w.num_steps
        predicted += want * w.num_steps
    factor = measured / predicted
    print(f"factor (step-weighted): {factor:.3f}")
    if a.rescale:
        names = [f.name for f in fields(StepCost) if f.name.endswith("_s")]
        scaled = replace(profile.step, **{n: getattr(profile.step, n) * factor for n in names})
        save_profile(
            replace(profile, step=replace(scaled, fit={**profile.step.fit, "rescaled_by": factor})),
            a.rescale,
        )
    return 0
