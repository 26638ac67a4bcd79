"""Where pdserve's offline step time goes: torch-profiler op breakdown over the benchmark workload.

    python benchmarks/profile_pdserve.py --num-requests 32 [--trace /tmp/pdserve_trace.json]

Runs the offline-throughput workload (same seed and model folder) through pdserve's ``LLM``
once unprofiled (wall time) and once under ``torch.profiler``, then prints the top ops by self
CPU time and a grouping: GEMMs, attention, sampling/logits, KV writes and copies, other tensor
ops, and the rest of the wall time (Python: scheduler, block manager, input preparation,
detokenization; plus the profiler's own per-op cost). Self time counts on the calling thread
only, so the groups plus "outside ops" add up to the profiled wall time.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.offline_throughput import DEFAULT_MODEL_DIR
from benchmarks.workloads import (
    ensure_model_folder,
    make_workload,
    model_shape,
    workload_flops,
)

GROUPS: list[tuple[str, tuple[str, ...]]] = [
    ("gemm (mm/addmm/bmm/linear)", ("aten::mm", "aten::addmm", "aten::bmm", "aten::linear")),
    (
        "attention (sdpa, paged/varlen kernels)",
        ("attention", "sdpa", "baddbmm", "flash", "paged", "varlen"),
    ),
    ("sampling / logits", ("argmax", "topk", "sort", "multinomial", "log_softmax", "softmax")),
    (
        "kv writes, gathers, copies",
        ("index_put", "index_copy", "scatter", "index_select", "gather", "copy_", "cat", "to"),
    ),
    ("norm / rope / activation", ("rsqrt", "pow", "mean", "silu", "mul", "add", "neg", "cos")),
]


def group_of(name: str) -> str:
    lowered = name.lower()
    for group, keys in GROUPS:
        if any(k in lowered for k in keys):
            return group
    return "other tensor ops"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-requests", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_MODEL_DIR)
    parser.add_argument("--max-num-seqs", type=int, default=None, help="default: pdserve's")
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=None, help="default: pdserve's"
    )
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--trace", help="also write a Chrome trace here")
    args = parser.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from pdserve import LLM, SamplingParams

    shape = model_shape()
    model_dir = ensure_model_folder(args.model_dir)
    requests = make_workload(args.num_requests, (32, 512), (16, 256), shape.vocab_size, args.seed)
    warmup = make_workload(2, (32, 64), (4, 8), shape.vocab_size, args.seed + 1_000_003)
    options = {
        k: v
        for k, v in (
            ("max_num_seqs", args.max_num_seqs),
            ("max_num_batched_tokens", args.max_num_batched_tokens),
        )
        if v is not None
    }
    llm = LLM(model=str(model_dir), dtype="float32", **options)

    def run(reqs: list[Any]) -> int:
        prompts = [{"prompt_token_ids": r.prompt_token_ids} for r in reqs]
        params = [
            SamplingParams(temperature=0.0, max_tokens=r.max_tokens, ignore_eos=True) for r in reqs
        ]
        return sum(len(o.token_ids) for o in llm.generate(prompts, params))

    run(warmup)
    t0 = time.perf_counter()
    num_output = run(requests)
    plain_s = time.perf_counter() - t0
    flops = workload_flops(requests, shape)["total"]
    print(
        f"unprofiled: {plain_s:.1f} s, {num_output / plain_s:.1f} output tok/s, "
        f"{flops / plain_s / 1e9:.1f} GFLOP/s of useful matmul work"
    )

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        run(requests)
        profiled_s = time.perf_counter() - t0
    if args.trace:
        prof.export_chrome_trace(args.trace)

    events = prof.key_averages()
    rows = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    print(f"\nprofiled: {profiled_s:.1f} s wall; top {args.top} ops by self CPU time")
    print(f"{'op':<52} {'calls':>8} {'self s':>8} {'share':>7}")
    for e in rows[: args.top]:
        self_s = e.self_cpu_time_total / 1e6
        print(f"{e.key[:52]:<52} {e.count:>8} {self_s:>8.2f} {self_s / profiled_s:>7.1%}")

    grouped: dict[str, float] = defaultdict(float)
    for e in events:
        grouped[group_of(e.key)] += e.self_cpu_time_total / 1e6
    in_ops = sum(grouped.values())
    print("\nwhere the profiled wall time goes")
    for group, seconds in sorted(grouped.items(), key=lambda kv: -kv[1]):
        print(f"  {group:<40} {seconds:>7.2f} s {seconds / profiled_s:>7.1%}")
    outside = profiled_s - in_ops
    label = "outside ops (Python, profiler cost)"
    print(f"  {label:<40} {outside:>7.2f} s {outside / profiled_s:>7.1%}")
    print(f"torch threads: {torch.get_num_threads()}")


if __name__ == "__main__":
    main()
