"""Offline-throughput results: output agreement between engines, the per-engine summary
(tokens/s, speed-up, roofline fraction) and the printed report."""

from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import asdict
from typing import Any

from benchmarks.floor import Floor


def compare_outputs(a: list[list[int]], b: list[list[int]]) -> dict[str, Any]:
    """Exact-match count, and for each mismatch the index of the first differing token."""
    first_diffs = []
    agreed = 0
    for x, y in zip(a, b, strict=True):
        same = next((i for i, (u, v) in enumerate(zip(x, y, strict=False)) if u != v), None)
        if same is None and len(x) == len(y):
            agreed += len(x)
        else:
            first = min(len(x), len(y)) if same is None else same
            first_diffs.append(first)
            agreed += first
    total = sum(len(x) for x in a)
    return {
        "num_requests": len(a),
        "num_exact": len(a) - len(first_diffs),
        "first_diff_positions": first_diffs,
        # Share of output tokens before each request's first divergence.
        "token_prefix_agreement": agreed / total if total else 1.0,
    }


def summarize(
    results: dict[str, dict[str, Any]],
    flops: dict[str, float],
    gemm_gflops: float | None,
    floor: Floor | None = None,
) -> dict[str, Any]:
    """Per engine: median wall, output tok/s, and (when measured) the fractions of the compute
    roofline and of the physical floor it reaches."""
    roofline_s = flops["total"] / (gemm_gflops * 1e9) if gemm_gflops else None
    floor_s = floor.total_s if floor is not None else None
    summary: dict[str, Any] = {"roofline_s": roofline_s, "floor_s": floor_s}
    for engine, r in results.items():
        walls = [p["wall_s"] for p in r["passes"]]
        num_output = r["passes"][0]["num_output_tokens"]
        wall = statistics.median(walls)
        summary[engine] = {
            "median_wall_s": wall,
            "min_wall_s": min(walls),
            "max_wall_s": max(walls),
            "output_tok_per_s": num_output / wall,
            "roofline_fraction": roofline_s / wall if roofline_s else None,
            "floor_fraction": floor_s / wall if floor_s else None,
            "median_others_cpu_share": statistics.median(
                p["others_cpu_share"] for p in r["passes"]
            ),
        }
    if "pdserve" in results:
        base = summary["pdserve"]["output_tok_per_s"]
        for engine in results:
            summary[engine]["pdserve_speedup"] = base / summary[engine]["output_tok_per_s"]
    return summary


