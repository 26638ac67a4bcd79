"""The simulator against the real system: 1P1D, 1P2D, 2P1D and colocated on loopback with the
SmolLM2-135M-shape model, each run for real (``pdserve bench`` against processes this script
starts on free ports and stops after) and simulated (``pdserve plan`` with a profile), then an
error table: TTFT p50/p99, TPOT p50, output throughput, |sim - real| / real (target 15%).

    python benchmarks/simulator_validation.py --profile cpu-1core-135m --out /tmp/val

Calibration first, on other requests than the validation's (so the calibrated column is a
prediction, not a fit to the runs it is compared with): a colocated and a 1P1D deployment
each serve a one-token probe (8 short prompts, one at a time) and then a load of the
validation's shape with another seed. Their workers' ``/metrics`` step histograms give each
pool's step factor (real mean step / the profile's, ``pdserve plan calibrate metrics``: a
worker's step carries its gRPC server, event loop and KV traffic besides the engine's step
the profile timed); the probe's TTFT p50 beyond the rescaled simulation's gives the request
path's fixed cost (router, gRPC hops, reservation, the first token's way back) as
``overhead.dispatch_s``. The disaggregated shapes use the 1P1D calibration, the colocated
one its own; workers that share a core are shared by the simulation, not by the factor.

Placement: this machine has 2 cores; workers are pinned (taskset-like) and the simulation is
told which workers share a core (processor sharing):

    1P1D       prefill cpu0 | decode cpu1
    1P2D       prefill cpu0 | decode-0, decode-1 share cpu1
    2P1D       prefill-0 cpu0 | prefill-1, decode share cpu1
    colocated  one engine (in the router process) on cpu0
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from benchmarks.simulator_real_runs import MODEL, SHAPES, read_summary, run_benches, run_real  # noqa: E402
from pdserve.bench.config import load_config  # noqa: E402
from pdserve.plan.sim_config import SimConfig  # noqa: E402
from pdserve.plan.simulate import load_profiles, simulate  # noqa: E402

WORKLOAD = {
    "workload": {
        "num_requests": 16,
        "prompt_len": "uniform:32:192",
        "output_len": "uniform:8:32",
        "seed": 0,
    },
    "load": {"kind": "open", "rates": [0.25], "warmup_requests": 2},
}

# Calibration: the same shape of load, other requests; and a one-token probe.
CAL_WORKLOAD = {**WORKLOAD, "workload": {**WORKLOAD["workload"], "seed": 1}}
PROBE = {
    "workload": {
        "num_requests": 9,
        "prompt_len": "uniform:32:64",
        "output_len": "uniform:1:1",
        "seed": 2,
    },
    "load": {"kind": "closed", "concurrency": [1], "warmup_requests": 1},
}
CALIBRATED_BY = {"1P1D": "1P1D", "1P2D": "1P1D", "2P1D": "1P1D", "colocated": "colocated"}


def pool_factors(name: str, profile: str, out: Path, label: str | None = None) -> dict[str, float]:
    """Per pool: the real workers' mean step time (their /metrics step histograms, scraped
    into ``out/real-LABEL``) over the profile's prediction at their mean step shape
    (``pdserve plan calibrate metrics``)."""
    from pdserve.plan.calibrate import parse_step_metrics, step_factor
    from pdserve.plan.profile_format import load_profile

    path = out / f"real-{label or name}" / "metrics.json"
    if not path.exists():
        return {}
    cost = load_profile(profile).step
    factors = {}
    for role, texts in json.loads(path.read_text(encoding="utf-8")).items():
        got = want = 0.0
        for text in texts:
            w = parse_step_metrics(text, f"{name} {role}")
            g, p = step_factor(cost, w, MEAN_CONTEXT)
            got, want = got + g * w.num_steps, want + p * w.num_steps
        if want > 0:
            factors["colocated" if name == "colocated" else role] = got / want
    return factors


def rescaled_profiles(profile: str, factors: dict[str, float], out: Path) -> dict[str, str]:
    from dataclasses import fields, replace

    from pdserve.plan.cost_model import StepCost
    from pdserve.plan.profile_format import load_profile, save_profile

    base = load_profile(profile)
    paths = {}
    for role, f in factors.items():
        names = [x.name for x in fields(StepCost) if x.name.endswith("_s")]
        step = replace(base.step, **{n: getattr(base.step, n) * f for n in names})
        path = out / f"{base.name}-x{f:.3f}-{role}.json"
        save_profile(replace(base, name=path.stem, step=step), path)
        paths[role] = str(path)
    return paths


def write_config(path: Path, d: dict[str, Any]) -> Path:
    path.write_text(
        "[workload]\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in d["workload"].items())
        + "[load]\n"
        + "".join(f"{k} = {json.dumps(v)}\n" for k, v in d["load"].items()),
        encoding="utf-8",
    )
    load_config(path)
    return path


def calibrate(name: str, profile: str, out: Path, sim_only: bool) -> dict[str, Any]:
    """Calibrate ``profile`` on deployment ``name`` (1P1D or colocated): run the probe and
    the calibration load for real (unless ``sim_only``: their results are in ``out``),
    then return the pool profiles (steps rescaled by the /metrics factors), the cluster
    profile (``overhead.dispatch_s``: the probe's TTFT p50 beyond the rescaled
    simulation's) and what was measured."""
    from dataclasses import replace

    from pdserve.plan.profile_format import Overhead, load_profile, save_profile

    probe, load = f"cal-{name}-probe", f"cal-{name}-load"
    if not sim_only:
        run_benches(
            name,
            [
                (probe, write_config(out / "probe.toml", PROBE)),
                (load, write_config(out / "cal.toml", CAL_WORKLOAD)),
            ],
            out,
        )
    factors = pool_factors(name, profile, out, label=load)
    pools = rescaled_profiles(profile, factors, out)
    trace = out / f"real-{probe}" / "results.json"
    config = sim_config(name, profile, trace, pools, workload=PROBE)
    sim = simulate(config, load_profiles(config)).points[0].summary
    real = read_summary(trace)
    assert real.ttft_ms is not None and sim.ttft_ms is not None, "the probe got no token"
    fixed_s = max(0.0, (real.ttft_ms.p50 - sim.ttft_ms.p50) / 1000)
    base = load_profile(profile)
    cluster = replace(
        base,
        name=f"{base.name}-cal-{name}",
        overhead=Overhead(fixed_s, base.overhead.admit_s, base.overhead.stream_s),
    )
    path = out / f"{cluster.name}.json"
    save_profile(cluster, path)
    return {
        "cluster": str(path),
        "pools": pools,
        "factors": factors,
        "probe_ttft_p50_ms": {"real": real.ttft_ms.p50, "sim": sim.ttft_ms.p50},
        "dispatch_s": fixed_s,
    }


MEAN_CONTEXT = 130.0  # tokens of KV a request of a step reads: the workload's mean context


def sim_config(
    name: str,
    profile: str,
    trace: Path | None,
    pool_profiles: dict[str, str] | None = None,
    workload: dict[str, Any] | None = None,
) -> SimConfig:
    prefill_cpus, decode_cpus, groups = SHAPES[name]
    d: dict[str, Any] = json.loads(json.dumps(workload or WORKLOAD))
    if name == "colocated":
        d["cluster"] = {"mode": "colocated", "num_colocated": 1, "profile": profile}
    else:
        d["cluster"] = {
            "num_prefill": len(prefill_cpus),
            "num_decode": len(decode_cpus),
            "profile": profile,
        }
        d["prefill"] = {"max_num_batched_tokens": 4096}
    d["router"] = {"policy": "least_loaded", "load_view": "polled"}
    d["sim"] = {"records": "full"}
    if groups:
        d["placement"] = {"groups": groups}
    if trace is not None:  # the real run's own send times and lengths
        d["arrivals"] = {"trace": str(trace)}
    for role, path in (pool_profiles or {}).items():
        d.setdefault(role, {})["profile"] = path
    return SimConfig.from_dict(d)


METRICS = (
    ("TTFT p50 ms", lambda s: s.ttft_ms.p50),
    ("TTFT p99 ms", lambda s: s.ttft_ms.p99),
    ("TPOT p50 ms", lambda s: s.tpot_ms.p50),
    ("out tok/s", lambda s: s.output_token_throughput),
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", default="cpu-1core-135m")
    ap.add_argument("--out", type=Path, default=Path("/tmp/simulator_validation"))
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument(
        "--sim-only", action="store_true", help="simulate against the real results already in --out"
    )
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    if not a.sim_only:
        from benchmarks.workloads import ensure_model_folder

        ensure_model_folder(MODEL)  # random weights, SmolLM2-135M's shape, made once
    config_path = write_config(a.out / "bench.toml", WORKLOAD)
    shapes = a.shapes.split(",")
    calibrations = {}
    for name in dict.fromkeys(CALIBRATED_BY[n] for n in shapes):
        t0 = time.monotonic()
        calibrations[name] = cal = calibrate(name, a.profile, a.out, a.sim_only)
        print(
            f"calibration on {name} ({time.monotonic() - t0:.0f} s): step factors "
            f"{cal['factors']}, probe TTFT p50 real {cal['probe_ttft_p50_ms']['real']:.1f} "
            f"ms vs rescaled sim {cal['probe_ttft_p50_ms']['sim']:.1f} ms: dispatch_s "
            f"{cal['dispatch_s']:.4f}",
            file=sys.stderr,
            flush=True,
        )
    rows = []
    for name in shapes:
        t0 = time.monotonic()
        if a.sim_only:
            real = read_summary(a.out / f"real-{name}" / "results.json")
        else:
            real = run_real(name, config_path, a.out)
        wall = time.monotonic() - t0
        trace = a.out / f"real-{name}" / "results.json"
        config = sim_config(name, a.profile, trace)
        sim = simulate(config, load_profiles(config)).points[0].summary
        cal = calibrations[CALIBRATED_BY[name]]
        c2 = sim_config(name, cal["cluster"], trace, cal["pools"])
        calibrated = simulate(c2, load_profiles(c2)).points[0].summary
        errs = []
        for label, get in METRICS:
            r, s, x = get(real), get(sim), get(calibrated)
            errs.append(
                (
                    label,
                    r,
                    s,
                    abs(s - r) / r if r else float("nan"),
                    x,
                    abs(x - r) / r if r else float("nan"),
                )
            )
        rows.append((name, wall, real.num_completed, errs))
        # The run's own factors: a consistency check, not used by the prediction.
        print(
            f"{name}: real run {wall:.0f} s; its own /metrics step factors "
            f"{pool_factors(name, a.profile, a.out)}",
            file=sys.stderr,
            flush=True,
        )
    print(
        f"\nprofile {a.profile}; workload {WORKLOAD}; sim replays each real run's trace; "
        f"calibrated on {CAL_WORKLOAD['workload']} and the probe {PROBE['workload']}\n"
    )
    print("| shape | metric | real | simulated | error | calibrated sim | error |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, _wall, n, errs in rows:
        for label, r, s, e, x, ex in errs:
            flag = "" if e <= 0.15 else " (miss)"
            flag2 = "" if ex <= 0.15 else " (miss)"
            print(
                f"| {name} ({n} req) | {label} | {r:.1f} | {s:.1f} | {100 * e:.0f}%{flag} "
                f"| {x:.1f} | {100 * ex:.0f}%{flag2} |"
            )
    keys = ("metric", "real", "sim", "error", "sim_calibrated", "error_calibrated")
    (a.out / "errors.json").write_text(
        json.dumps(
            {
                "calibrations": calibrations,
                "shapes": [
                    {"shape": n, "errors": [dict(zip(keys, e, strict=True)) for e in errs]}
                    for n, _, _, errs in rows
                ],
            },
            indent=1,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
