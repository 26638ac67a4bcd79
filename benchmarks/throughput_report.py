"""Offline-throughput results: output agreement between engines, the per-engine summary
(tokens/s, speed-up, roofline fraction) and the printed report."""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any


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
    results: dict[str, dict[str, Any]], flops: dict[str, float], gemm_gflops: float
) -> dict[str, Any]:
    roofline_s = flops["total"] / (gemm_gflops * 1e9)
    summary: dict[str, Any] = {"roofline_s": roofline_s}
    for engine, r in results.items():
        walls = [p["wall_s"] for p in r["passes"]]
        num_output = r["passes"][0]["num_output_tokens"]
        wall = statistics.median(walls)
        summary[engine] = {
            "median_wall_s": wall,
            "min_wall_s": min(walls),
            "max_wall_s": max(walls),
            "output_tok_per_s": num_output / wall,
            "roofline_fraction": roofline_s / wall,
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
    gemm_gflops: float,
    results: dict[str, dict[str, Any]],
    summary: dict[str, Any],
    agreement: dict[str, dict[str, Any]],
) -> None:
    print()
    print(
        f"workload: {args.num_requests} requests, seed {args.seed}, prompt {args.prompt_len[0]}-"
        f"{args.prompt_len[1]}, output {args.output_len[0]}-{args.output_len[1]} tokens; "
        f"{totals['prompt']} prompt + {totals['output']} output tokens; greedy, ignore EOS, fp32"
    )
    policy = os.environ.get("OMP_WAIT_POLICY", "unset")
    print(f"OMP_WAIT_POLICY: {args.omp_wait_policy or policy}")
    print(
        f"matmul work: {flops['total'] / 1e12:.3f} TFLOP (linear {flops['linear'] / 1e12:.3f}, "
        f"lm_head {flops['lm_head'] / 1e12:.3f}, attention {flops['attention'] / 1e12:.3f})"
    )
    for g in gemm:
        rates = ", ".join(
            f"M={m}: {v['layer_gflops']:.0f} ({v['layer_gflops_median']:.0f})"
            for m, v in g["by_m"].items()
        )
        print(
            f"fp32 GEMM at layer shapes ({g['tag']} of run, {g['num_threads']} threads), "
            f"GFLOP/s fastest call (median call): {rates}"
        )
    print(
        f"roofline: {gemm_gflops:.0f} GFLOP/s (best measured) -> {summary['roofline_s']:.1f} s, "
        f"{totals['output'] / summary['roofline_s']:.1f} output tok/s"
    )
    print()
    header = (
        f"{'engine':<10} {'load s':>7} {'wall s (median; min-max)':>26} {'out tok/s':>10} "
        f"{'pdserve x':>9} {'roofline':>9} {'others':>9} {'= pdserve':>10}"
    )
    print(header)
    print("-" * len(header))
    for engine, r in results.items():
        s = summary[engine]
        span = f"{s['median_wall_s']:.1f}; {s['min_wall_s']:.1f}-{s['max_wall_s']:.1f}"
        speedup = f"{s['pdserve_speedup']:.2f}" if "pdserve_speedup" in s else "-"
        match = agreement.get(engine)
        match_s = f"{match['num_exact']}/{match['num_requests']}" if match else "-"
        print(
            f"{engine:<10} {r['load_s']:>7.1f} {span:>26} {s['output_tok_per_s']:>10.1f} "
            f"{speedup:>9} {s['roofline_fraction']:>8.1%} "
            f"{s['median_others_cpu_share']:>8.0%} {match_s:>10}"
        )
    print()
    print("pdserve x: pdserve's output tok/s divided by the engine's (>1: pdserve is faster).")
    print(
        "roofline: roofline time / engine wall time. others: share of both cores other jobs used "
        "during the passes (median)."
    )
    for engine, m in agreement.items():
        if m["first_diff_positions"]:
            print(
                f"{engine} vs pdserve: {m['num_requests'] - m['num_exact']} requests diverge, "
                f"first differing output positions {sorted(m['first_diff_positions'])}; "
                f"{m['token_prefix_agreement']:.1%} of output tokens precede a divergence"
            )