def print_report(
    args: argparse.Namespace,
    totals: dict[str, int],
    flops: dict[str, float],
    gemm: list[dict[str, Any]],
    gemm_gflops: float | None,
    floor: Floor | None,
    results: dict[str, dict[str, Any]],
    summary: dict[str, Any],
    agreement: dict[str, dict[str, Any]],
) -> None:
    print()
    print(
        f"workload: {args.num_requests} requests, seed {args.seed}, prompt {args.prompt_len[0]}-"
        f"{args.prompt_len[1]}, output {args.output_len[0]}-{args.output_len[1]} tokens; "
        f"{totals['prompt']} prompt + {totals['output']} output tokens; greedy, ignore EOS, "
        f"pdserve in {args.pdserve_dtype}"
    )
    policy = os.environ.get("OMP_WAIT_POLICY", "unset")
    print(f"OMP_WAIT_POLICY: {args.omp_wait_policy or policy}")
    print(
        f"matmul work: {flops['total'] / 1e12:.3f} TFLOP (linear {flops['linear'] / 1e12:.3f}, "
        f"lm_head {flops['lm_head'] / 1e12:.3f}, attention {flops['attention'] / 1e12:.3f})"
    )
    for g in gemm:
        if "device" in g:  # gpu_roofline.py: medians by CUDA events
            rates = ", ".join(f"M={m}: {v['layer_gflops']:.0f}" for m, v in g["by_m"].items())
            print(
                f"{g['dtype']} GEMM at layer shapes on {g['device']} ({g['tag']} of run), "
                f"GFLOP/s median call: {rates}; HBM read {g['read_gbps']:.0f} GB/s"
            )
            continue
        rates = ", ".join(
            f"M={m}: {v['layer_gflops']:.0f} ({v['layer_gflops_median']:.0f})"
            + (f" / packed {v['packed_layer_gflops']:.0f}" if "packed_layer_gflops" in v else "")
            for m, v in g["by_m"].items()
        )
        print(
            f"fp32 GEMM at layer shapes ({g['tag']} of run, {g['num_threads']} threads), "
            f"GFLOP/s fastest call (median call) of F.linear / pdserve's packed GEMM: {rates}"
            + (f"; FMA peak {g['fma_gflops']:.0f}" if g.get("fma_gflops") else "")
        )
    if gemm_gflops is not None:
        print(
            f"roofline: {gemm_gflops:.0f} GFLOP/s (best of either) -> "
            f"{summary['roofline_s']:.1f} s, {totals['output'] / summary['roofline_s']:.1f} "
            "output tok/s"
        )
    if floor is not None:
        print(
            f"physical floor: {floor.total_s:.1f} s ({totals['output'] / floor.total_s:.1f} "
            f"output tok/s) = prefill {floor.prefill_s:.1f} s at {floor.gemm_gflops:.0f} GFLOP/s"
            f" + {floor.decode_steps} decode steps {floor.decode_s:.1f} s at "
            f"{floor.read_gbps:.1f} GB/s read (weights at {floor.weight_bytes_per_element} bytes "
            f"{floor.decode_weights_s:.1f} s, KV "
            f"{floor.decode_kv_s:.1f} s, compute past the bytes {floor.decode_compute_extra_s:.1f}"
            " s)"
        )
    print()
    header = (
        f"{'engine':<17} {'load s':>7} {'wall s (median; min-max)':>26} {'out tok/s':>10} "
        f"{'pdserve x':>9} {'roofline':>9} {'floor':>7} {'others':>7} {'= pdserve':>10}"
    )
    print(header)
    print("-" * len(header))
    for engine, r in results.items():
        s = summary[engine]
        span = f"{s['median_wall_s']:.1f}; {s['min_wall_s']:.1f}-{s['max_wall_s']:.1f}"
        speedup = f"{s['pdserve_speedup']:.2f}" if "pdserve_speedup" in s else "-"
        match = agreement.get(engine)
        match_s = f"{match['num_exact']}/{match['num_requests']}" if match else "-"
        roof = f"{s['roofline_fraction']:.1%}" if s["roofline_fraction"] else "-"
        fl = f"{s['floor_fraction']:.1%}" if s["floor_fraction"] else "-"
        print(
            f"{engine:<17} {r['load_s']:>7.1f} {span:>26} {s['output_tok_per_s']:>10.1f} "
            f"{speedup:>9} {roof:>9} {fl:>7} {s['median_others_cpu_share']:>7.0%} {match_s:>10}"
        )
    print()
    print("pdserve x: pdserve's output tok/s divided by the engine's (>1: pdserve is faster).")
    print(
        "roofline / floor: roofline time / physical floor over the engine's wall time. others: "
        "share of all cores other jobs used during the passes (median)."
    )
    for engine, m in agreement.items():
        if m["first_diff_positions"]:
            print(
                f"{engine} vs pdserve: {m['num_requests'] - m['num_exact']} requests diverge, "
                f"first differing output positions {sorted(m['first_diff_positions'])}; "
                f"{m['token_prefix_agreement']:.1%} of output tokens precede a divergence"
            )


def print_screened_floor(
    screened: Floor | None, summary: dict[str, Any], results: dict[str, Any]
) -> None:
    """The floor with the lm_head priced as pdserve's greedy head reads it, and pdserve's
    fraction of it (the table's floor column stays the float32 engine's). Only where the head
    ran (an AVX2 or AVX-512 build, the head not turned off)."""
    if screened is None or "pdserve" not in summary:
        return
    kind = results["pdserve"].get("settings", {}).get("greedy_head", "")
    if not kind:
        print("floor with the greedy head: not priced (pdserve ran without it here)")
        return
    wall = summary["pdserve"]["median_wall_s"]
    print(
        f"floor with the lm_head as pdserve's greedy head reads it ({kind} screen, 2 bytes a "
        f"weight, products at twice the fp32 rate): {screened.total_s:.1f} s; pdserve "
        f"{screened.total_s / wall:.1%} of it (the fp32 floor above: the table's column)"
    )


def floor_json(floor: Floor | None) -> dict[str, Any] | None:
    return None if floor is None else {**asdict(floor), "total_s": floor.total_s}
